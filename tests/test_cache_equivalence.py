"""Every KV cache generates the tokens of the oracle: transformers' greedy ``generate``.

Where K and V live must never change what the model says. Each cache in ``CACHES`` runs
several concurrent requests of different lengths through kvlab's runner, with the plain
``greedy_generate`` loop and with ``serve`` (requests that declare themselves, arrive at
different steps, and hit the prefix cache), on a tiny random Llama, a tiny Qwen2-style
model (q/k/v biases) and the real SmolLM2. A cache that refuses a request must leave the
others running with unchanged tokens. Add a factory to ``CACHES`` and a new allocator gets
the whole suite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest
from conftest import random_prompts
from test_runner import hf_greedy_batch

from kvlab.cache import CacheFullError, ContiguousKVCache, KVCache, NaiveKVCache, PagedKVCache
from kvlab.measure.serve import serve
from kvlab.model.greedy import greedy_generate
from kvlab.model.loading import chat_prompt
from kvlab.model.runner import ModelRunner

NEW_TOKENS = 24
NUM_SLOTS = 2048  # KV capacity of every bounded cache, in token slots
MAX_MODEL_LEN = 256


@dataclass(frozen=True)
class CacheCase:
    """How to build one cache for a model, with a capacity of ``num_slots`` token slots."""

    name: str
    build: Callable[[ModelRunner, int], KVCache]
    bounded: bool = True  # it has a memory limit, so it can refuse a request
    prefix_caching: bool = False


def _shape(runner: ModelRunner) -> tuple[int, int, int]:
    return runner.config.num_hidden_layers, runner.num_kv_heads, runner.head_dim


def _contiguous(policy: str) -> CacheCase:
    def build(runner, num_slots):
        # A small pool gets a small max_model_len, so that two requests fit under any policy.
        max_model_len = min(MAX_MODEL_LEN, num_slots // 2)
        return ContiguousKVCache(
            *_shape(runner), num_slots, policy, max_model_len, runner.dtype, "cpu"
        )

    return CacheCase(f"contiguous/{policy}", build)


def _paged(block_size: int, prefix_caching: bool = False) -> CacheCase:
    def build(runner, num_slots):
        return PagedKVCache(
            *_shape(runner),
            num_blocks=num_slots // block_size,
            block_size=block_size,
            dtype=runner.dtype,
            device="cpu",
            enable_prefix_caching=prefix_caching,
        )

    suffix = "+prefix" if prefix_caching else ""
    return CacheCase(f"paged/{block_size}{suffix}", build, prefix_caching=prefix_caching)


CACHES = [
    CacheCase("naive", lambda runner, _: NaiveKVCache(*_shape(runner)), bounded=False),
    _contiguous("max_model_len"),
    _contiguous("pow2"),
    _contiguous("exact"),
    _paged(1),
    _paged(16),
    _paged(16, prefix_caching=True),
]
BOUNDED = [case for case in CACHES if case.bounded]


def by_name(cases: list[CacheCase]):
    return pytest.mark.parametrize("case", cases, ids=[case.name for case in cases])


pytestmark = pytest.mark.usefixtures("one_thread")


def shared_prefix_prompts(vocab_size: int) -> list[list[int]]:
    """Four prompts that start with the same 40 tokens (a system prompt), then differ."""
    prefix = random_prompts(vocab_size, [40], seed=1)[0]
    tails = random_prompts(vocab_size, [3, 11, 26, 9], seed=2)
    return [prefix + tail for tail in tails]


def eos_of(model) -> int | None:
    """The model's own EOS (the tiny Llama's is 2): transformers stops on it, so must we."""
    return model.generation_config.eos_token_id


def greedy_with_declared_requests(runner, cache, prompts, max_new_tokens, eos=None):
    """``greedy_generate``; a contiguous cache first hears of each request, to size it."""
    if isinstance(cache, ContiguousKVCache):
        for seq_id, prompt in enumerate(prompts):
            assert cache.add_request(seq_id, prompt, max_new_tokens) == 0
    return greedy_generate(runner, cache, prompts, max_new_tokens, eos_token_id=eos)


# ---- tiny models: Llama and Qwen2-style ---------------------------------------------------


@by_name(CACHES)
def test_batch_of_different_lengths_matches_generate(tiny, case):
    prompts = random_prompts(tiny.config.vocab_size, [1, 7, 30, 18])
    eos = eos_of(tiny)
    expected = hf_greedy_batch(tiny, prompts, NEW_TOKENS, eos)
    runner = ModelRunner(tiny)
    cache = case.build(runner, NUM_SLOTS)
    assert greedy_with_declared_requests(runner, cache, prompts, NEW_TOKENS, eos) == expected
    if case.bounded:  # the engine serves pooled caches
        result = serve(runner, case.build(runner, NUM_SLOTS), prompts, NEW_TOKENS, eos)
        assert result.outputs == expected and not result.refused


@by_name(BOUNDED)
def test_staggered_requests_with_a_shared_prefix_match_generate(tiny, case):
    """Requests arrive while others run or after they finished; all share a prefix.

    With prefix caching, request 1 adopts request 0's full prefix blocks while both run,
    and request 3 adopts blocks that stayed cached after their holders finished.
    """
    prompts = shared_prefix_prompts(tiny.config.vocab_size)
    eos = eos_of(tiny)
    expected = hf_greedy_batch(tiny, prompts, NEW_TOKENS, eos)
    runner = ModelRunner(tiny)
    cache = case.build(runner, NUM_SLOTS)
    arrivals = [0, 3, 3, NEW_TOKENS + 5]
    result = serve(runner, cache, prompts, NEW_TOKENS, eos, arrival_steps=arrivals)
    assert result.outputs == expected and not result.refused
    if case.prefix_caching:
        assert result.num_cached_tokens == [0, 32, 32, 32]
    else:
        assert result.num_cached_tokens == [0, 0, 0, 0]


@by_name(BOUNDED)
def test_a_request_that_does_not_fit_waits_or_is_refused_and_the_others_finish(tiny, case):
    """100 slots hold requests 0 and 1; request 2's 80-token prompt waits for a paged
    cache's blocks, and is refused by a contiguous one (its max_model_len is 50 here)."""
    prompts = random_prompts(tiny.config.vocab_size, [10, 20, 80])
    eos = eos_of(tiny)
    expected = hf_greedy_batch(tiny, prompts, 16, eos)
    runner = ModelRunner(tiny)
    cache = case.build(runner, 100)
    result = serve(runner, cache, prompts, 16, eos)
    assert result.outputs[:2] == expected[:2]
    if case.name.startswith("contiguous"):
        assert list(result.refused) == [2] and "max_model_len=50" in result.refused[2]
        assert result.outputs[2] is None
    else:
        assert not result.refused
        assert result.outputs[2] == expected[2] and result.start_steps[2] > 0
    assert cache.usage().reserved_bytes == 0  # everything was given back


