"""Shared fixtures: models are loaded once per test session."""

from __future__ import annotations

import pytest
import torch

import kvlab


@pytest.fixture(scope="module")
def one_thread():
    """One torch thread for a module of small ops: on a shared 2-core machine a second
    thread makes them many times slower (OpenMP threads waiting on each other)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def smollm2():
    """(model, tokenizer) of the real SmolLM2-135M-Instruct."""
    return kvlab.load_model("smollm2-135m", device="cpu")


@pytest.fixture(scope="module")
def tiny_model():
    """The tiny random Llama alone (lab 04's replays)."""
    model, _ = kvlab.load_model("tiny", device="cpu")
    return model


@pytest.fixture(scope="session", params=["tiny", "tiny-qwen2"])
def tiny(request):
    """A tiny random Llama, and a Qwen2-style one with q/k/v biases."""
    model, _ = kvlab.load_model(request.param, device="cpu")
    return model


def random_prompts(vocab_size: int, lengths: list[int], seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, vocab_size, (n,), generator=generator).tolist() for n in lengths]


def paged_greedy(runner, prompts, max_new_tokens, eos_token_id=None) -> list[list[int]]:
    """Greedy tokens of ``prompts`` through ``runner`` on a paged cache."""
    from kvlab.cache.paged import PagedKVCache
    from kvlab.model.greedy import greedy_generate

    cache = PagedKVCache.from_spec(runner.kv_spec(), num_blocks=128, block_size=16)
    return greedy_generate(runner, cache, prompts, max_new_tokens, eos_token_id=eos_token_id)


def tokens_match_eager(runner_class, model) -> bool:
    """Whether ``runner_class`` gives the eager ``ModelRunner``'s greedy tokens on ``model``
    (both with the fastest attention backend): a batch of three prompts, then one prompt
    alone (a one-row step takes other paths), 12 tokens each."""
    from kvlab.attention import fastest_backend
    from kvlab.model.runner import ModelRunner

    backend = fastest_backend("cpu")
    eager, other = ModelRunner(model, backend), runner_class(model, backend)
    return all(
        paged_greedy(other, prompts, 12) == paged_greedy(eager, prompts, 12)
        for prompts in (random_prompts(model.config.vocab_size, n) for n in ([5, 19, 2], [7]))
    )


def served_by_flag(model, flag: str, runner_class) -> dict[bool, list[list[int]]]:
    """Greedy tokens of five prompts through ``LLM(model, **{flag: False})`` and
    ``{flag: True}``, requests joining and leaving three seats; checks that the flag picks
    ``runner_class``."""
    from kvlab import LLM, SamplingParams

    prompts = random_prompts(model.config.vocab_size, [5, 9, 3, 12, 7])
    params = SamplingParams(temperature=0, max_tokens=6)
    runs = {}
    for value in (False, True):
        llm = LLM(model, num_blocks=64, block_size=4, max_num_seqs=3, **{flag: value})
        assert isinstance(llm.engine.runner, runner_class) is value
        outputs = llm.generate(prompts, params, use_tqdm=False)
        runs[value] = [o.outputs[0].token_ids for o in outputs]
    return runs
