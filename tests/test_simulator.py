"""Tests of the memory simulator: traces, the replay, and the seed-setting comparison.

The oracle is the engine itself: ``LLMEngine.step`` with the model-free runner and a cache
that keeps only bookkeeping. On small traces the simulator's fast path must admit,
preempt and finish the same requests at the same steps, holding the same memory, with
its closed-form counts and block events.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace

import pytest

from kvlab.engine.llm_engine import LLMEngine
from kvlab.engine.metrics import ManualClock
from kvlab.engine.model_free import ModelFreeRunner, bookkeeping_cache
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.engine.step_cost import Roofline, StepCostClock, StepWork
from kvlab.memory import GIB, KVSpec, preset
from kvlab.sim.memory import LABELS
from kvlab.sim.paper import PUBLISHED, PUBLISHED_BREAKDOWN, format_comparison
from kvlab.sim.servers import (
    CLAIRVOYANT,
    PAGED,
    PUBLISHED_RATIOS,
    SERVERS,
    flat_out,
    latency_curves,
    latency_sweep,
    ratio_table,
    server_table,
    sustained_rate,
)
from kvlab.sim.simulator import A100_40GB, StepLog, kv_budget_bytes, simulate
from kvlab.sim.trace import make_trace

LLAMA = preset("llama-2-7b")
POLICIES = ("max_model_len", "pow2", "exact")


@pytest.fixture(scope="module")
def trace():
    return make_trace(2000, "sharegpt", arrival_rate=20.0, seed=1)


@pytest.fixture(scope="module")
def results(trace):
    runs = {
        p: simulate(trace, LLAMA, allocator="contiguous", reservation_policy=p) for p in POLICIES
    }
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


def test_exact_policy_wastes_only_the_last_tokens_slot(results):
    # It reserves prompt + output slots; the last output token is sampled, never stored.
    exact = results["exact"]
    assert exact.internal_fragmentation == pytest.approx(exact.fit_at_once / exact.capacity_slots)
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
    for published in ("20.4%", "26.8%", "38.2%", "96.3%"):  # the paper's Fig. 2, exactly
        assert published in text
    assert "paged/16 fits" in text
    # The paper's names for the kinds of waste: "reservation", not "future".
    header = text.splitlines()[0].split()
    assert "reservation" in header and "future" not in header
    assert set(PUBLISHED) == {f"contiguous/{LABELS[p]}" for p in POLICIES} | {"paged/16"}


def test_the_published_breakdown_agrees_with_the_token_states_and_adds_up():
    assert set(PUBLISHED_BREAKDOWN) == set(PUBLISHED)
    for label, parts in PUBLISHED_BREAKDOWN.items():
        assert parts[0] == PUBLISHED[label][0]
        known = [p for p in parts if p is not None]
        # The figure's bars are rounded to 0.1%: each adds up to 100% within 0.2%.
        assert sum(known) <= 1.002
        if None not in parts:
            assert sum(known) == pytest.approx(1.0, abs=0.002)


# ---- the oracle: the engine with the model-free runner ------------------------------------

TINY = KVSpec("tiny", 1, 1, 8, 2, 0, 256)  # 32 bytes per token, no weights
STEP_SECONDS = 0.025


def engine_replay(
    trace,
    num_slots,
    allocator,
    policy,
    block_size,
    max_num_seqs,
    watermark,
    clock=None,
    scheduling="continuous",
):
    """Replay ``trace`` through LLMEngine.step; one StepLog per step, like the simulator's
    (its time the engine clock's at the step's end)."""
    if allocator == "paged":
        cache = bookkeeping_cache(
            num_blocks=num_slots // block_size, block_size=block_size, enable_prefix_caching=False
        )
    else:
        cache = bookkeeping_cache(
            "contiguous",
            num_slots=num_slots,
            reservation_policy=policy,
            max_model_len=TINY.max_model_len,
        )
    config = SchedulerConfig(
        scheduling=scheduling,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=sum(trace.prompt_lens) + sum(trace.output_lens),  # no chunks
        watermark=watermark,
    )
    runner = ModelFreeRunner(max_model_len=TINY.max_model_len)
    engine = LLMEngine(runner, cache, config, clock=clock or ManualClock(STEP_SECONDS))
    for i in range(len(trace)):
        params = SamplingParams(temperature=0, max_tokens=trace.output_lens[i], ignore_eos=True)
        engine.add_request(str(i), [i + 1] * trace.prompt_lens[i], params, trace.arrival_s[i])
    # Memory is read where the simulator measures it: after allocation, before frees.
    before_frees = []
    finish_running = engine.scheduler.finish_running

    def measure_then_finish(finished):
        before_frees.append(engine.kv.usage())
        finish_running(finished)

    engine.scheduler.finish_running = measure_then_finish
    while engine.has_unfinished_requests():
        engine.step()
    return [
        StepLog(
            tuple(int(r) for r in stats.admitted),
            tuple(int(r) for r in stats.preempted),
            tuple(sorted(int(r) for r in stats.finished)),
            usage.num_used_slots,
            usage.num_reserved_slots,
            stats.time,
        )
        for stats, usage in zip(engine.metrics.steps, before_frees, strict=True)
    ]


CASES = {
    # name: (lengths, allocator, policy, num_slots, block_size, max_num_seqs, watermark)
    "paged, roomy": ("alpaca", "paged", "", 8000, 4, 16, 0.0),
    "paged, preempting": ("alpaca", "paged", "", 400, 4, 16, 0.0),
    # Every request needs a block every step: the order they get them in matters.
    "paged/1, preempting": ("alpaca", "paged", "", 300, 1, 16, 0.0),
    "paged, watermark": ("alpaca", "paged", "", 480, 8, 32, 0.1),
    # Long prompts in a small pool: some fit only while nothing runs (no watermark then).
    "paged, watermark, long prompts": ("sharegpt", "paged", "", 256, 8, 8, 0.25),
    "contiguous/max_model_len": ("alpaca", "contiguous", "max_model_len", 1024, 1, 16, 0.0),
    "contiguous/clairvoyant-pow2": ("alpaca", "contiguous", "pow2", 1024, 1, 16, 0.0),
    "contiguous/clairvoyant": ("alpaca", "contiguous", "exact", 1024, 1, 16, 0.0),
}


class PricedWork:
    """A step cost that charges every field of ``StepWork`` its own price, so that a step
    whose counts differ in any one field from the engine's lasts another time."""

    def seconds(self, work: StepWork) -> float:
        return (
            0.01
            + 1e-3 * work.num_prefill_tokens
            + 1e-4 * work.num_decode_seqs
            + 1e-6 * work.num_context_tokens
            + 1e-8 * work.num_attention_pairs
        )