@pytest.mark.parametrize("case", BOUNDED, ids=[case.name for case in BOUNDED])
def test_greedy_generate_stops_with_the_reason(tiny, case):
    """The plain loop has no admission control: a full cache stops it, saying why."""
    runner = ModelRunner(tiny)
    cache = case.build(runner, 32)
    prompts = random_prompts(tiny.config.vocab_size, [20, 20])
    with pytest.raises((CacheFullError, ValueError), match="free|max_model_len|only"):
        greedy_with_declared_requests(runner, cache, prompts, 16)


# ---- the real model ------------------------------------------------------------------------

SMOLLM2_QUESTIONS = ["What is the capital of France?", "Name three colors.", "Say hi."]
SMOLLM2_CACHES = [case for case in CACHES if case.name in ("contiguous/pow2", "paged/16+prefix")]


@pytest.fixture(scope="module")
def smollm2_reference(smollm2):
    model, tokenizer = smollm2
    prompts = [chat_prompt(tokenizer, q) for q in SMOLLM2_QUESTIONS]
    expected = hf_greedy_batch(model, prompts, 16, eos_token_id=tokenizer.eos_token_id)
    return prompts, expected


@by_name(SMOLLM2_CACHES)
def test_smollm2_chat_answers_match_generate(smollm2, smollm2_reference, case):
    """Three chat prompts at once; the paged cache shares their system prompt's blocks."""
    model, tokenizer = smollm2
    prompts, expected = smollm2_reference
    runner = ModelRunner(model)
    cache = case.build(runner, 512)
    result = serve(runner, cache, prompts, 16, eos_token_id=tokenizer.eos_token_id)
    assert result.outputs == expected
    assert (sum(result.num_cached_tokens) > 0) == case.prefix_caching
