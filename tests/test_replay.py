"""Trace replays (kvlab.measure.replay): requests from a trace, the timeline, lab 04's exercises.

The timeline is checked against the engine's own metrics (arrival, first token, finish),
and each lab 04 exercise answer against a replay through the real engine.
"""

from __future__ import annotations

import math

import pytest

import kvlab
from kvlab import LLM
from kvlab.cache.paged import PagedKVCache
from kvlab.engine.metrics import ManualClock
from kvlab.exercises import EXERCISES
from kvlab.measure.replay import (
    STATES,
    TraceRequests,
    format_preemption_table,
    format_table,
    on_time_grid,
    replay,
)
from kvlab.sim.trace import make_trace
from kvlab.widgets.batching_figures import timeline_figure

STEP = 0.025


pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_llm(model, **settings) -> LLM:
    options = dict(num_blocks=64, block_size=4, max_num_seqs=4, clock=ManualClock(STEP))
    return LLM(model, **(options | settings))


def small_requests(num_requests=8, rate=20.0, max_output_len=10, seed=0) -> TraceRequests:
    trace = make_trace(num_requests, "alpaca", arrival_rate=rate, seed=seed, max_model_len=512)
    return TraceRequests.from_trace(trace, 256, max_output_len=max_output_len, seed=seed)


def test_requests_from_a_trace_are_seeded_and_follow_its_lengths():
    trace = make_trace(10, "alpaca", arrival_rate=8.0, seed=3, max_model_len=512)
    a = TraceRequests.from_trace(trace, 256, max_output_len=12, seed=3)
    b = TraceRequests.from_trace(trace, 256, max_output_len=12, seed=3)
    assert a == b
    assert [len(p) for p in a.prompts] == list(trace.prompt_lens)
    assert a.max_tokens == [min(n, 12) for n in trace.output_lens]
    assert all(3 <= t < 256 for p in a.prompts for t in p)
    assert a.arrival_times == [on_time_grid(t) for t in trace.arrival_s]
    pairs = zip(a.arrival_times, trace.arrival_s, strict=True)
    assert all(abs(x - y) <= 1 / 2048 for x, y in pairs)
    assert a.arriving_at_once().arrival_times == [0.0] * 10
    chat = a.with_prompts([[5, 6]] * 10)
    assert chat.prompts[0] == [5, 6] and not chat.ignore_eos and a.ignore_eos


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(prompts=[[1]], max_tokens=[1, 2], arrival_times=[0.0]), "one entry per request"),
    ],
)
def test_mismatched_requests_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        TraceRequests(**kwargs)


def test_bad_trace_arguments_are_refused():
    trace = make_trace(2, "alpaca", seed=0)
    with pytest.raises(ValueError, match="vocab_size"):
        TraceRequests.from_trace(trace, 2)
    with pytest.raises(ValueError, match="max_output_len"):
        TraceRequests.from_trace(trace, 256, max_output_len=0)


def test_times_on_the_grid_add_up_exactly():
    # The float trap the grid avoids: 0.8 + a - a is not 0.8 for this arrival.
    arrival = 1.4632236633951825
    assert (arrival + 0.8) - arrival < 0.8
    a, t = on_time_grid(arrival), on_time_grid(0.8)
    assert (a + t) - a == t


def test_a_dynamic_batch_on_the_grid_starts_at_its_timeout(tiny_model):
    arrival, timeout = on_time_grid(1.4632236633951825), on_time_grid(0.8)
    requests = TraceRequests([[5, 6, 7]], [3], [arrival])
    result = replay(tiny_llm(tiny_model, scheduling="dynamic", batch_timeout=timeout), requests)
    assert result.step_starts()[0] == arrival + timeout
    assert result.outputs[0].metrics.queue_time == timeout


