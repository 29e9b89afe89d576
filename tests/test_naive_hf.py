"""Lab 01's measurements of Hugging Face caching, checked against their oracles.

Generated tokens must equal ``model.generate``'s; cache bytes counted from the real tensors
must equal ``KVSpec``'s formula; a batch's padding account must match the cache's shape.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from conftest import random_prompts
from transformers import GenerationConfig

from kvlab.measure import naive_hf
from kvlab.measure.naive_hf import (
    DecodeTrace,
    activation_bytes,
    cache_bytes,
    cache_layer_shapes,
    decode_with_cache,
    decode_without_cache,
    fit_no_cache_steps,
    memory_breakdown,
    no_cache_seconds,
    positions_computed,
    step_costs,
    time_weight_reads,
    time_without_cache,
    weight_bytes,
    what_grew,
)
from kvlab.measure.padded_batch import (
    FINISHED_PAD,
    GENERATED,
    LEFT_PAD,
    PROMPT,
    generate_padded,
    padded_cache_slots,
)
from kvlab.memory import KVSpec, preset

NEW_TOKENS = 12


def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    out = model.generate(torch.tensor([prompt]), generation_config=config)
    return out[0, len(prompt) :].tolist()


def test_decode_with_cache_matches_generate(tiny):
    prompt = random_prompts(tiny.config.vocab_size, [9])[0]
    trace = decode_with_cache(tiny, prompt, NEW_TOKENS)
    assert trace.generated == hf_greedy(tiny, prompt, NEW_TOKENS)
    assert trace.token_ids[: len(prompt)] == prompt
    assert len(trace.step_seconds) == NEW_TOKENS
    assert all(seconds > 0 for seconds in trace.step_seconds)


def test_decode_stops_after_eos(tiny):
    prompt = random_prompts(tiny.config.vocab_size, [9])[0]
    free_run = decode_with_cache(tiny, prompt, NEW_TOKENS).generated
    eos = free_run[3]
    stopped = decode_with_cache(tiny, prompt, NEW_TOKENS, eos_token_id=eos).generated
    assert stopped == free_run[: free_run.index(eos) + 1]


def test_cache_bytes_follow_the_formula(tiny):
    """After step i the cache holds prompt + i tokens, at KVSpec.bytes_per_token each."""
    prompt = random_prompts(tiny.config.vocab_size, [9])[0]
    trace = decode_with_cache(tiny, prompt, NEW_TOKENS)
    spec = KVSpec.from_config(tiny.config, dtype=tiny.dtype)
    assert trace.cache_lens == list(range(len(prompt), len(prompt) + NEW_TOKENS))
    assert trace.cache_bytes == [spec.bytes_for(n) for n in trace.cache_lens]
    assert cache_bytes(trace.cache) == trace.cache_bytes[-1]
    shapes = cache_layer_shapes(trace.cache)
    expected = (1, spec.num_kv_heads, trace.cache_lens[-1], spec.head_dim)
    assert shapes == [(expected, expected)] * spec.num_layers


def test_without_cache_predicts_the_same_tokens(tiny):
    """Recomputing the whole prefix gives the token the cached run produced."""
    prompt = random_prompts(tiny.config.vocab_size, [5])[0]
    trace = decode_with_cache(tiny, prompt, NEW_TOKENS)
    lengths = [5, 8, 16]
    steps = time_without_cache(tiny, trace.token_ids, lengths, repeats=2)
    assert [s.context_len for s in steps] == lengths
    assert [s.next_token for s in steps] == [trace.token_ids[n] for n in lengths]
    assert all(s.seconds > 0 for s in steps)
    with pytest.raises(ValueError, match="context length"):
        time_without_cache(tiny, trace.token_ids, [len(trace.token_ids) + 1])


def test_decode_without_cache_gives_the_cached_runs_tokens(tiny):
    """The oracle of lab 01's section 1: a cache changes the work, not the tokens."""
    prompt = random_prompts(tiny.config.vocab_size, [6])[0]
    cached = decode_with_cache(tiny, prompt, NEW_TOKENS, repeats=1).generated
    assert decode_without_cache(tiny, prompt, NEW_TOKENS) == cached
    eos = cached[4]
    assert decode_without_cache(tiny, prompt, NEW_TOKENS, eos) == cached[: cached.index(eos) + 1]
    with pytest.raises(ValueError, match="num_new_tokens"):
        decode_without_cache(tiny, prompt, 0)


def test_decode_rejects_no_tokens(tiny):
    with pytest.raises(ValueError, match="num_new_tokens"):
        decode_with_cache(tiny, [1, 2, 3], 0)
    with pytest.raises(ValueError, match="repeats"):
        decode_with_cache(tiny, [1, 2, 3], 2, repeats=0)
    with pytest.raises(ValueError, match="repeats"):
        time_without_cache(tiny, [1, 2, 3], [2], repeats=0)
    with pytest.raises(ValueError, match="repeats"):
        time_weight_reads(tiny, repeats=0)
    assert time_weight_reads(tiny, repeats=1) > 0


