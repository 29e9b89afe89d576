"""kvlab's own forward pass against the oracle: Hugging Face transformers.

Logits must match in float32, and greedy generation must be token-identical to
``model.generate`` for single prompts and for batches of prompts of different lengths.
"""

from __future__ import annotations

import pytest
import torch
from conftest import random_prompts
from transformers import GenerationConfig

import kvlab
from kvlab.attention import cpu_kernel
from kvlab.cache.base import ForwardBatch
from kvlab.cache.contiguous import ContiguousKVCache
from kvlab.cache.naive import NaiveKVCache
from kvlab.cache.paged import PagedKVCache
from kvlab.measure.padded_batch import left_pad
from kvlab.model.greedy import greedy_generate
from kvlab.model.loading import chat_prompt
from kvlab.model.runner import ModelRunner

NEW_TOKENS = 64


def naive_cache(runner: ModelRunner) -> NaiveKVCache:
    return NaiveKVCache(runner.config.num_hidden_layers, runner.num_kv_heads, runner.head_dim)


def hf_greedy_batch(model, prompts, max_new_tokens, eos_token_id=None) -> list[list[int]]:
    """HF ``generate`` on left-padded prompts (pad id 0, masked out); output cut after EOS."""
    ids, mask = left_pad(prompts)
    width = ids.shape[1]
    config = GenerationConfig(
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=eos_token_id, pad_token_id=0
    )
    out = model.generate(ids, attention_mask=mask, generation_config=config)
    return [_cut_after(row, eos_token_id) for row in out[:, width:].tolist()]


def hf_greedy(model, prompt, max_new_tokens, eos_token_id=None) -> list[int]:
    return hf_greedy_batch(model, [prompt], max_new_tokens, eos_token_id)[0]


def _cut_after(tokens: list[int], eos_token_id: int | None) -> list[int]:
    if eos_token_id is not None and eos_token_id in tokens:
        return tokens[: tokens.index(eos_token_id) + 1]
    return tokens


def check_logits(model, prompt: list[int], atol: float):
    runner = ModelRunner(model)
    cache = naive_cache(runner)
    cache.allocate_slots(0, len(prompt))
    ours = runner.forward(torch.tensor(prompt), ForwardBatch.build([0], [0], [len(prompt)]), cache)
    with torch.no_grad():
        theirs = model(torch.tensor([prompt])).logits[0, -1]
    torch.testing.assert_close(ours[0], theirs, atol=atol, rtol=1e-4)


def test_tiny_logits_match_transformers(tiny):
    check_logits(tiny, random_prompts(tiny.config.vocab_size, [23])[0], atol=1e-5)


def test_tiny_greedy_matches_generate(tiny):
    prompts = random_prompts(tiny.config.vocab_size, [1, 7, 30])
    runner = ModelRunner(tiny)
    ours = greedy_generate(runner, naive_cache(runner), prompts, NEW_TOKENS)
    assert ours == [hf_greedy(tiny, p, NEW_TOKENS) for p in prompts]
    assert ours == hf_greedy_batch(tiny, prompts, NEW_TOKENS)


def test_decode_after_prefill_matches_full_recompute(tiny):
    """Logits of a decode step equal those of running the whole sequence from scratch."""
    prompt = random_prompts(tiny.config.vocab_size, [12])[0]
    runner = ModelRunner(tiny)
    cache = naive_cache(runner)
    cache.allocate_slots(0, 11)
    runner.forward(torch.tensor(prompt[:11]), ForwardBatch.build([0], [0], [11]), cache)
    cache.allocate_slots(0, 1)
    step = runner.forward(torch.tensor(prompt[11:]), ForwardBatch.build([0], [11], [1]), cache)
    fresh = naive_cache(runner)
    fresh.allocate_slots(0, 12)
    full = runner.forward(torch.tensor(prompt), ForwardBatch.build([0], [0], [12]), fresh)
    torch.testing.assert_close(step, full, atol=1e-5, rtol=1e-5)