@pytest.mark.parametrize("scheduling", ["static", "dynamic", "continuous"])
@pytest.mark.parametrize("pool", [dict(), dict(num_blocks=14, preemption_mode="swap")])
def test_the_timeline_covers_each_request_from_arrival_to_last_token(tiny_model, scheduling, pool):
    requests = small_requests()
    result = replay(tiny_llm(tiny_model, scheduling=scheduling, **pool), requests)
    segments = result.timeline()
    assert {s.state for s in segments} <= set(STATES)
    for i, output in enumerate(result.outputs):
        mine = [s for s in segments if s.request == i]
        metrics = output.metrics
        assert mine[0].start == pytest.approx(metrics.arrival_time)
        assert mine[-1].end == pytest.approx(metrics.arrival_time + metrics.e2e)
        for before, after in zip(mine, mine[1:], strict=False):
            assert before.end == pytest.approx(after.start)  # no gaps, no overlaps
            assert before.state != after.state  # merged
        # The first token ends the first prefill segment.
        first_prefill = next(s for s in mine if s.state == "prefill")
        assert first_prefill.end == pytest.approx(metrics.arrival_time + metrics.ttft)
        # A decode step per output token after the first, unless preempted in between.
        decode_time = sum(s.end - s.start for s in mine if s.state == "decode")
        if metrics.num_preemptions == 0:
            assert decode_time == pytest.approx((metrics.num_output_tokens - 1) * STEP)


def test_swapped_time_shows_in_the_timeline(tiny_model):
    requests = small_requests(num_requests=10, rate=40.0, max_output_len=24)
    result = replay(tiny_llm(tiny_model, num_blocks=16, preemption_mode="swap"), requests)
    assert result.metrics.num_swap_outs > 0
    assert any(s.state == "swapped" for s in result.timeline())


def test_every_state_in_a_stacked_timeline_has_one_legend_entry(tiny_model):
    # Lab 04 stacks recompute over swap: "swapped" appears only in the second row.
    requests = small_requests(num_requests=10, rate=40.0, max_output_len=24)
    runs = {
        "recompute": replay(tiny_llm(tiny_model, num_blocks=16), requests),
        "swap": replay(tiny_llm(tiny_model, num_blocks=16, preemption_mode="swap"), requests),
    }
    fig = timeline_figure(runs)
    drawn = {t.name for t in fig.data}
    assert "swapped" in drawn
    listed = [t.name for t in fig.data if t.showlegend is not False]
    assert sorted(listed) == sorted(drawn)  # each drawn state once, none missing


def test_static_batches_admit_only_when_the_last_batch_is_done(tiny_model):
    result = replay(tiny_llm(tiny_model, scheduling="static"), small_requests(rate=40.0))
    steps = result.metrics.steps
    for before, step in zip(steps, steps[1:], strict=False):
        if step.admitted:
            assert before.num_running == 0


def test_latencies_depend_on_lengths_not_on_the_model(tiny_model):
    """On a ManualClock two different models give the same metrics for the same lengths."""
    other, _ = kvlab.load_model("tiny-qwen2", device="cpu")
    requests = small_requests()
    a = replay(tiny_llm(tiny_model), requests)
    b = replay(tiny_llm(other), requests)
    assert a.token_ids != b.token_ids
    assert a.summary == b.summary


def test_step_log_and_table_name_every_request(tiny_model):
    result = replay(tiny_llm(tiny_model), small_requests(num_requests=3))
    log = result.step_log()
    assert "+r0" in log and "r2 done" in log and "r0:P" in log
    assert len(result.step_log(events_only=False).splitlines()) == len(result.metrics.steps) + 1
    table = format_table({"continuous": result})
    assert table.splitlines()[2].startswith("continuous")
    assert "E2E p99" in table


# ---- lab 04's exercises, against the engine -----------------------------------------------------


def test_exercise_static_idle_seats_matches_a_replay(tiny_model):
    from kvlab.exercises.lab04 import _STATIC_MAX_NUM_SEQS, _STATIC_OUTPUT_LENS

    lens = list(_STATIC_OUTPUT_LENS)
    requests = TraceRequests([[5, 6, 7, 8]] * len(lens), lens, [0.0] * len(lens))
    llm = tiny_llm(tiny_model, scheduling="static", max_num_seqs=_STATIC_MAX_NUM_SEQS)
    steps = replay(llm, requests).metrics.steps
    idle = sum(_STATIC_MAX_NUM_SEQS - s.num_scheduled for s in steps)
    assert idle == EXERCISES["04.static_idle_seats"].answer()


