"""The CPU attention backend: decode rows through kvlab's C kernel, K/V read in place.

The same split as the SDPA backend (``attend_split``): the one-query rows of a step in one
call, prefill rows one sequence at a time through the reference. Only the decode call
differs: instead of gathering every sequence's K/V into a padded tensor and masking the
padding (a copy per layer), the C kernel walks each sequence's blocks through the block
table, as vLLM's CPU backend and kvlab's Triton kernel do (``paged_decode_cpu.c``).

Not handled: caches without a block table (the naive cache: use ``"reference"``), dtypes
other than float32 and devices other than the CPU (``"sdpa"``, or ``"triton"`` on a GPU).
The kernel is built on first use by the machine's C compiler (``cpu_kernel``).
"""

from __future__ import annotations

import torch

from kvlab.attention.cpu_kernel import paged_decode_attention_cpu
from kvlab.attention.reference import require_block_table
from kvlab.attention.sdpa import attend_split
from kvlab.cache.base import KVCache, StepMetadata


def cpu_attention(
    query: torch.Tensor, layer: int, meta: StepMetadata, cache: KVCache, scale: float
) -> torch.Tensor:
    """Same arguments and result as ``kvlab.attention.reference_attention``."""
    require_block_table("cpu", meta, cache)
    return attend_split(query, layer, meta, cache, scale, _decode)


def _decode(query, layer, meta: StepMetadata, cache: KVCache, scale: float) -> torch.Tensor:
    split = meta.decode_split
    block_ids = split.block_ids.view(split.seq_lens.shape[0], -1)  # (N, blocks_per_seq)
    kv = cache.kv_caches[layer]
    return paged_decode_attention_cpu(query, kv, block_ids, split.seq_lens, meta.block_size, scale)
