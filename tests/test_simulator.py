"""Tests of the memory simulator: traces, the replay, and the seed-setting comparison.

The oracle is a literal replay written here: every step it walks every running request,
adds one token, and asks the allocator for room, token by token. The simulator must
measure the same memory with its closed-form counts and block events.
"""

from __future__ import annotations

import math
import time
from collections import deque

import pytest

from kvlab.cache import BlockManager, CacheFullError, ContiguousArena, reservation_size
from kvlab.memory import GIB, KVSpec, preset
from kvlab.sim.simulator import (
    A100_40GB,
    PUBLISHED,
    SimResult,
    format_comparison,
    kv_budget_bytes,
    make_trace,
    simulate,
)

LLAMA = preset("llama-2-7b")
POLICIES = ("max_model_len", "pow2", "exact")


@pytest.fixture(scope="module")
def trace():
    return make_trace(2000, "sharegpt", arrival_rate=20.0, seed=1)


@pytest.fixture(scope="module")
def results(trace):
    runs = {p: simulate(trace, LLAMA, allocator="contiguous", policy=p) for p in POLICIES}
    runs["paged"] = simulate(trace, LLAMA, allocator="paged", block_size=16)
    return runs


# ---- traces --------------------------------------------------------------------------------


def test_trace_is_deterministic_by_seed():
    assert make_trace(500, seed=3) == make_trace(500, seed=3)
    assert make_trace(500, seed=3) != make_trace(500, seed=4)


@pytest.mark.parametrize(
    "lengths, prompt_mean, output_mean",
    [("sharegpt", 161, 338), ("alpaca", 19.3, 58.5), ("uniform", 161, 338)],
)
def test_trace_lengths_have_the_published_means(lengths, prompt_mean, output_mean):
    trace = make_trace(20_000, lengths, seed=0)
    # Redrawing pairs longer than max_model_len trims the long tail a little.
    assert trace.mean_prompt_len == pytest.approx(prompt_mean, rel=0.06)
    assert trace.mean_output_len == pytest.approx(output_mean, rel=0.06)
    assert min(trace.prompt_lens) >= 1 and min(trace.output_lens) >= 1
    assert max(p + o for p, o in zip(trace.prompt_lens, trace.output_lens, strict=True)) <= 4096


