"""Exercise checks: right answers pass, known mistakes get their own hint, others a general one.

The right answers are recomputed here by hand from the published model shapes, as an
oracle for the answers kvlab computes from its presets.
"""

from __future__ import annotations

import pytest

from kvlab.exercises import EXERCISES, check, question

HAND_ANSWERS = {
    # 2 (K, V) x 32 layers x 8 KV heads x 128 head_dim x 2 bytes
    "01.kv_bytes_llama3_8b": 2 * 32 * 8 * 128 * 2,
    # rows of 40 + 50 - 1 positions; requests need (12+50-1) + (40+6-1) + (25+20-1)
    "01.padding_waste": 1 - (61 + 45 + 44) / (3 * 89),
    # (80 GiB - 6,738,415,616 x 2 B of weights) // (4096 x 0.5 MiB)
    "01.requests_on_a100": (80 * 2**30 - 6_738_415_616 * 2) // (4096 * 2**19),
    # 100 prompt + 100 output rounded up to 128
    "02.pow2_reservation": 100 + 128,
    # 40 + 20 - 1 tokens in a 512-slot range
    "02.internal_waste": 1 - (40 + 20 - 1) / 512,
    # holes of 300 (0..299), 300 (500..799) and 100 (900..999)
    "02.largest_request": 300,
    # 32 blocks of 32 slots for 1,000 tokens
    "03.empty_slots": 32 * 32 - 1000,
    # 4 seats x 10 steps (the longest output) - 3 - 10 - 4 - 6 tokens
    "04.static_idle_seats": 4 * 10 - (3 + 10 + 4 + 6),
    # the oldest request (arrived at 0) times out after 0.5 s, before a 4th arrives at 1.2
    "04.dynamic_start": 0.5,
    # 7 prompt blocks + int(0.1 x 120) reserved blocks (rounded down, as vLLM does)
    "04.watermark": 7 + 12,
}


def test_every_exercise_has_a_hand_answer():
    assert set(HAND_ANSWERS) == set(EXERCISES)


@pytest.mark.parametrize("exercise_id", sorted(HAND_ANSWERS))
def test_right_answer_is_correct(exercise_id):
    feedback = check(exercise_id, HAND_ANSWERS[exercise_id])
    assert feedback.correct and bool(feedback)
    assert repr(feedback).startswith("Correct")
    assert check(exercise_id, float(HAND_ANSWERS[exercise_id])).correct
    assert question(exercise_id)


@pytest.mark.parametrize("exercise_id", sorted(EXERCISES))
def test_known_mistakes_get_their_own_hint(exercise_id):
    exercise = EXERCISES[exercise_id]
    assert exercise.mistakes
    for mistake in exercise.mistakes:
        feedback = check(exercise_id, mistake.value())
        assert not feedback.correct
        assert mistake.hint in feedback.message


@pytest.mark.parametrize("exercise_id", sorted(EXERCISES))
def test_other_wrong_answers_get_the_general_hint(exercise_id):
    feedback = check(exercise_id, 123_456_789)
    assert not feedback
    assert EXERCISES[exercise_id].hint in feedback.message


@pytest.mark.parametrize("answer", [None, "131072", True, [1]])
def test_unusable_answers_get_a_friendly_message(answer):
    feedback = check("01.kv_bytes_llama3_8b", answer)
    assert not feedback.correct
    assert "Hint" not in feedback.message


def test_placeholder_asks_to_fill_in():
    assert "answer = None" in check("01.padding_waste", None).message


def test_specific_hints():
    assert "KV heads" in check("01.kv_bytes_llama3_8b", 2 * 32 * 32 * 128 * 2).message
    assert "round down" in check("01.requests_on_a100", 33.7).message
    assert "weights" in check("01.requests_on_a100", 40).message
    assert check("01.padding_waste", 0.44).correct  # within the stated tolerance


def test_unknown_exercise_lists_the_known_ones():
    with pytest.raises(KeyError, match="01.kv_bytes_llama3_8b"):
        check("01.nope", 1)