def test_exercise_dynamic_start_matches_a_replay(tiny_model):
    from kvlab.exercises.lab04 import _DYNAMIC_ARRIVALS, _DYNAMIC_MAX_NUM_SEQS, _DYNAMIC_TIMEOUT

    arrivals = list(_DYNAMIC_ARRIVALS)
    requests = TraceRequests([[5, 6, 7]] * len(arrivals), [2] * len(arrivals), arrivals)
    llm = tiny_llm(
        tiny_model,
        scheduling="dynamic",
        max_num_seqs=_DYNAMIC_MAX_NUM_SEQS,
        batch_timeout=_DYNAMIC_TIMEOUT,
    )
    result = replay(llm, requests)
    assert result.step_starts()[0] == pytest.approx(EXERCISES["04.dynamic_start"].answer())
    assert len(result.metrics.steps[0].admitted) == 3


def test_exercise_watermark_uses_the_schedulers_reserve():
    from kvlab.exercises.lab04 import _WATERMARK, _WATERMARK_NUM_BLOCKS, _WATERMARK_PROMPT_BLOCKS

    cache = PagedKVCache(1, 1, 2, num_blocks=_WATERMARK_NUM_BLOCKS, block_size=4, device="cpu")
    reserve = cache.manager.watermark_blocks(_WATERMARK)
    assert reserve == math.ceil(_WATERMARK * _WATERMARK_NUM_BLOCKS)
    assert EXERCISES["04.watermark"].answer() == _WATERMARK_PROMPT_BLOCKS + reserve


def test_a_replay_counts_recomputed_tokens_its_largest_step_and_its_copies(tiny_model):
    work = small_requests(num_requests=8, rate=40.0, max_output_len=24)
    roomy = replay(tiny_llm(tiny_model, enable_prefix_caching=False), work)
    recompute = replay(tiny_llm(tiny_model, num_blocks=16, enable_prefix_caching=False), work)
    swap = replay(tiny_llm(tiny_model, num_blocks=16, preemption_mode="swap"), work)
    assert roomy.num_prefill_tokens == sum(len(p) for p in work.prompts)
    assert recompute.metrics.num_preemptions > 0
    # A recompute computes the prompt and the tokens generated so far again.
    assert recompute.num_prefill_tokens > roomy.num_prefill_tokens
    assert swap.num_prefill_tokens == roomy.num_prefill_tokens
    assert recompute.num_blocks_swapped == recompute.num_blocks_prefetched == 0
    assert swap.num_blocks_swapped + swap.num_blocks_prefetched > 0
    steps = recompute.metrics.steps
    assert recompute.max_step_tokens == max(
        s.num_prefill_tokens + s.num_decode_tokens for s in steps
    )
    assert recompute.max_step_tokens >= max(len(p) for p in work.prompts)


def test_the_preemption_table_prints_what_running_out_of_blocks_cost(tiny_model):
    work = small_requests(num_requests=8, rate=40.0, max_output_len=24)
    roomy = replay(tiny_llm(tiny_model, enable_prefix_caching=False), work)
    runs = {
        "roomy": roomy,
        "recompute": replay(tiny_llm(tiny_model, num_blocks=16, enable_prefix_caching=False), work),
        "swap": replay(tiny_llm(tiny_model, num_blocks=16, preemption_mode="swap"), work),
    }
    table = format_preemption_table(runs, reference=roomy, seconds_per_block=0.001)
    header, rule, *rows = table.splitlines()
    assert header.split()[:3] == ["run", "same", "tokens"] and set(rule) == {"-"}
    cells = {row.split()[0]: row.split()[1:] for row in rows}
    assert cells["roomy"] == ["True", "0", str(roomy.max_step_tokens), "0", "0.0", "0"]
    again = runs["recompute"].num_prefill_tokens - roomy.num_prefill_tokens
    assert cells["recompute"][:2] == ["True", str(again)] and again > 0
    swapped = runs["swap"].num_blocks_swapped
    assert cells["swap"][3:5] == [str(swapped), f"{swapped:.1f}"]  # 1 ms a block
    assert max(len(line) for line in table.splitlines()) <= 105  # one line in HTML
