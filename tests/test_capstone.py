"""The capstone's measurements against their oracles: both KV caches give the tokens of
Hugging Face's one-at-a-time ``generate``; a contiguous budget of N reservations runs at
most N requests at once while a paged one runs them all; the padded-batch memory count
equals the positions of the real ``DynamicCache``; transformers' continuous batching gives
the same tokens, and the steps read from its timestamps are the steps it ran; interleaved
rounds rotate and their table reports medians, spreads and round-by-round ratios; at A100
scale the servers are the simulator's own replays, on traces of a fixed duration.
"""

from __future__ import annotations

import pytest
import torch

from kvlab.engine.step_cost import LinearCost
from kvlab.measure import capstone
from kvlab.measure.bench import make_workload, mismatches, run_hf_one_at_a_time
from kvlab.measure.capstone import (
    clock_split,
    hf_peak_kv_slots,
    interleaved,
    median_seconds,
    median_speedup,
    median_step_seconds,
    rate_table,
    run_engine,
    run_generate_batch,
    steps_from_timestamps,
    time_weight_matmuls,
    timing_table,
    vllm_timed,
)
from kvlab.measure.padded_batch import left_pad
from kvlab.measure.vllm_runner import VLLMUnavailable
from kvlab.measure.workload import Result
from kvlab.model.linear import fused_weights

BLOCK_SIZE = 16
MAX_MODEL_LEN = 64  # every request of the workload below fits in one 64-slot reservation


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def workload():
    work = make_workload(6, 256, max_prompt_len=40, max_tokens=12, seed=1)
    assert max(len(p) + n for p, n in zip(work.prompts, work.output_lens, strict=True)) <= 64
    return work


@pytest.mark.parametrize("kv_cache", ["paged", "contiguous"])
def test_both_caches_match_hf_one_at_a_time(tiny, workload, kv_cache):
    run = run_engine(
        tiny,
        workload,
        kv_cache=kv_cache,
        num_blocks=32,
        block_size=BLOCK_SIZE,
        max_num_seqs=8,
        max_model_len=MAX_MODEL_LEN,
    )
    reference = run_hf_one_at_a_time(tiny, workload)
    assert mismatches([run.result], reference) == []
    assert run.result.name == f"kvlab-{kv_cache}"
    assert [len(t) for t in run.result.outputs] == workload.output_lens
    assert 0 < run.result.kv_utilization <= 1
    assert 0 < run.kv_usage_peak <= 1
    assert run.num_preemptions == 0
    durations = run.step_seconds()
    assert len(durations) == run.num_steps - 1
    assert all(n >= 1 and seconds >= 0 for n, seconds in durations)
    decodes = run.decode_step_seconds()
    assert 0 < len(decodes) <= len(durations)
    assert all(1 <= n <= 8 and seconds >= 0 for n, seconds in decodes)


