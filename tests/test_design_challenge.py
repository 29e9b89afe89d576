"""Lab 07's design challenge: the starting knobs miss a target, a known design meets all
three, and each missed target is reported with what moves it."""

from __future__ import annotations

import pytest

from kvlab.exercises.design_challenge import CRITERIA, check_design, replay_design


def failed(report) -> list[str]:
    return [v.criterion for v in report.verdicts if not v.passed]


def test_the_starting_knobs_stall_running_requests():
    report = check_design()
    assert failed(report) == ["token_gap"]
    assert "raise the watermark" in report.verdicts[1].misconception


def test_a_reserve_and_a_moderate_token_budget_meet_every_target():
    # With vLLM's rounding of the reserve (int(watermark * num_blocks)), 0.2 keeps one block
    # fewer than it did rounded up and misses the token gap; 0.22 meets all three.
    report = check_design(max_num_seqs=32, max_num_batched_tokens=2048, watermark=0.22)
    assert report.passed and report.score == len(CRITERIA), repr(report)


def test_seats_beyond_what_the_blocks_hold_change_nothing():
    # 512 blocks of 16 tokens hold fewer than 32 ShareGPT-like requests (as the lab says).
    assert replay_design(max_num_seqs=32) == replay_design(max_num_seqs=256)


def test_too_few_seats_miss_the_first_token_and_the_throughput():
    assert failed(check_design(max_num_seqs=8, watermark=0.2)) == ["ttft", "throughput"]


def test_a_bad_knob_is_refused_by_name():
    with pytest.raises(ValueError, match="watermark"):
        check_design(watermark=1.5)
