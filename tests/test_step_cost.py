"""The step-cost clock: what the engine says a step computed, what a step then costs, and
the fit that turns measured steps into a cost model.

The engine's ``StepWork`` is checked against counts done by hand; the fit against
coefficients it must recover exactly; the roofline against the datasheet arithmetic. How
well a calibration predicts real steps is measured, not asserted here (a timed test
fails on a busy machine): ``python -m kvlab.measure.step_cost`` and lab 04 print it.
"""

from __future__ import annotations

import pytest

import kvlab
from kvlab import LLM, SamplingParams
from kvlab.engine.step_cost import GPUS, LinearCost, Roofline, StepCostClock, StepWork
from kvlab.measure.replay import TraceRequests, replay
from kvlab.measure.step_cost import (
    calibrate,
    fit,
    median_error,
    median_steps,
    preemption_costs,
)
from kvlab.memory import preset

pytestmark = pytest.mark.usefixtures("one_thread")

COST = LinearCost(base=0.01, per_prefill_token=0.001, per_decode_seq=0.004, per_context_token=1e-5)


@pytest.fixture(scope="module")
def tiny_model():
    model, _ = kvlab.load_model("tiny", device="cpu")
    return model


def test_the_engine_reports_what_each_step_computed(tiny_model):
    llm = LLM(tiny_model, num_blocks=32, block_size=4, clock=StepCostClock(COST))
    engine = llm.engine
    engine.add_request("a", [1, 2, 3, 4, 5], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.add_request("b", [6, 7, 8], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.step()  # both prompts, whole
    assert engine.last_step_work == StepWork(
        num_prefill_tokens=8,
        num_decode_seqs=0,
        num_context_tokens=8,
        num_attention_pairs=5 * 6 // 2 + 3 * 4 // 2,
    )
    engine.step()  # one decode each: contexts of 6 and 4
    assert engine.last_step_work == StepWork(0, 2, 10, 10)
    times = [s.time for s in engine.metrics.steps]
    assert times == pytest.approx(
        [COST.seconds(StepWork(8, 0, 8, 21)), COST.seconds(StepWork(8, 0, 8, 21)) + 0.018 + 1e-4]
    )


def test_a_chunked_prefill_is_counted_chunk_by_chunk(tiny_model):
    llm = LLM(tiny_model, num_blocks=64, block_size=4, max_num_seqs=1, max_num_batched_tokens=4)
    engine = llm.engine
    engine.add_request("a", list(range(1, 11)), SamplingParams(max_tokens=1, ignore_eos=True))
    works = []
    while engine.has_unfinished_requests():
        engine.step()
        works.append(engine.last_step_work)
    assert [w.num_prefill_tokens for w in works] == [4, 4, 2]
    assert [w.num_context_tokens for w in works] == [4, 8, 10]
    # chunk of n after c computed: n * c + n (n + 1) / 2 query-key pairs
    assert [w.num_attention_pairs for w in works] == [10, 4 * 4 + 10, 2 * 8 + 3]


def test_the_step_cost_clock_needs_the_work_and_a_cost_model():
    clock = StepCostClock(COST, start=1.0)
    clock.tick(StepWork(num_prefill_tokens=10))
    assert clock.now() == pytest.approx(1.0 + 0.01 + 0.01)
    clock.advance_to(0.5)  # never backwards
    assert clock.now() == pytest.approx(1.02)
    with pytest.raises(ValueError, match="needs the step's StepWork"):
        clock.tick()
    with pytest.raises(ValueError, match="cost=3 is not allowed"):
        StepCostClock(3)


def test_the_fit_recovers_the_coefficients_of_noise_free_steps():
    works = [
        StepWork(p, d, c)
        for p, d, c in [
            (0, 1, 50),
            (0, 8, 400),
            (64, 2, 200),
            (256, 0, 256),
            (16, 12, 900),
            (0, 4, 120),
        ]
    ]
    fitted = fit([(w, COST.seconds(w)) for w in works], source="test")
    for name in ("base", "per_prefill_token", "per_decode_seq", "per_context_token"):
        assert getattr(fitted, name) == pytest.approx(getattr(COST, name), rel=1e-6)
    assert median_error(fitted, [(w, COST.seconds(w)) for w in works]) < 1e-9


def test_a_term_that_would_fit_negative_is_dropped():
    # Steps where context tokens make a step cheaper: least squares would give them a
    # negative cost; the fit drops that term and keeps every coefficient >= 0.
    works = [StepWork(0, d, c) for d, c in [(1, 900), (2, 600), (4, 300), (8, 100), (3, 50)]]
    samples = [(w, 0.01 + 0.004 * w.num_decode_seqs - 2e-6 * w.num_context_tokens) for w in works]
    fitted = fit(samples)
    assert fitted.per_context_token == 0.0
    assert min(fitted.base, fitted.per_prefill_token, fitted.per_decode_seq) >= 0.0
    with pytest.raises(ValueError, match="at least 4 steps"):
        fit(samples[:3])


def test_the_roofline_is_memory_bound_for_decode_and_compute_bound_for_a_long_prefill():
    spec = preset("llama-2-7b")
    a100 = Roofline.of(spec, "a100-40gb")
    weights = spec.num_params * spec.dtype_bytes
    one_decode = StepWork(num_decode_seqs=1, num_context_tokens=1000, num_attention_pairs=1000)
    expected = (weights + 1001 * spec.bytes_per_token) / GPUS["a100-40gb"].hbm_bytes_per_s
    assert a100.seconds(one_decode) == pytest.approx(expected)  # about 9 ms: the weights
    prefill = StepWork(
        num_prefill_tokens=2048, num_context_tokens=2048, num_attention_pairs=2048 * 2049 // 2
    )
    flops = 2 * spec.num_params * 2048 + 4 * 32 * 32 * 128 * (2048 * 2049 // 2)
    assert a100.seconds(prefill) == pytest.approx(flops / 312e12)
    assert Roofline.of(spec, "h200").seconds(one_decode) < a100.seconds(one_decode)
    swap = StepWork(num_decode_seqs=1, num_blocks_swapped=10)
    pcie = 10 * 16 * spec.bytes_per_token / GPUS["a100-40gb"].pcie_bytes_per_s
    assert a100.seconds(swap) == pytest.approx(a100.seconds(StepWork(num_decode_seqs=1)) + pcie)
    with pytest.raises(ValueError, match="gpu='tpu' is not allowed"):
        Roofline.of(spec, "tpu")


def test_a_calibration_is_cached_and_predicts_its_own_check_steps(tiny_model, tmp_path):
    first = calibrate(tiny_model, num_requests=6, cache_dir=tmp_path, progress=False)
    assert first.num_fit_steps >= 4 and first.num_check_steps == len(first.check) > 0
    assert first.median_error == pytest.approx(
        median_error_of(first.check)
    )  # the reported figure is the check steps' own median
    assert list(tmp_path.glob("*.json"))
    again = calibrate(tiny_model, num_requests=6, cache_dir=tmp_path, progress=False)
    assert again == first  # loaded, not measured again


def test_repeated_runs_give_each_step_its_median_time():
    a, b = StepWork(num_decode_seqs=1), StepWork(num_prefill_tokens=8)
    runs = [[(a, 0.010), (b, 0.050)], [(a, 0.090), (b, 0.020)], [(a, 0.011), (b, 0.021)]]
    assert median_steps(runs) == [(a, 0.011), (b, 0.021)]
    with pytest.raises(RuntimeError, match="took different steps"):
        median_steps([[(a, 0.01)], [(b, 0.01)]])


def median_error_of(pairs):
    errors = sorted(abs(p - m) / m for p, m in pairs)
    mid = len(errors) // 2
    return errors[mid] if len(errors) % 2 else (errors[mid - 1] + errors[mid]) / 2


def test_on_a_gpu_clock_chunked_prefill_trades_the_decodes_stall_for_the_long_ttft(tiny_model):
    # Lab 04's experiment: four decoding requests, then a 480-token prompt arrives.
    a100 = Roofline.of(preset("llama-2-7b"), "a100-40gb")
    prompts = [[5] * 24, [6] * 24, [7] * 24, [8] * 24, [9] * 480]
    requests = TraceRequests(prompts, [32, 32, 32, 32, 4], [0, 0, 0, 0, 0.05])
    runs = {}
    for budget in (512, 64):
        llm = LLM(
            tiny_model,
            num_blocks=128,
            block_size=16,
            max_num_seqs=8,
            max_num_batched_tokens=budget,
            clock=StepCostClock(a100),
            enable_prefix_caching=False,
        )
        runs[budget] = [o.metrics for o in replay(llm, requests).outputs]
    whole, chunked = runs[512], runs[64]
    prefill_step = a100.seconds(
        StepWork(480, 4, 480 + 4 * 30, 480 * 481 // 2 + 4 * 30)
    )  # about the step that prefills the long prompt beside the four decodes
    assert max(m.max_token_gap for m in whole[:4]) == pytest.approx(prefill_step, rel=0.05)
    assert max(m.max_token_gap for m in chunked[:4]) < 0.5 * prefill_step  # no stall
    assert chunked[4].ttft > 2 * whole[4].ttft  # the long prompt waits for its chunks


def test_swap_against_recompute_prices_the_copies_and_the_extra_prefill():
    linear = LinearCost(0.01, 0.001, 0.004, 0.0, per_block_swapped=0.002)
    (row,) = preemption_costs(linear, [40], num_decodes=4, decode_context=10, block_size=16)
    assert row.swap_s == pytest.approx(2 * 3 * 0.002)  # 3 blocks out, then back in
    assert row.recompute_s == pytest.approx(40 * 0.001)  # 40 prefill tokens more
    assert row.cheaper == "swap"
    # On an A100 a short sequence's recompute hides under the weights' read; a long one's
    # arithmetic outgrows the PCIe copies of its blocks.
    a100 = Roofline.of(preset("llama-2-7b"), "a100-40gb")
    short, long = preemption_costs(a100, [128, 4000])
    assert short.recompute_s < 0.1 * short.swap_s and short.cheaper == "recompute"
    assert long.cheaper == "swap"


def test_a_transfer_latency_makes_small_blocks_slow_to_swap():
    llama = preset("llama-2-7b")
    bytes_only = Roofline.of(llama, "a100-40gb", block_size=16)
    with_latency = Roofline.of(llama, "a100-40gb", block_size=16, transfer_latency_s=5e-6)
    work = StepWork(num_blocks_swapped=10)
    extra = with_latency.seconds(work) - bytes_only.seconds(work)
    assert extra == pytest.approx(10 * 2 * llama.num_layers * 5e-6)  # K and V, every layer
    # Bytes alone do not depend on the block size; with a cost per transfer, the same 2,048
    # tokens swap far slower in blocks of 4 than of 256, while recompute stays the same.
    rows = {
        bs: preemption_costs(Roofline.of(llama, "a100-40gb", bs, 5e-6), [2048])[0]
        for bs in (4, 256)
    }
    assert rows[4].swap_s > 3 * rows[256].swap_s
    assert rows[4].recompute_s == pytest.approx(rows[256].recompute_s)
    assert (rows[4].cheaper, rows[256].cheaper) == ("recompute", "swap")
    with pytest.raises(ValueError, match="transfer_latency_s=-1 is not allowed"):
        Roofline.of(llama, "h100", transfer_latency_s=-1)


def test_a_prefetch_costs_only_the_copy_time_the_step_compute_does_not_cover():
    spec = preset("llama-2-7b")
    a100 = Roofline.of(spec, "a100-40gb")
    decode = StepWork(num_decode_seqs=4, num_context_tokens=400)
    compute = a100.seconds(decode)  # about 9 ms: reading the weights
    per_block = 16 * spec.bytes_per_token / GPUS["a100-40gb"].pcie_bytes_per_s
    few = StepWork(num_decode_seqs=4, num_context_tokens=400, num_blocks_prefetched=10)
    assert 10 * per_block < compute and a100.seconds(few) == pytest.approx(compute)  # hidden
    many = StepWork(num_decode_seqs=4, num_context_tokens=400, num_blocks_prefetched=100)
    assert a100.seconds(many) == pytest.approx(100 * per_block)  # the copy outlasts the step
    waited = StepWork(num_decode_seqs=4, num_context_tokens=400, num_blocks_swapped=10)
    assert a100.seconds(waited) == pytest.approx(compute + 10 * per_block)
    # A cost fitted on a CPU has no side stream: a prefetched block costs a swapped one.
    cpu = LinearCost(0.01, 0.001, 0.004, 0.0, per_block_swapped=0.002)
    gpu = LinearCost(0.01, 0.001, 0.004, 0.0, per_block_swapped=0.002, overlaps_prefetch=True)
    work = StepWork(num_decode_seqs=2, num_blocks_prefetched=3)
    assert cpu.seconds(work) == pytest.approx(0.018 + 0.006)
    assert gpu.seconds(work) == pytest.approx(0.018)
    assert gpu.seconds(StepWork(num_blocks_prefetched=10)) == pytest.approx(0.02)  # 0.01 + 0.01