def test_decode_reports_the_median_of_its_runs(tiny, monkeypatch):
    """Each step's time is the median of its runs, not the fastest run nor the last."""
    prompt = random_prompts(tiny.config.vocab_size, [5])[0]
    real = naive_hf._decode_once(tiny, prompt, 3, None)
    runs = iter([[0.9, 0.2, 0.1], [0.1, 0.3, 0.7], [0.2, 0.1, 0.4]])  # one list per run
    monkeypatch.setattr(
        naive_hf, "_decode_once", lambda *args: replace(real, step_seconds=next(runs))
    )
    trace = decode_with_cache(tiny, prompt, 3, repeats=3)
    assert trace.step_seconds == [0.2, 0.2, 0.4]
    assert trace.repeats == 3
    assert trace.token_ids == real.token_ids


def test_time_without_cache_reports_the_median(tiny, monkeypatch):
    ticks = iter([0.0, 0.5, 1.0, 1.1, 2.0, 2.3])  # (start, end) of three runs: 0.5, 0.1, 0.3 s
    monkeypatch.setattr(naive_hf, "time", SimpleNamespace(perf_counter=lambda: next(ticks)))
    [step] = time_without_cache(tiny, [5, 6, 7, 8], [3], repeats=3)
    assert step.seconds == pytest.approx(0.3)


def test_positions_computed_by_hand():
    # A 4-token prompt, 3 new tokens: with a cache 4, then +1, +1; without, 4, then +5, +6.
    assert positions_computed(4, 3) == ([4, 5, 6], [4, 9, 15])
    with_cache, without_cache = positions_computed(41, 96)
    assert (with_cache[-1], without_cache[-1]) == (136, 8496)  # lab 01's run
    with pytest.raises(ValueError, match="prompt"):
        positions_computed(0, 3)