def test_contiguous_reservations_cap_concurrency_paged_does_not(tiny, workload):
    # 8 blocks = 128 slots: two reservations of max_model_len=64, or every paged request.
    settings = dict(num_blocks=8, block_size=BLOCK_SIZE, max_num_seqs=8)
    contiguous = run_engine(
        tiny, workload, kv_cache="contiguous", max_model_len=MAX_MODEL_LEN, **settings
    )
    pairs = zip(workload.prompts, workload.output_lens, strict=True)
    needed = sum(-(-(len(p) + n) // BLOCK_SIZE) for p, n in pairs)
    paged = run_engine(tiny, workload, kv_cache="paged", **(settings | {"num_blocks": needed}))
    assert contiguous.peak_running == 2
    assert paged.peak_running == len(workload.prompts)
    assert contiguous.num_steps > paged.num_steps
    assert contiguous.result.outputs == paged.result.outputs
    assert contiguous.result.kv_utilization < paged.result.kv_utilization


def test_clock_split_prices_steps_prompt_tokens_and_decodes(tiny, workload):
    run = run_engine(tiny, workload, num_blocks=32, block_size=BLOCK_SIZE, max_num_seqs=8)
    prompt_tokens = sum(len(p) for p in workload.prompts)
    decodes = workload.num_output_tokens - len(workload.prompts)  # the first token ends a prefill
    cost = LinearCost(base=0.5, per_prefill_token=0.01, per_decode_seq=0.1, per_context_token=0.0)
    row = clock_split([run], cost).splitlines()[1].split()
    assert row[:2] == ["kvlab-paged", str(run.num_steps)]
    assert row[2] == f"{0.5 * run.num_steps:.2f}s"
    assert row[3:6] == [str(prompt_tokens), "->", f"{0.01 * prompt_tokens:.2f}s"]
    assert row[6:9] == [str(decodes), "->", f"{0.1 * decodes:.2f}s"]
    clock = 0.5 * run.num_steps + 0.01 * prompt_tokens + 0.1 * decodes
    # Beside a measured time given for it: the clock's error on that run.
    row = clock_split([run], cost, measured={"kvlab-paged": 2 * clock}).splitlines()[1].split()
    assert row[-2:] == [f"{2 * clock:.2f}s", "-50%"]


def test_median_step_seconds_groups_steps_by_width():
    steps = [(1, 0.05), (3, 0.07), (1, 0.06), (3, 0.09), (1, 0.04)]
    assert median_step_seconds(steps) == {1: 0.05, 3: pytest.approx(0.08)}


def test_hf_peak_kv_slots_counts_the_dynamic_cache(tiny, workload):
    # The real DynamicCache of one padded batch holds exactly the counted positions.
    from transformers import GenerationConfig

    prompts, lens = workload.prompts[:3], workload.output_lens[:3]
    steps = max(lens)
    ids, mask = left_pad(prompts)
    config = GenerationConfig(
        max_new_tokens=steps, min_new_tokens=steps, do_sample=False, pad_token_id=0
    )
    out = tiny.generate(
        ids, attention_mask=mask, generation_config=config, return_dict_in_generate=True
    )
    held = out.past_key_values.get_seq_length() * len(prompts)
    sub = type(workload)(prompts, lens)
    assert hf_peak_kv_slots(sub, batch_size=3) == held
    assert hf_peak_kv_slots(sub, batch_size=1) == max(
        len(p) + n - 1 for p, n in zip(prompts, lens, strict=True)
    )


def test_hf_peak_kv_slots_refuses_an_empty_batch(workload):
    with pytest.raises(ValueError, match="batch_size=0"):
        hf_peak_kv_slots(workload, 0)


def test_hf_padded_batches_match_hf_one_at_a_time(tiny, workload):
    """The benchmark's padded-batch baseline produces the same greedy tokens."""
    from kvlab.measure.bench import run_hf_one_at_a_time, run_hf_static_padded

    padded = run_hf_static_padded(tiny, workload, batch_size=4)
    assert padded.outputs == run_hf_one_at_a_time(tiny, workload).outputs
    assert 0 < padded.kv_utilization < 1  # padding and finished rows waste slots


def test_hf_baselines_ignore_eos_as_kvlab_and_vllm_do():
    """Where EOS is the greedy choice, every HF baseline generates it and goes on, like
    ``ignore_eos`` (``min_new_tokens`` would forbid it and pick another token)."""
    import copy

    import torch

    from kvlab.engine.llm import LLM
    from kvlab.measure.bench import (
        Workload,
        run_hf_one_at_a_time,
        run_hf_static_padded,
        timed_generate,
    )
    from kvlab.model.loading import load_model

    model = copy.deepcopy(load_model("tiny", device="cpu")[0])  # its EOS id is 2
    eos = model.generation_config.eos_token_id
    with torch.no_grad():
        model.lm_head.weight[eos] *= 10  # EOS becomes the greedy choice after a few tokens
    workload = Workload([list(range(3, 12)), list(range(30, 37))], [12, 12])
    _, ours = timed_generate(LLM(model, num_blocks=32, block_size=4), workload)
    assert any(eos in tokens for tokens in ours)
    assert run_hf_one_at_a_time(model, workload).outputs == ours
    assert run_hf_static_padded(model, workload, batch_size=2).outputs == ours


@pytest.mark.parametrize("num_rows", [1, 12])
def test_both_ways_of_holding_the_weights_compute_the_same_products(tiny, num_rows):
    """What time_weight_matmuls times: the same matrix products, in the same order."""
    weights = fused_weights(tiny)
    with torch.inference_mode():
        hf = capstone._hf_matmuls(tiny, weights, num_rows)
        ours = capstone._kvlab_matmuls(tiny, weights, num_rows)
    assert len(hf) == len(ours) == 7 * tiny.config.num_hidden_layers + 1
    for theirs, mine in zip(hf, ours, strict=True):
        torch.testing.assert_close(mine, theirs, rtol=1e-4, atol=1e-4)
    times = time_weight_matmuls(tiny, num_rows, repeats=2)
    assert times.num_rows == num_rows
    assert times.hf_seconds > 0 and times.kvlab_seconds > 0


def test_time_weight_matmuls_refuses_no_rows(tiny):
    with pytest.raises(ValueError, match="num_rows"):
        time_weight_matmuls(tiny, 0)


@pytest.mark.parametrize(
    ("num_blocks", "max_num_seqs", "waves"),
    [(32, 8, 1), (8, 2, 3)],  # room for all six at once; two seats: three waves of two
)
def test_generate_batch_matches_and_reports_what_it_batched(
    tiny, workload, num_blocks, max_num_seqs, waves
):
    run = run_generate_batch(
        tiny,
        workload,
        num_blocks=num_blocks,
        block_size=BLOCK_SIZE,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=512,
    )
    assert mismatches([run.result], run_hf_one_at_a_time(tiny, workload)) == []
    assert run.result.name == "hf-generate-batch"
    assert sum(run.step_sizes) == workload.num_output_tokens
    assert run.peak_running == min(max_num_seqs, len(workload.prompts))
    assert run.num_steps == waves * max(workload.output_lens)  # every output is 12 tokens
    assert run.result.note == f"up to {run.peak_running} at once"


def test_steps_from_timestamps_groups_the_tokens_of_one_step():
    # Three requests: r0 and r1 from the first step (0.0 s), r2 joins in the third; a step
    # lasts about 0.1 s and hands out its tokens microseconds apart.
    stamps = [
        [0.000, 0.100, 0.200],
        [0.00001, 0.10001],
        [0.20002, 0.30001],
    ]
    assert steps_from_timestamps(stamps) == (2, 2, 2, 1)
    assert steps_from_timestamps([]) == ()
    assert steps_from_timestamps([[0.5]]) == (1,)


def test_steps_from_timestamps_never_gives_one_request_two_tokens_in_a_step():
    # Steps far apart for one request but close for the whole run: the second token of
    # r0 starts a new step even though the gap is under the threshold.
    assert steps_from_timestamps([[0.0, 0.001], [0.0005]], fraction=10.0) == (2, 1)


def test_interleaved_rotates_the_order_every_round():
    calls = []
    methods = {name: (lambda name=name: calls.append(name) or name) for name in "abc"}
    runs = interleaved(methods, rounds=4)
    assert calls == list("abc" + "bca" + "cab" + "abc")
    assert runs == {"a": ["a"] * 4, "b": ["b"] * 4, "c": ["c"] * 4}
    with pytest.raises(ValueError, match="rounds"):
        interleaved(methods, rounds=0)


def test_timing_table_reports_medians_spreads_and_round_by_round_ratios():
    def result(name, seconds):
        return Result(name, seconds, [[1]], 1.0)

    runs = {
        "hf-one-at-a-time": [result("hf-one-at-a-time", s) for s in (10.0, 12.0, 30.0)],
        "kvlab-paged": [result("kvlab-paged", s) for s in (2.0, 3.0, 5.0)],
    }
    passes = {"hf-one-at-a-time": 60, "kvlab-paged": 6}
    table = timing_table(runs, 60, passes, notes={"kvlab-paged": "up to 6 at once"})
    rows = [line.split() for line in table.splitlines()[2:]]
    assert rows[0][:6] == ["hf-one-at-a-time", "12.00", "10.00-30.00", "60", "200", "5.0"]
    # Each round's ratio (5.0, 4.0, 6.0): the median and the range, not 12 / 3.
    assert rows[1][:6] == ["kvlab-paged", "3.00", "2.00-5.00", "6", "500", "20.0"]
    assert rows[1][6:8] == ["5.0x", "(4.0-6.0)"]
    assert table.splitlines()[3].endswith("up to 6 at once")
    assert median_seconds(runs) == {"hf-one-at-a-time": 12.0, "kvlab-paged": 3.0}
    assert median_speedup(runs, "kvlab-paged", "hf-one-at-a-time") == 5.0
    with pytest.raises(ValueError, match="baseline"):
        timing_table(runs, 60, passes={}, baseline="vllm")


def test_rate_table_sets_each_engine_beside_the_baseline():
    table = rate_table({"hf": [10.0, 20.0, 5.0], "vLLM": [1.0, 2.0]}, 100, baseline="hf")
    rows = [line.split() for line in table.splitlines()[1:]]
    assert rows[0] == ["hf", "10.0", "5.0-20.0", "3", "1.0x"]
    assert rows[1] == ["vLLM", "66.7", "50.0-100.0", "2", "6.7x"]


def test_vllm_timed_says_how_to_build_a_missing_side_environment(monkeypatch, workload):
    monkeypatch.setenv("KVLAB_VLLM_PYTHON", "/nonexistent/python")
    with pytest.raises(VLLMUnavailable, match="make vllm-env"):
        vllm_timed(workload, max_num_seqs=4, max_num_batched_tokens=256)


def test_bench_prints_the_floor_under_kvlab_against_generate_batch(capsys):
    """``bench --matmul-floor``: the table, token-identical runs, then the profiled run's
    multiplies and what an engine doing only them would serve against generate_batch."""
    import re

    from kvlab.measure import bench

    skip = ["hf-one-at-a-time", "hf-static-padded", "kvlab-static", "kvlab-dynamic"]
    bench.main(["--model", "tiny", "--num-requests", "3", "--max-tokens", "4",
                "--max-prompt-len", "16", "--matmul-floor", "--skip", *skip])  # fmt: skip
    printed = capsys.readouterr().out
    assert "token-identical across all" in printed
    floor = re.search(r"multiplies alone: ([\d.]+) s of a ([\d.]+) s run .* would be ([\d.]+)x "
                      r"hf-generate-batch", printed)  # fmt: skip
    assert floor and float(floor.group(1)) <= float(floor.group(2))  # tiny: milliseconds
    assert float(floor.group(3)) > 0