def steps_of(log: list[StepLog]) -> list[StepLog]:
    return [replace(s, finished=tuple(sorted(s.finished))) for s in log]


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("clock", ["equal steps", "priced steps"])
def test_the_fast_path_steps_like_the_engine(case, clock):
    lengths, allocator, policy, num_slots, block_size, max_num_seqs, watermark = CASES[case]
    trace = make_trace(60, lengths, arrival_rate=40.0, seed=2, max_model_len=TINY.max_model_len)
    log: list[StepLog] = []
    cost = PricedWork() if clock == "priced steps" else None
    result = simulate(
        trace, TINY, num_slots * TINY.bytes_per_token, allocator, policy or "exact",
        block_size=block_size, gpu_memory_utilization=1.0, max_num_seqs=max_num_seqs,
        step_seconds=STEP_SECONDS, watermark=watermark, log=log, step_cost=cost,
    )  # fmt: skip
    engine = engine_replay(
        trace, num_slots, allocator, policy, block_size, max_num_seqs, watermark,
        clock=StepCostClock(cost) if cost else None,
    )  # fmt: skip
    ours = steps_of(log)
    assert len(ours) == len(engine) == result.num_steps
    for step, (mine, theirs) in enumerate(zip(ours, engine, strict=True)):
        assert replace(mine, time=0) == replace(theirs, time=0), f"step {step}"
        assert mine.time == pytest.approx(theirs.time, rel=1e-9, abs=1e-12), f"step {step}"
    assert result.sim_seconds == pytest.approx(engine[-1].time, rel=1e-9)
    if "preempting" in case:
        assert result.num_preemptions > 0
    if allocator == "contiguous":
        assert result.measured_steps < result.num_steps  # requests did wait for memory


@pytest.mark.parametrize("case", ["contiguous/max_model_len", "paged, preempting"])
def test_static_batching_steps_like_the_engines(case):
    """A batch runs until its last request is done; a preempted member comes back into it."""
    lengths, allocator, policy, num_slots, block_size, max_num_seqs, watermark = CASES[case]
    trace = make_trace(60, lengths, arrival_rate=40.0, seed=2, max_model_len=TINY.max_model_len)
    log: list[StepLog] = []
    result = simulate(
        trace, TINY, num_slots * TINY.bytes_per_token, allocator, policy or "exact",
        block_size=block_size, gpu_memory_utilization=1.0, max_num_seqs=max_num_seqs,
        watermark=watermark, log=log, step_cost=PricedWork(), batching="static",
    )  # fmt: skip
    engine = engine_replay(
        trace, num_slots, allocator, policy, block_size, max_num_seqs, watermark,
        clock=StepCostClock(PricedWork()), scheduling="static",
    )  # fmt: skip
    assert len(log) == len(engine) == result.num_steps
    for step, (mine, theirs) in enumerate(zip(steps_of(log), engine, strict=True)):
        assert replace(mine, time=0) == replace(theirs, time=0), f"step {step}"
        assert mine.time == pytest.approx(theirs.time, rel=1e-9, abs=1e-12), f"step {step}"
    continuous = simulate(
        trace, TINY, num_slots * TINY.bytes_per_token, allocator, policy or "exact",
        block_size=block_size, gpu_memory_utilization=1.0, max_num_seqs=max_num_seqs,
        watermark=watermark, step_cost=PricedWork(),
    )  # fmt: skip
    assert result.num_steps > continuous.num_steps  # batches wait for their longest member
    if "preempting" in case:
        assert result.num_preemptions > 0


