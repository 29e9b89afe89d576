"""Triton kernels that read and write a paged KV cache (the last lab of kvlab).

What is here:

- ``write_kv``: scatter the new keys and values of a step into their slots.
- ``paged_decode_attention``: one new token per sequence attends to its whole context,
  read block by block through the ``block_table`` (with a split-K "flash-decoding" mode).
- ``paged_prefill_attention``: many new tokens per sequence (prefill, chunked prefill),
  causal, over the same paged cache.
- ``kvlab.kernels.reference``: the same three in plain torch, the oracle for the tests.

Cache layout, per layer (the layout of vLLM's Triton backend)::

    kv_cache     (2, num_blocks, block_size, num_kv_heads, head_dim)   [0] keys, [1] values
    block_table  (num_seqs, max_num_blocks_per_seq) int32   logical block -> physical block
    seq_lens     (num_seqs,) int32                          tokens each sequence holds
    slot_mapping (num_tokens,) int64                        block_id * block_size + offset

Where the kernels run: natively on a CUDA device; everywhere else through Triton's
interpreter, which executes the same kernel code with numpy on the CPU. That is right for
learning and for correctness tests, and says nothing about speed.

NOTE: why this module sets ``TRITON_INTERPRET``. With no CUDA device Triton cannot compile,
so unless the user chose a value we set ``TRITON_INTERPRET=1``. Triton reads the variable
when a function is decorated with ``@triton.jit``, and ``triton.language`` decorates its own
helpers (``tl.sum``, ``tl.max``, ``tl.cdiv``...) when triton is first imported. So the
variable must be set before anything imports triton (transformers does, through
``torch._dynamo``); if triton came first, its helpers cannot be interpreted and we stop with
a clear error instead of failing inside the first kernel.
"""

from __future__ import annotations

import os

import torch


def _choose_triton_mode() -> None:
    """Use Triton's interpreter when there is no CUDA device, and check that triton agrees."""
    if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction

    if not isinstance(tl.sum, InterpretedFunction):
        raise ImportError(
            "kvlab.kernels: Triton kernels must run in Triton's interpreter here "
            "(TRITON_INTERPRET=1), but triton was imported before that variable was set, so "
            "its own helpers (tl.sum, tl.max, ...) cannot be interpreted. Set "
            "TRITON_INTERPRET=1 before Python starts (in a notebook: `%env TRITON_INTERPRET=1` "
            "in the first cell, then restart the kernel), or import kvlab before anything "
            "that imports triton."
        )


# NOTE: the guard is for the repo root, where this folder is also importable as the top-level
# package `kernels`, a name transformers probes for (Hugging Face's `kernels` package).
# Imported under that name, it does nothing.
if __name__ == "kvlab.kernels":
    _choose_triton_mode()

    from kvlab.kernels.paged_attention import paged_decode_attention
    from kvlab.kernels.paged_prefill import paged_prefill_attention
    from kvlab.kernels.reference import (
        paged_decode_attention_ref,
        paged_prefill_attention_ref,
        write_kv_ref,
    )
    from kvlab.kernels.write_kv import write_kv

__all__ = [
    "paged_decode_attention",
    "paged_decode_attention_ref",
    "paged_prefill_attention",
    "paged_prefill_attention_ref",
    "write_kv",
    "write_kv_ref",
]