def test_smollm2_logits_match_transformers(smollm2):
    model, tokenizer = smollm2
    prompt = tokenizer("The KV cache stores keys and values so that")["input_ids"]
    check_logits(model, prompt, atol=2e-4)


SMOLLM2_QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about memory.",
    "Explain in two sentences why the sky is blue to a child who asks.",
]
SMOLLM2_TEXTS = [
    "Once upon a time, in a small village by the sea,",
    "The three most important ideas in computer science are",
]


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batch"])
def test_smollm2_chat_answers_match_generate(smollm2, batched):
    """Chat prompts, stopping at EOS, as a user would run them."""
    model, tokenizer = smollm2
    prompts = [chat_prompt(tokenizer, q) for q in SMOLLM2_QUESTIONS]
    prompts = prompts if batched else prompts[:1]
    runner = ModelRunner(model)
    eos = tokenizer.eos_token_id
    ours = greedy_generate(runner, naive_cache(runner), prompts, NEW_TOKENS, eos_token_id=eos)
    assert ours == hf_greedy_batch(model, prompts, NEW_TOKENS, eos_token_id=eos)


def test_smollm2_long_continuations_match_generate(smollm2):
    """Plain text with no EOS: 64 new tokens each, batched with different prompt lengths."""
    model, tokenizer = smollm2
    prompts = [tokenizer(t)["input_ids"] for t in SMOLLM2_TEXTS]
    runner = ModelRunner(model)
    ours = greedy_generate(runner, naive_cache(runner), prompts, NEW_TOKENS)
    assert all(len(o) == NEW_TOKENS for o in ours)
    assert ours == hf_greedy_batch(model, prompts, NEW_TOKENS)


def test_greedy_rejects_bad_input(tiny):
    runner = ModelRunner(tiny)
    with pytest.raises(ValueError, match="max_new_tokens"):
        greedy_generate(runner, naive_cache(runner), [[1, 2]], 0)
    with pytest.raises(ValueError, match="non-empty"):
        greedy_generate(runner, naive_cache(runner), [[]], 4)


@pytest.mark.parametrize("cache_kind", ["paged/1", "paged/8", "contiguous"])
def test_every_attention_backend_is_token_identical(cache_kind):
    """SDPA, the Triton kernels (interpreted on CPU) and the C kernel give the reference's
    tokens."""
    model, _ = kvlab.load_model("tiny", device="cpu")
    prompts = random_prompts(model.config.vocab_size, [5, 19])
    outputs = {}
    backends = ("reference", "sdpa", "triton") + (("cpu",) if cpu_kernel.available() else ())
    for backend in backends:
        runner = ModelRunner(model, attention=backend)
        if cache_kind == "contiguous":
            cache = ContiguousKVCache(2, 2, 16, num_slots=128, max_model_len=64, device="cpu")
        else:
            block_size = int(cache_kind.split("/")[1])
            cache = PagedKVCache(2, 2, 16, num_blocks=64, block_size=block_size, device="cpu")
        outputs[backend] = greedy_generate(runner, cache, prompts, 12)
    assert outputs["sdpa"] == outputs["reference"]
    assert outputs["triton"] == outputs["reference"]
    assert outputs.get("cpu", outputs["reference"]) == outputs["reference"]


@pytest.mark.parametrize("backend", ["triton", "cpu"])
def test_block_table_backends_refuse_the_naive_cache(tiny, backend):
    runner = ModelRunner(tiny, attention=backend)
    with pytest.raises(TypeError, match=f"'{backend}' reads K/V through a block table"):
        greedy_generate(runner, naive_cache(runner), [[1, 2, 3]], 2)


def test_unknown_attention_backend_is_refused(tiny):
    with pytest.raises(ValueError, match="attention must be one of"):
        ModelRunner(tiny, attention="flash")
