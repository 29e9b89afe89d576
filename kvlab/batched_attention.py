"""Attention for a whole step at once: every decoding sequence in one batched SDPA call.

``kvlab.attention.torch_attention`` loops over sequences: read one sequence's K/V, attend,
next. Clear, but a step with 64 sequences on a 30-layer model makes 1,920 small calls,
and on a CPU their fixed cost outweighs the arithmetic. This backend computes the same
thing with the decode rows (one query each) batched:

    gather every decoding sequence's K/V into one padded tensor, through its block table:
        K: (num_decodes, num_kv_heads, max_seq_len, head_dim), padding masked out
    one scaled_dot_product_attention call for all of them (grouped-query: enable_gqa)

    seq 0: |k k k k k k k|. . .|      mask: True for the first seq_lens[i] keys
    seq 1: |k k k k k k k k k k|
    seq 2: |k k k k|. . . . . .|

Rows with more than one query (a prefill or a chunk of one) still go one by one through
the reference ``_attend_one``: they are few per step, and each is already a big call.

Not handled: caches other than ``PagedKVCache`` and ``ContiguousKVCache`` (they fall back
to the reference loop), and memory use: the padded gather copies K/V once per layer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from kvlab.attention import _attend_one, torch_attention
from kvlab.cache.base import ForwardBatch, KVCache
from kvlab.cache.contiguous import ContiguousKVCache
from kvlab.cache.paged import PagedKVCache


class BatchedTorchAttention:
    """An attention backend (``ModelRunner(attention=BatchedTorchAttention())``).

    It keeps the gather indices of the current step, computed once for all layers.
    """

    def __init__(self) -> None:
        self._batch: ForwardBatch | None = None
        self._plan: _StepPlan | None = None

    def __call__(
        self, query: torch.Tensor, layer: int, batch: ForwardBatch, cache: KVCache, scale: float
    ) -> torch.Tensor:
        """Same arguments and result as ``kvlab.attention.torch_attention``."""
        if not isinstance(cache, PagedKVCache | ContiguousKVCache):
            return torch_attention(query, layer, batch, cache, scale)
        if self._batch is not batch:
            self._plan = _StepPlan.build(batch, cache)
            self._batch = batch
        plan = self._plan
        out = torch.empty_like(query)
        if plan.decode_rows.numel():
            out[plan.decode_rows] = self._decode(query[plan.decode_rows], layer, cache, plan, scale)
        for index, start, end in plan.prefill:
            key, value = cache.read(layer, batch, index)  # (seq_len, num_kv_heads, head_dim)
            out[start:end] = _attend_one(query[start:end], key, value, scale)
        return out

    def _decode(self, query, layer, cache, plan, scale):
        num_decodes, num_heads, head_dim = query.shape
        kv = cache.kv_caches[layer]
        if isinstance(cache, PagedKVCache):
            # (2, num_blocks, block_size, H, D) -> each decode's blocks, in logical order
            gathered = kv[:, plan.gather]  # (2, num_decodes, max_blocks, block_size, H, D)
            gathered = gathered.flatten(2, 3)  # (2, num_decodes, max_blocks * block_size, H, D)
        else:
            gathered = kv[:, plan.gather]  # (2, num_decodes, max_seq_len, H, D)
        key = gathered[0, :, : plan.max_seq_len].transpose(1, 2)  # (N, H_kv, L, D)
        value = gathered[1, :, : plan.max_seq_len].transpose(1, 2)
        q = query.view(num_decodes, num_heads, 1, head_dim)
        out = F.scaled_dot_product_attention(
            q, key, value, attn_mask=plan.mask, scale=scale, enable_gqa=True
        )  # (N, H, 1, D)
        return out.view(num_decodes, num_heads, head_dim)


class _StepPlan:
    """Which rows decode, where their K/V are, and which rows attend one by one."""

    def __init__(self, decode_rows, gather, mask, max_seq_len, prefill):
        self.decode_rows = decode_rows  # (N,) row of each decode query
        self.gather = gather  # paged: (N, max_blocks) block ids; contiguous: (N, L) slots
        self.mask = mask  # (N, 1, 1, L) True where a key is part of the sequence
        self.max_seq_len = max_seq_len
        self.prefill = prefill  # (index, start, end) of each multi-query sequence

    @classmethod
    def build(cls, batch: ForwardBatch, cache: KVCache) -> _StepPlan:
        starts = batch.query_start_loc.tolist()
        seq_lens = batch.seq_lens.tolist()
        decodes, prefill = [], []
        for i in range(batch.num_seqs):
            if starts[i + 1] - starts[i] == 1:
                decodes.append(i)
            else:
                prefill.append((i, starts[i], starts[i + 1]))
        device = cache.device
        if not decodes:
            empty = torch.empty(0, dtype=torch.long, device=device)
            return cls(empty, None, None, 0, prefill)
        lens = torch.tensor([seq_lens[i] for i in decodes], device=device)
        max_seq_len = int(lens.max())
        positions = torch.arange(max_seq_len, device=device)
        mask = (positions[None, :] < lens[:, None])[:, None, None, :]  # (N, 1, 1, L)
        if isinstance(cache, PagedKVCache):
            table = cache.metadata(batch).block_table  # (num_seqs, max_blocks), padded with 0
            max_blocks = -(-max_seq_len // cache.block_size)
            gather = table[decodes, :max_blocks].long()
        else:
            first = torch.tensor(
                [cache.arena.range_of(batch.seq_ids[i]).start for i in decodes], device=device
            )
            # Past a sequence's end the slots are masked; clamp them inside the pool.
            gather = (first[:, None] + positions[None, :]).clamp_(max=cache.num_slots - 1)
        decode_rows = torch.tensor([starts[i] for i in decodes], device=device)
        return cls(decode_rows, gather, mask, max_seq_len, prefill)
