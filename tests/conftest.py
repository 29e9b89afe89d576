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