def test_a_priced_step_lasts_what_it_reads():
    """On an A100's roofline, paged runs more requests at once and each of its steps reads
    more K/V, so its steps last longer than max-length reservation's: the equal-step clock
    overstates its lead."""
    trace = make_trace(400, "sharegpt", arrival_rate=20.0, seed=1)
    a100 = Roofline.of(LLAMA, "a100-40gb")
    priced = {
        allocator: simulate(trace, LLAMA, allocator=allocator, step_cost=a100)
        for allocator in ("contiguous", "paged")
    }
    equal = {
        allocator: simulate(trace, LLAMA, allocator=allocator)
        for allocator in ("contiguous", "paged")
    }
    per_step = {a: r.sim_seconds / r.num_steps for a, r in priced.items()}
    assert per_step["paged"] > per_step["contiguous"]
    lead_priced = priced["paged"].throughput / priced["contiguous"].throughput
    lead_equal = equal["paged"].throughput / equal["contiguous"].throughput
    assert 1 < lead_priced < lead_equal
    for r in priced.values():
        assert 0 < r.ttft_p50 <= r.ttft_p99 and r.e2e_p50 <= r.e2e_p99
        assert r.num_output_tokens == sum(trace.output_lens)


def test_bad_batching_and_step_cost_are_refused():
    trace = make_trace(5, seed=0)
    with pytest.raises(ValueError, match="batching='dynamic' is not allowed"):
        simulate(trace, LLAMA, batching="dynamic")
    with pytest.raises(ValueError, match="step_cost=3 is not allowed"):
        simulate(trace, LLAMA, step_cost=3)


# ---- the seed's servers at A100 scale --------------------------------------------------------


def test_flat_out_paged_serves_the_most_requests_and_one_at_a_time_the_fewest():
    flat = flat_out(num_requests=60, servers=tuple(SERVERS))
    rates = [flat[name].throughput for name in SERVERS]
    assert rates == sorted(rates)  # each server in SERVERS beats the one before it


def test_flat_out_replays_the_seed_servers_and_the_clairvoyant_one():
    results = flat_out(num_requests=40)
    assert list(results) == [*[s for s in SERVERS if s != PAGED], CLAIRVOYANT, PAGED]
    assert results[CLAIRVOYANT].label == "contiguous/clairvoyant"
    assert results["one at a time"].peak_running == 1
    assert results[PAGED].throughput > results["one at a time"].throughput
    table = server_table(results).splitlines()
    assert len(table) == 2 + len(results) and table[2].startswith("one at a time")
    ratios = ratio_table(results).splitlines()
    assert len(ratios) == len(results)  # a header, then every server but paged
    paged_over_one = results[PAGED].throughput / results["one at a time"].throughput
    assert ratios[1].split()[5] == f"{paged_over_one:.1f}x"
    assert ratios[1].endswith(PUBLISHED_RATIOS["one at a time"])


def test_latency_sweep_replays_a_fixed_duration_and_drops_overloaded_servers():
    runs = latency_sweep([0.2, 2.0, 50.0], duration_s=60, servers=["one at a time", PAGED])
    assert runs[0.2]["one at a time"].num_requests == 20  # at least 20 requests
    assert runs[2.0][PAGED].num_requests == 120  # 2 per second for 60 s
    assert runs[2.0]["one at a time"].normalized_latency > 0.5  # past its flat-out rate
    assert list(runs[50.0]) == [PAGED]  # one at a time was left out
    curves = latency_curves(runs)
    assert [rate for rate, _ in curves[PAGED]] == [0.2, 2.0, 50.0]
    assert curves["one at a time"][1] == (2.0, runs[2.0]["one at a time"].normalized_latency)
    assert sustained_rate(runs, PAGED) == 2.0  # at 50 a second even paged falls behind
    assert sustained_rate(runs, "one at a time") == 0.2
    with pytest.raises(ValueError, match="rates"):
        latency_sweep([math.inf])


def test_flat_out_on_equal_steps_prices_every_step_the_same():
    names = ["max-length, continuous", PAGED]
    equal = flat_out(num_requests=40, servers=names, equal_steps=0.025)
    assert list(equal) == names
    for result in equal.values():
        assert result.sim_seconds == pytest.approx(0.025 * result.num_steps)
    with pytest.raises(ValueError, match="servers"):
        flat_out(num_requests=40, servers=["vllm"])