def test_sharegpt_lengths_are_long_tailed():
    trace = make_trace(20_000, "sharegpt", seed=0)
    median = sorted(trace.output_lens)[len(trace) // 2]
    assert median < 0.85 * trace.mean_output_len  # a long tail pulls the mean up
    assert max(trace.output_lens) > 6 * trace.mean_output_len


def test_arrivals_are_poisson():
    trace = make_trace(20_000, arrival_rate=5.0, seed=0)
    gaps = [b - a for a, b in zip(trace.arrival_s, trace.arrival_s[1:], strict=False)]
    assert sum(gaps) / len(gaps) == pytest.approx(1 / 5.0, rel=0.05)
    assert all(gap >= 0 for gap in gaps)
    assert set(make_trace(10, arrival_rate=math.inf).arrival_s) == {0.0}


def test_trace_errors():
    with pytest.raises(ValueError, match="lengths must be one of"):
        make_trace(10, "lmsys")
    with pytest.raises(ValueError, match="must be > 0"):
        make_trace(0)


# ---- the replay ----------------------------------------------------------------------------


def test_simulation_is_deterministic(trace, results):
    assert simulate(trace, LLAMA, allocator="paged") == results["paged"]


def test_paged_uses_memory_better_than_every_contiguous_policy(results):
    paged = results["paged"]
    assert paged.token_states > 0.9 and paged.utilization > 0.95
    for policy in POLICIES:
        contiguous = results[policy]
        assert paged.token_states > contiguous.token_states
        assert paged.fit_at_once > contiguous.fit_at_once
    assert results["exact"].token_states > results["pow2"].token_states
    assert results["pow2"].token_states > results["max_model_len"].token_states


def test_exact_policy_has_no_internal_fragmentation(results):
    assert results["exact"].internal_fragmentation == 0.0
    assert results["pow2"].internal_fragmentation > 0.0
    assert results["max_model_len"].internal_fragmentation > 0.5


def test_paged_has_no_external_fragmentation(results):
    assert results["paged"].external_fragmentation == 0.0
    assert results["exact"].external_fragmentation > 0.0


@pytest.mark.parametrize("name", [*POLICIES, "paged"])
def test_memory_shares_add_up(results, name):
    r = results[name]
    parts = (
        r.token_states,
        r.reserved_for_future,
        r.internal_fragmentation,
        r.external_fragmentation,
        r.free,
    )
    assert all(part >= -1e-12 for part in parts)
    assert sum(parts) == pytest.approx(1.0)
    assert r.peak_running >= r.mean_running > 0
    assert r.num_steps >= r.measured_steps > 0


def test_budget_follows_utilization_minus_weights():
    budget = kv_budget_bytes(LLAMA, A100_40GB, 0.9)
    assert budget == int(40 * GIB * 0.9) - LLAMA.weight_bytes
    assert budget // LLAMA.bytes_per_token == 48_022  # 0.5 MiB per token
    with pytest.raises(ValueError, match="leave no KV memory"):
        kv_budget_bytes(LLAMA, 8 * GIB)


def test_request_larger_than_the_budget_is_an_error():
    trace = make_trace(5, seed=0, max_model_len=4096)
    with pytest.raises(ValueError, match="exceeds"):
        simulate(trace, LLAMA, gpu_memory_bytes=int(14.3 * GIB), allocator="contiguous")


def test_ten_thousand_requests_complete():
    trace = make_trace(10_000, seed=0)
    start = time.perf_counter()
    result = simulate(trace, LLAMA, allocator="paged")
    elapsed = time.perf_counter() - start
    assert result.num_requests == 10_000
    print(f"10k requests, paged: {elapsed:.2f} s for {result.num_steps} steps")


def test_comparison_prints_published_figures(results):
    text = format_comparison([results[p] for p in POLICIES] + [results["paged"]])
    assert "20.4%" in text and "38.2%" in text and "96.0%" in text
    assert "paged/16 fits" in text
    assert set(PUBLISHED) == {f"contiguous/{p}" for p in POLICIES} | {"paged/16"}


# ---- the oracle: a literal token-by-token replay -------------------------------------------

TINY = KVSpec("tiny", 1, 1, 8, 2, 0, 256)  # 32 bytes per token, no weights


def literal_replay(trace, num_slots, allocator, policy="exact", block_size=4) -> dict:
    """The same serving loop, one token and one request at a time (no preemption)."""
    arena, manager = ContiguousArena(num_slots), BlockManager(num_slots // block_size, block_size)
    final = [p + o for p, o in zip(trace.prompt_lens, trace.output_lens, strict=True)]
    lengths: dict[int, int] = {}  # running request -> tokens held
    waiting, arrived, finished, step, now = deque(), 0, 0, 0, 0.0
    samples = []  # per step: (used, reserved, useful, a request waited)
    while finished < len(trace):
        while arrived < len(trace) and trace.arrival_s[arrived] <= now:
            waiting.append(arrived)
            arrived += 1
        if not lengths and not waiting:
            now = trace.arrival_s[arrived]
            continue
        for request in lengths:
            lengths[request] += 1
            if allocator == "paged":
                manager.allocate_slots(request, 1)
        while waiting:
            request = waiting[0]
            try:
                if allocator == "paged":
                    manager.allocate_slots(request, trace.prompt_lens[request])
                else:
                    prompt_len, output_len = trace.prompt_lens[request], trace.output_lens[request]
                    arena.reserve(
                        request,
                        reservation_size(policy, prompt_len, output_len, TINY.max_model_len),
                    )
            except CacheFullError:
                break
            lengths[waiting.popleft()] = trace.prompt_lens[request]
        if allocator == "paged":
            capacity = {r: len(manager.block_table(r)) * block_size for r in lengths}
            reserved = (manager.num_blocks - manager.num_free_blocks) * block_size
        else:
            capacity = {r: arena.range_of(r).num_slots for r in lengths}
            reserved = arena.num_reserved_slots
        useful = sum(min(capacity[r], final[r]) for r in lengths)
        samples.append((sum(lengths.values()), reserved, useful, bool(waiting)))
        for request in [r for r, n in lengths.items() if n == final[r]]:
            del lengths[request]
            (manager if allocator == "paged" else arena).free(request)
            finished += 1
        step += 1
        now += 0.025
    # Like the simulator: measure the steps in which a request waited, if any did.
    measured = [x for x in samples if x[3]] or samples
    used, reserved, useful, _ = (sum(column) for column in zip(*measured, strict=True))
    return dict(steps=len(samples), measured_steps=len(measured), used=used,
                reserved=reserved, useful=useful)  # fmt: skip


@pytest.mark.parametrize(
    "allocator, policy", [("contiguous", p) for p in POLICIES] + [("paged", "")]
)
def test_simulator_matches_a_literal_replay(allocator, policy):
    trace = make_trace(60, "alpaca", arrival_rate=40.0, seed=2, max_model_len=TINY.max_model_len)
    num_slots = 8000 if allocator == "paged" else 1024  # paged: enough to never preempt
    result: SimResult = simulate(
        trace, TINY, num_slots * TINY.bytes_per_token, allocator, policy or "exact",
        block_size=4, gpu_memory_utilization=1.0, watermark=0.0,
    )  # fmt: skip
    expected = literal_replay(trace, num_slots, allocator, policy or "exact")
    assert result.num_preemptions == 0
    assert (result.num_steps, result.measured_steps) == (
        expected["steps"],
        expected["measured_steps"],
    )
    if allocator == "contiguous":
        assert result.measured_steps < result.num_steps  # requests did wait for memory
    capacity = result.capacity_slots * result.measured_steps
    assert result.token_states == pytest.approx(expected["used"] / capacity)
    assert result.internal_fragmentation == pytest.approx(
        (expected["reserved"] - expected["useful"]) / capacity
    )
    assert result.utilization == pytest.approx(expected["used"] / expected["reserved"])
