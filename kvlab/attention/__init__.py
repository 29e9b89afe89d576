"""Attention over cached keys and values: four backends with one signature.

Each takes this step's queries, packed flat for all sequences, and returns the outputs in
the same rows:

    backend(query, layer, meta, cache, scale) -> (num_tokens, num_heads, head_dim)

    reference  one sequence at a time: read its K/V back from any cache, attend (the
               definition; ``reference.py``)
    sdpa       the decode rows of a step gathered into one batched PyTorch SDPA call
               (same math, far fewer calls; ``sdpa.py``)
    triton     kvlab's Triton kernels read K/V in place through the block table
               (``triton.py``; the kernels are ``kvlab.kernels``)
    cpu        the decode rows through a C kernel that reads K/V in place through the
               block table, built on first use (``cpu.py``, ``paged_decode_cpu.c``)

``meta`` is the step's ``kvlab.cache.base.StepMetadata``, built once by the cache; a
backend keeps nothing between calls. ``ATTENTION_BACKENDS`` maps the names, the values of
``ModelRunner(attention=...)`` and ``LLM(attention_backend=...)``.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from kvlab.attention import cpu_kernel
from kvlab.attention.cpu import cpu_attention
from kvlab.attention.reference import reference_attention
from kvlab.attention.sdpa import sdpa_attention
from kvlab.attention.triton import triton_attention
from kvlab.cache.base import KVCache, StepMetadata

AttentionFn = Callable[[torch.Tensor, int, StepMetadata, KVCache, float], torch.Tensor]

ATTENTION_BACKENDS: dict[str, AttentionFn] = {
    "reference": reference_attention,
    "sdpa": sdpa_attention,
    "triton": triton_attention,
    "cpu": cpu_attention,
}


def fastest_backend(device: str | torch.device = "cpu") -> str:
    """The backend the benchmarks run kvlab with on ``device``: ``"cpu"`` on a CPU where
    the C kernel builds (within noise of SDPA, or faster, in the README's measurements),
    ``"sdpa"`` elsewhere."""
    if torch.device(device).type == "cpu" and cpu_kernel.available():
        return "cpu"
    return "sdpa"


__all__ = [
    "ATTENTION_BACKENDS",
    "AttentionFn",
    "cpu_attention",
    "fastest_backend",
    "reference_attention",
    "sdpa_attention",
    "triton_attention",
]
