"""The reference attention backend: causal attention, one sequence at a time.

For each sequence the backend reads its whole context back from the cache (cached tokens
plus the ones just written) and attends its new queries to it. The new tokens are the
*last* ``query_len`` of the ``seq_len`` keys, so query ``j`` may see keys
``0 .. seq_len - query_len + j``:

    keys:     0 1 2 3 4 5 6        seq_len = 7, query_len = 3
    query 0:  x x x x x . .        (position 4)
    query 1:  x x x x x x .
    query 2:  x x x x x x x

Grouped-query attention: ``num_heads`` query heads share ``num_kv_heads`` key/value heads,
``num_heads // num_kv_heads`` queries per KV head.

This is the definition the other backends are tested against; it works with any cache.
Not handled: sliding windows, attention sinks, ALiBi.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlab.cache.base import KVCache, StepMetadata


def reference_attention(
    query: torch.Tensor, layer: int, meta: StepMetadata, cache: KVCache, scale: float
) -> torch.Tensor:
    """Causal attention of each sequence's new queries against its cached context.

    Args:
        query: (num_tokens, num_heads, head_dim), rows packed as ``meta.batch`` says.
        layer: which layer's K/V to read.
        meta: this step's metadata.
        cache: where the K/V are.
        scale: softmax scale, usually ``head_dim ** -0.5``.

    Returns:
        (num_tokens, num_heads, head_dim) attention outputs in the same row order.
    """
    out = torch.empty_like(query)
    starts = meta.batch.query_start_loc.tolist()
    for i in range(meta.batch.num_seqs):
        rows = slice(starts[i], starts[i + 1])
        key, value = cache.read(layer, meta, i)  # (seq_len, num_kv_heads, head_dim)
        out[rows] = attend_one(query[rows], key, value, scale)
    return out


def attend_one(query, key, value, scale):
    """One sequence: query (query_len, H, D) against key/value (seq_len, H_kv, D)."""
    query_len, num_heads, _ = query.shape
    seq_len, num_kv_heads, _ = key.shape
    group = num_heads // num_kv_heads
    # (heads, tokens, head_dim) for SDPA; each KV head serves `group` query heads.
    q = query.transpose(0, 1)
    k = key.transpose(0, 1).repeat_interleave(group, dim=0)
    v = value.transpose(0, 1).repeat_interleave(group, dim=0)
    if query_len == 1:
        mask = None  # a single new token sees its whole context
    else:
        query_pos = torch.arange(seq_len - query_len, seq_len, device=query.device)
        key_pos = torch.arange(seq_len, device=query.device)
        mask = key_pos[None, :] <= query_pos[:, None]  # (query_len, seq_len)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out.transpose(0, 1)


def require_block_table(backend: str, meta: StepMetadata, cache: KVCache) -> None:
    """Refuse a cache without a block table (the naive cache) for a backend that reads
    K/V through one, naming the backend that works with it."""
    if meta.block_table is None:
        raise TypeError(
            f"attention_backend={backend!r} reads K/V through a block table; "
            f"{type(cache).__name__} has none. Use attention='reference' with it."
        )