def test_no_cache_seconds_interpolates_between_timed_steps():
    steps = [
        naive_hf.NoCacheStep(20, 0.3, 7),
        naive_hf.NoCacheStep(10, 0.1, 5),  # in any order
    ]
    assert no_cache_seconds(steps, [10, 15, 20]) == pytest.approx([0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="outside the timed 10..20"):
        no_cache_seconds(steps, [21])


def test_fit_no_cache_steps_goes_through_every_point():
    steps = [naive_hf.NoCacheStep(n, 0.1 + 0.002 * n, 0) for n in (10, 30, 20)]
    fit = fit_no_cache_steps(steps)
    assert (fit.seconds_per_token, fit.seconds_at_zero) == pytest.approx((0.002, 0.1))
    assert fit.num_points == 3
    assert fit.seconds_at(50) == pytest.approx(0.2)
    # One slow point moves the line less than it moves a slope from the two end points.
    jumpy = [*steps, naive_hf.NoCacheStep(40, 0.5, 0)]
    ends = (0.5 - 0.12) / 30
    assert fit_no_cache_steps(jumpy).seconds_per_token < ends
    with pytest.raises(ValueError, match="two or more context lengths"):
        fit_no_cache_steps(steps[:1])


def test_step_costs_by_hand():
    # A 3-token prompt, 3 steps: with a cache 3 + 1 + 1 = 5 positions, without 3 + 4 + 5 = 12.
    run = DecodeTrace(
        token_ids=[1, 2, 3, 4, 5, 6],
        num_prompt_tokens=3,
        step_seconds=[0.3, 0.1, 0.2],
        cache_lens=[3, 4, 5],
        cache_bytes=[3, 4, 5],
        cache=None,
    )
    no_cache = [naive_hf.NoCacheStep(5, 0.5, 6), naive_hf.NoCacheStep(3, 0.3, 4)]
    costs = step_costs(run, no_cache, [0.3, 0.4, 0.5], weight_read_seconds=0.09)
    assert (costs.positions_with, costs.positions_without) == (5, 12)
    assert (costs.seconds_with, costs.seconds_without) == pytest.approx((0.6, 1.2))
    assert costs.time_ratio == pytest.approx(2.0)
    assert costs.cached_step_seconds == pytest.approx(0.15)  # the prefill left out
    assert costs.shortest.context_len == 3
    assert costs.fit.seconds_per_token == pytest.approx(0.1)
    table = str(costs)
    assert "token positions computed" in table and "1.2 s (estimated)" in table
    assert "a no-cache step of 3 tokens" in table and "100.0 ms" in table
    assert "one token times every weight matrix" in table and "90.0 ms" in table
    with pytest.raises(ValueError, match="one no-cache time per step"):
        step_costs(run, no_cache, [0.3], weight_read_seconds=0.09)


def test_what_grew():
    assert what_grew(weights=(5, 5), kv_cache=(1, 2)) == "KV cache"
    assert what_grew(weights=(5, 6), kv_cache=(1, 2)) == "both"
    assert what_grew(weights=(5, 6), kv_cache=(2, 2)) == "weights"
    assert what_grew(weights=(5, 5), kv_cache=(2, 2)) == "neither"


def test_padded_batch_account_matches_the_cache(tiny):
    prompts = random_prompts(tiny.config.vocab_size, [3, 11, 7], seed=1)
    free_runs = [hf_greedy(tiny, p, NEW_TOKENS) for p in prompts]
    eos = free_runs[0][2]  # makes at least one answer end early
    batch = generate_padded(tiny, prompts, NEW_TOKENS, eos_token_id=eos, pad_token_id=0)

    # Oracle: each answer is what the request generates alone, cut after EOS.
    for output, free_run in zip(batch.outputs, free_runs, strict=True):
        expected = free_run[: free_run.index(eos) + 1] if eos in free_run else free_run
        assert output == expected
    assert min(batch.output_lens) < max(batch.output_lens)

    spec = KVSpec.from_config(tiny.config, dtype=tiny.dtype)
    seq_len = max(batch.prompt_lens) + max(batch.output_lens) - 1
    assert batch.cache_shape == (3, spec.num_kv_heads, seq_len, spec.head_dim)
    assert batch.cache_bytes == batch.num_slots * spec.bytes_per_token
    assert batch.num_slots == 3 * seq_len

    kinds = batch.slot_kinds()
    assert [len(row) for row in kinds] == [seq_len] * 3
    flat = [kind for row in kinds for kind in row]
    assert flat.count(PROMPT) == sum(batch.prompt_lens)
    assert flat.count(PROMPT) + flat.count(GENERATED) == batch.num_real_tokens
    assert flat.count(LEFT_PAD) + flat.count(FINISHED_PAD) == batch.num_slots - (
        batch.num_real_tokens
    )
    assert batch.waste == pytest.approx(1 - batch.num_real_tokens / batch.num_slots)

    # Step by step: the prefill holds the padded prompts, each step adds one position a row.
    assert batch.num_steps == max(batch.output_lens)
    for step in range(batch.num_steps):
        rows = batch.slot_kinds(after_step=step)
        assert [len(row) for row in rows] == [max(batch.prompt_lens) + step] * 3
        assert all(final[: len(row)] == row for row, final in zip(rows, kinds, strict=True))
    assert batch.slot_kinds(after_step=batch.num_steps - 1) == kinds
    with pytest.raises(ValueError, match="after_step"):
        batch.slot_kinds(after_step=batch.num_steps)
    padding = batch.padding_per_request()
    assert sum(left + after for left, after in padding) == batch.num_slots - batch.num_real_tokens
    assert [left for left, _ in padding] == [max(batch.prompt_lens) - p for p in batch.prompt_lens]


def test_padded_cache_slots_by_hand():
    # Rows of 40 + 50 - 1 = 89 positions; requests need 61, 45 and 44.
    assert padded_cache_slots([12, 40, 25], [50, 6, 20]) == (3 * 89, 61 + 45 + 44)
    assert padded_cache_slots([5], [1]) == (5, 5)
    with pytest.raises(ValueError):
        padded_cache_slots([3, 4], [1])
    with pytest.raises(ValueError):
        padded_cache_slots([0], [2])


def test_activation_bytes_by_hand(tiny):
    # tiny: hidden 64, 4 heads of 16, 2 KV heads, intermediate 128, vocab 256.
    per_token = 2 * 64 + (2 * 4 + 2 * 2) * 16 + 3 * 128
    decode = (3 * per_token + 4 * 3 * 10 + 3 * 256) * 4
    assert activation_bytes(tiny.config, batch_size=3, context_len=10, dtype_bytes=4) == decode
    prefill = (2 * 10 * per_token + 4 * 20 * 10 + 2 * 256) * 2
    assert activation_bytes(tiny.config, 2, 10, 2, num_new_tokens=10) == prefill


def test_memory_breakdown(tiny):
    spec = KVSpec.from_config(tiny.config, dtype=tiny.dtype)
    breakdown = memory_breakdown(tiny, batch_size=4, seq_len=100)
    # KVSpec counts the weights from the config alone, Qwen2's q/k/v biases included.
    assert breakdown.weight_bytes == spec.weight_bytes
    assert breakdown.kv_bytes == spec.bytes_for(400)
    assert breakdown.total_bytes == (
        breakdown.weight_bytes + breakdown.kv_bytes + breakdown.activation_bytes
    )


def test_smollm2_dynamic_cache_bytes_per_token(smollm2):
    """The real model's DynamicCache holds 46080 bytes per token, as the formula says."""
    model, tokenizer = smollm2
    prompt = tokenizer("The KV cache stores keys and values so that")["input_ids"]
    trace = decode_with_cache(model, prompt, 3)
    measured = cache_bytes(trace.cache) / trace.cache.get_seq_length()
    assert measured == KVSpec.from_config(model.config).bytes_per_token == 46080
    assert weight_bytes(model) == preset("smollm2-135m").weight_bytes
