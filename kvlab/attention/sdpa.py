"""The SDPA attention backend: every decoding sequence of a step in one batched call.

``reference_attention`` loops over sequences: read one sequence's K/V, attend, next.
Clear, but a step with 64 sequences on a 30-layer model makes 1,920 small calls, and on a
CPU their fixed cost outweighs the arithmetic. This backend computes the same thing with
the decode rows (one query each) batched:

    gather every decoding sequence's K/V into one padded tensor, through its block table:
        K: (num_decodes, num_kv_heads, max_seq_len, head_dim), padding masked out
    one scaled_dot_product_attention call for all of them (grouped-query: enable_gqa)

    seq 0: |k k k k k k k|. . .|      mask: True for the first seq_lens[i] keys
    seq 1: |k k k k k k k k k k|
    seq 2: |k k k k|. . . . . .|

Rows with more than one query (a prefill or a chunk of one) still go one by one through
the reference: they are few per step, and each is already a big call. Which rows decode,
and their key mask, are worked out once per step in ``StepMetadata.decode_split``.

Not handled: caches without a block table (the naive cache: the reference runs instead),
and memory use: the padded gather copies K/V once per layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlab.attention.reference import attend_one, reference_attention
from kvlab.cache.base import KVCache, StepMetadata


def sdpa_attention(
    query: torch.Tensor, layer: int, meta: StepMetadata, cache: KVCache, scale: float
) -> torch.Tensor:
    """Same arguments and result as ``reference_attention``."""
    if meta.block_table is None:
        return reference_attention(query, layer, meta, cache, scale)
    return attend_split(query, layer, meta, cache, scale, _decode)


def attend_split(query, layer, meta: StepMetadata, cache: KVCache, scale: float, decode):
    """The decode rows of a step in one call of ``decode``, every other row one by one.

    ``decode(query, layer, meta, cache, scale)`` gets the decode rows' queries
    (num_decodes, num_heads, head_dim) and returns their outputs; the SDPA and the C
    backends differ only there.
    """
    split = meta.decode_split
    if split.all_decode:  # the common step: no rows to pick out or put back
        return decode(query, layer, meta, cache, scale)
    out = torch.empty_like(query)
    if split.decode_rows.numel():
        out[split.decode_rows] = decode(query[split.decode_rows], layer, meta, cache, scale)
    for index, start, end in split.prefill:
        key, value = cache.read(layer, meta, index)  # (seq_len, num_kv_heads, head_dim)
        out[start:end] = attend_one(query[start:end], key, value, scale)
    return out


def _decode(query, layer, meta: StepMetadata, cache: KVCache, scale: float) -> torch.Tensor:
    split = meta.decode_split
    num_decodes, num_heads, head_dim = query.shape
    kv = cache.kv_caches[layer]  # (2, num_blocks, [block_size,] H_kv, D)
    num_kv_heads = kv.shape[-2]
    # One copy of whole blocks (block_size * H_kv * D values each) through the block table.
    blocks = kv.view(2, -1, meta.block_size * num_kv_heads * head_dim)
    gathered = blocks.index_select(1, split.block_ids)  # (2, N * max_blocks, block values)
    gathered = gathered.view(2, num_decodes, -1, num_kv_heads, head_dim)  # (2, N, slots, H_kv, D)
    key = gathered[0, :, : split.max_seq_len].transpose(1, 2)  # (N, H_kv, L, D)
    value = gathered[1, :, : split.max_seq_len].transpose(1, 2)
    q = query.view(num_decodes, num_heads, 1, head_dim)
    out = F.scaled_dot_product_attention(
        q, key, value, attn_mask=split.key_mask, scale=scale, enable_gqa=True
    )  # (N, H, 1, D)
    return out.view(num_decodes, num_heads, head_dim)
