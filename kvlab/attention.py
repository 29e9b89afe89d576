"""Attention over cached keys and values: the torch reference backend.

The runner hands over this step's queries, packed flat for all sequences, and the cache. For
each sequence the backend reads its whole context (cached tokens plus the ones just written)
and runs causal attention of the new queries against it. The new tokens are the *last*
``query_len`` of the ``seq_len`` keys, so query ``j`` may see keys ``0 .. seq_len - query_len + j``:

    keys:     0 1 2 3 4 5 6        seq_len = 7, query_len = 3
    query 0:  x x x x x . .        (position 4)
    query 1:  x x x x x x .
    query 2:  x x x x x x x

Grouped-query attention: ``num_heads`` query heads share ``num_kv_heads`` key/value heads,
``num_heads // num_kv_heads`` queries per KV head.

Two backends with the same signature: ``torch_attention`` (any cache; reads each sequence's
K/V back as a tensor) and ``triton_attention`` (the paged cache only; the kernels of
``kvlab.kernels`` read K/V in place through the block table). ``ATTENTION_BACKENDS`` maps
their names, the values of the engine's ``attention_backend`` setting.

Not handled: sliding windows, attention sinks, ALiBi.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlab.cache.base import ForwardBatch, KVCache
from kvlab.cache.paged import PagedKVCache


def torch_attention(
    query: torch.Tensor, layer: int, batch: ForwardBatch, cache: KVCache, scale: float
) -> torch.Tensor:
    """Causal attention of each sequence's new queries against its cached context.

    Args:
        query: (num_tokens, num_heads, head_dim), rows packed as ``batch.query_start_loc`` says.
        layer: which layer's K/V to read.
        scale: softmax scale, usually ``head_dim ** -0.5``.

    Returns:
        (num_tokens, num_heads, head_dim) attention outputs in the same row order.
    """
    out = torch.empty_like(query)
    starts = batch.query_start_loc.tolist()
    for i in range(batch.num_seqs):
        rows = slice(starts[i], starts[i + 1])
        key, value = cache.read(layer, batch, i)  # (seq_len, num_kv_heads, head_dim)
        out[rows] = _attend_one(query[rows], key, value, scale)
    return out


def _attend_one(query, key, value, scale):
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


def triton_attention(
    query: torch.Tensor, layer: int, batch: ForwardBatch, cache: KVCache, scale: float
) -> torch.Tensor:
    """The same attention computed by kvlab's Triton kernels, straight from the paged cache.

    A step where every sequence brings one token (decode) uses the decode kernel; any other
    step (prefill, chunked prefill, mixed batches) the varlen prefill kernel.
    """
    if not isinstance(cache, PagedKVCache):
        raise TypeError(
            f"attention_backend='triton' reads K/V through a block table, so it needs a "
            f"PagedKVCache; got {type(cache).__name__}. Use attention_backend='torch'."
        )
    # Imported here: triton is optional (Linux only) and only this backend needs it.
    from kvlab.kernels import paged_decode_attention, paged_prefill_attention

    meta = cache.metadata(batch)
    kv_cache = cache.kv_caches[layer]
    if batch.num_tokens == batch.num_seqs:
        return paged_decode_attention(query, kv_cache, meta.block_table, meta.seq_lens, scale)
    query_start_loc = batch.query_start_loc.to(device=query.device, dtype=torch.int32)
    return paged_prefill_attention(
        query, kv_cache, meta.block_table, meta.seq_lens, query_start_loc, scale
    )


ATTENTION_BACKENDS = {"torch": torch_attention, "triton": triton_attention}
