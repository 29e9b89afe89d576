"""The Triton attention backend: kvlab's paged-attention kernels, straight from the pool.

A step where every sequence brings one token (decode) uses the decode kernel; any other
step (prefill, chunked prefill, mixed batches) the varlen prefill kernel. Both read K/V in
place through the step's block table; a contiguous cache works too (its blocks are single
slots), only slower. Without CUDA the kernels run in Triton's interpreter.

Not handled: caches without a block table (the naive cache).
"""

from __future__ import annotations

import torch

from kvlab.attention.reference import require_block_table
from kvlab.cache.base import KVCache, StepMetadata


def triton_attention(
    query: torch.Tensor, layer: int, meta: StepMetadata, cache: KVCache, scale: float
) -> torch.Tensor:
    """Same arguments and result as ``kvlab.attention.reference_attention``."""
    require_block_table("triton", meta, cache)
    # Imported here: triton is optional (Linux only) and only this backend needs it.
    from kvlab.kernels import paged_decode_attention, paged_prefill_attention

    kv = cache.kv_caches[layer]
    blocks = kv.view(2, -1, meta.block_size, *kv.shape[-2:])  # (2, num_blocks, block_size, H, D)
    batch = meta.batch
    seq_lens = batch.seq_lens.to(device=query.device, dtype=torch.int32)
    if batch.is_decode:
        return paged_decode_attention(query, blocks, meta.block_table, seq_lens, scale)
    query_start_loc = batch.query_start_loc.to(device=query.device, dtype=torch.int32)
    return paged_prefill_attention(
        query, blocks, meta.block_table, seq_lens, query_start_loc, scale
    )
