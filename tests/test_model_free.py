"""The model-free runner: the engine's own loop with no forward pass, and its cost benchmark."""

from __future__ import annotations

import pytest

from kvlab.engine.llm_engine import LLMEngine
from kvlab.engine.metrics import ManualClock
from kvlab.engine.model_free import ModelFreeRunner, bookkeeping_cache
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.measure.engine_overhead import PARTS, engine_overhead
from kvlab.sim.trace import make_trace


def run_trace(kind: str, **cache_kwargs) -> tuple[LLMEngine, dict[str, list[int]]]:
    trace = make_trace(30, "alpaca", arrival_rate=40.0, seed=3)
    cache = bookkeeping_cache(kind, **cache_kwargs)
    engine = LLMEngine(
        ModelFreeRunner(), cache, SchedulerConfig(max_num_seqs=8), clock=ManualClock(0.01)
    )
    for i in range(len(trace)):
        params = SamplingParams(temperature=0, max_tokens=trace.output_lens[i], ignore_eos=True)
        prompt = [1 + i] * trace.prompt_lens[i]
        engine.add_request(str(i), prompt, params, arrival_time=trace.arrival_s[i])
    finished = {}
    while engine.has_unfinished_requests():
        for output in engine.step():
            if output.finished:
                finished[output.request_id] = output.outputs[0].token_ids
    return engine, {
        "lens": [len(finished[str(i)]) for i in range(len(trace))],
        "expected": list(trace.output_lens),
    }


@pytest.mark.parametrize(
    "kind, cache_kwargs",
    [("paged", {"num_blocks": 400, "block_size": 4}), ("contiguous", {"num_slots": 600})],
)
def test_a_trace_replays_with_its_own_output_lengths(kind, cache_kwargs):
    engine, result = run_trace(kind, **cache_kwargs)
    assert result["lens"] == result["expected"]
    assert engine.cache.kv_caches == [] and engine.cache.usage().capacity_bytes == 0
    usage = engine.kv.usage()
    assert usage.num_reserved_slots == usage.num_used_slots == 0  # everything came back


def test_a_tight_paged_pool_preempts_and_still_finishes_every_request():
    engine, result = run_trace("paged", num_blocks=40, block_size=4)
    assert result["lens"] == result["expected"]
    assert engine.metrics.num_preemptions > 0


def test_final_only_requests_are_reported_once_finished():
    cache = bookkeeping_cache(num_blocks=16, block_size=4)
    engine = LLMEngine(ModelFreeRunner(), cache, clock=ManualClock(0.01))
    engine.add_request("streamed", [5] * 6, SamplingParams(temperature=0, max_tokens=3))
    final = SamplingParams(temperature=0, max_tokens=3, output_kind="final_only")
    engine.add_request("final", [6] * 6, final)
    reported = []
    while engine.has_unfinished_requests():
        reported.append(sorted((o.request_id, o.finished) for o in engine.step()))
    assert reported == [
        [("streamed", False)],
        [("streamed", False)],
        [("final", True), ("streamed", True)],
    ]
    with pytest.raises(ValueError, match="output_kind='delta'"):
        SamplingParams(output_kind="delta")


def test_the_overhead_benchmark_adds_up():
    per = engine_overhead(num_seqs=64, num_steps=4)
    assert set(per) == set(PARTS)
    assert all(per[part] > 0 for part in ("schedule", "metadata", "update", "total"))
    parts = per["schedule"] + per["metadata"] + per["update"] + per["rest"]
    assert parts == pytest.approx(per["total"])
