"""The interface between the model runner and wherever K and V live, one step at a time.

The runner never knows how a cache stores tokens. Each step it hands the cache a
``ForwardBatch``: which sequences run and which of their tokens are new, packed into one
flat batch of ``num_tokens`` (varlen, as in vLLM; sequence ``i`` owns rows
``query_start_loc[i]:query_start_loc[i+1]``):

    seq 0: |---- context (cached) ----|== new ==|
    seq 1: |-- context --|===== new (prefill) =====|
                                  seq_lens[i] = context + new

The cache answers once per step (``begin_step``) with the ``StepMetadata``: where the K/V
of those tokens live. Every layer's ``write`` of new keys and values, and every attention
``read`` of a sequence's context, goes through it; no backend keeps state of its own
between calls. The naive cache (``kvlab.cache.naive``) grows one tensor per sequence like
Hugging Face's ``DynamicCache``; the contiguous and paged caches (``PooledKVCache``) place
tokens in slots of one preallocated pool and keep their bookkeeping in a
``kvlab.cache.manager.KVCacheManager``. Swapping one for another changes no model code.

    block_table   (num_seqs, max_blocks) int32: physical block of each logical block,
                  padded with 0 (never read: seq_lens bounds every read). A contiguous
                  cache's blocks are single slots, so its rows are consecutive slots.
    slot_mapping  (num_tokens,) int64: slot = block_id * block_size + offset, per new token

Not handled here: allocation policy (each cache decides, ``kvlab.cache.paged``,
``kvlab.cache.contiguous``), attention itself (``kvlab.attention``), sampling, scheduling.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from kvlab.cache.manager import KVCacheManager


# ---- one step: its layout, and where its K/V live ----------------------------------------


@dataclass
class ForwardBatch:
    """What one forward step computes: which sequences, and which of their tokens.

    Attributes:
        seq_ids: the requests in this step, in row order.
        query_start_loc: (num_seqs + 1,) offsets of each sequence's new tokens in the flat batch.
        seq_lens: (num_seqs,) tokens each sequence holds after this step (context + new).
        positions: (num_tokens,) position of every new token in its sequence.
    """

    seq_ids: list[int]
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    positions: torch.Tensor

    @classmethod
    def build(cls, seq_ids: list[int], num_computed: list[int], num_new: list[int], device=None):
        """Pack sequences that already hold ``num_computed`` tokens and add ``num_new`` each.

        No Python loop over tokens: a decode step's positions are ``num_computed`` itself,
        a mixed step's are each sequence's ``num_computed + 0, 1, ...``, made with tensor ops.
        """
        if not (len(seq_ids) == len(num_computed) == len(num_new)):
            raise ValueError("seq_ids, num_computed and num_new must have the same length")
        if any(n <= 0 for n in num_new):
            raise ValueError(f"every sequence must bring at least one new token, got {num_new}")
        computed = torch.tensor(num_computed, dtype=torch.long)
        new = torch.tensor(num_new, dtype=torch.long)
        query_start_loc = torch.zeros(len(num_new) + 1, dtype=torch.long)
        torch.cumsum(new, 0, out=query_start_loc[1:])
        num_tokens = int(query_start_loc[-1])
        if num_tokens == len(num_new):
            positions = computed
        else:
            # token j of the flat batch belongs to sequence i: position = computed[i] + j - start[i]
            offsets = torch.repeat_interleave(computed - query_start_loc[:-1], new)
            positions = torch.arange(num_tokens) + offsets
        return cls(
            seq_ids=list(seq_ids),
            query_start_loc=query_start_loc.to(device),
            seq_lens=(computed + new).to(device),
            positions=positions.to(device),
        )

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])

    @property
    def is_decode(self) -> bool:
        """Every sequence brings exactly one new token."""
        return self.num_tokens == self.num_seqs


@dataclass(frozen=True)
class DecodeSplit:
    """A step's rows split for batched attention: one-query rows together, the rest apart.

    Attributes:
        decode_index: (num_decodes,) index of each one-query sequence in the batch.
        decode_rows: (num_decodes,) its query's row in the flat batch.
        key_mask: (num_decodes, 1, 1, max_seq_len) True where a key belongs to the sequence.
        max_seq_len: the longest context among them.
        prefill: ``(index, start, end)`` of every sequence with more than one new token.
        block_ids: (num_decodes * max_blocks,) int64, the blocks that hold the first
            ``max_seq_len`` tokens of each one-query sequence, row after row; None without
            a block table.
        seq_lens: (num_decodes,) int64, the tokens each one-query sequence holds.
    """

    decode_index: torch.Tensor
    decode_rows: torch.Tensor
    key_mask: torch.Tensor | None
    max_seq_len: int
    prefill: list[tuple[int, int, int]]
    block_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None

    @property
    def all_decode(self) -> bool:
        """Every row of the step is a one-query row (no prefill)."""
        return not self.prefill


@dataclass(frozen=True)
class StepMetadata:
    """Everything the layers of one step need to find K/V; built once by ``begin_step``.

    Attributes:
        batch: the layout of the step's tokens.
        block_table: (num_seqs, max_blocks) int32 on the cache's device; None for a cache
            without a pool (the naive cache).
        slot_mapping: (num_tokens,) int64, the slot of each new token's K/V; None likewise.
        block_size: slots per block of ``block_table`` (1 for a contiguous cache).
    """

    batch: ForwardBatch
    block_table: torch.Tensor | None = None
    slot_mapping: torch.Tensor | None = None
    block_size: int = 1

    @cached_property
    def decode_split(self) -> DecodeSplit:
        """Which rows decode (one query each) and which prefill; computed once per step."""
        batch = self.batch
        starts = batch.query_start_loc.tolist()
        decodes, prefill = [], []
        for i in range(batch.num_seqs):
            if starts[i + 1] - starts[i] == 1:
                decodes.append(i)
            else:
                prefill.append((i, starts[i], starts[i + 1]))
        device = batch.query_start_loc.device
        index = torch.tensor(decodes, dtype=torch.long, device=device)
        rows = torch.tensor([starts[i] for i in decodes], dtype=torch.long, device=device)
        if not decodes:
            return DecodeSplit(index, rows, None, 0, prefill)
        lens = batch.seq_lens[index]
        max_seq_len = int(lens.max())
        positions = torch.arange(max_seq_len, device=device)
        mask = (positions[None, :] < lens[:, None])[:, None, None, :]  # (N, 1, 1, L)
        block_ids = None
        if self.block_table is not None:
            max_blocks = -(-max_seq_len // self.block_size)
            block_ids = self.block_table[index, :max_blocks].flatten().long()
        return DecodeSplit(index, rows, mask, max_seq_len, prefill, block_ids, lens)


# ---- the caches --------------------------------------------------------------------------


class KVCache(ABC):
    """Storage for the keys and values of many sequences, for every layer.

    Life of a sequence: ``add_request(seq_id, prompt, max_tokens)`` once (a contiguous
    cache reserves its range, a paged one adopts cached prefix blocks), then
    ``allocate_slots(seq_id, n, token_ids)`` before each step that adds ``n`` tokens (raises
    ``CacheFullError`` and changes nothing if they cannot fit), the runner's ``write`` and
    ``read`` calls during the step, and ``free(seq_id)`` at the end.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @abstractmethod
    def add_request(
        self, seq_id: int, prompt_token_ids: Sequence[int], max_tokens: int | None = None
    ) -> int:
        """Register ``seq_id``; return how many prompt tokens it finds computed already."""

    @abstractmethod
    def allocate_slots(
        self, seq_id: int, num_new_tokens: int, token_ids: Sequence[int] | None = None
    ) -> None:
        """Make room for ``num_new_tokens`` more tokens of ``seq_id`` (new or existing).

        ``token_ids`` are their ids, where a cache uses them (prefix hashes).
        """

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Release everything ``seq_id`` holds."""

    @abstractmethod
    def __contains__(self, seq_id: int) -> bool:
        """``seq_id`` holds memory here (it was added and not freed yet)."""

    @abstractmethod
    def num_tokens(self, seq_id: int) -> int:
        """Tokens ``seq_id`` has room for (written, or allocated for this step)."""

    def begin_step(self, batch: ForwardBatch) -> StepMetadata:
        """This step's metadata, built once before the layers run (a pool adds its tables)."""
        return StepMetadata(batch)

    @abstractmethod
    def write(self, layer: int, meta: StepMetadata, key: torch.Tensor, value: torch.Tensor) -> None:
        """Store this step's new keys and values, each (num_tokens, num_kv_heads, head_dim)."""

    @abstractmethod
    def read(self, layer: int, meta: StepMetadata, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the step's sequence ``index``, each (seq_len, num_kv_heads, head_dim)."""

    @abstractmethod
    def usage(self) -> CacheUsage:
        """How much of this cache's memory is reserved, and how much holds live tokens."""


class PooledKVCache(KVCache):
    """A cache whose K/V live in one preallocated pool per layer, its bookkeeping in a manager.

    The paged and contiguous caches are this: the scheduler plans with ``manager`` (a
    ``kvlab.cache.manager.KVCacheManager``, no tensors), and the storage here applies the
    block copies the manager asks for and serves the runner's reads and writes.

    Attributes:
        manager: the bookkeeping.
        kv_caches: per layer, one tensor whose dim 1 indexes the manager's blocks. With
            ``num_layers=0`` there is none: the cache is bookkeeping only, for a model-free
            run (``kvlab.engine.model_free``).
    """

    manager: KVCacheManager
    kv_caches: list[torch.Tensor]
    dtype: torch.dtype
    device: torch.device

    @property
    def bytes_per_slot(self) -> int:
        """K and V bytes of one token, all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.manager

    def num_tokens(self, seq_id: int) -> int:
        return self.manager.num_tokens(seq_id)

    def free(self, seq_id: int) -> None:
        self.manager.free(seq_id)

    def usage(self) -> CacheUsage:
        return CacheUsage.of(self.manager.usage(), self.bytes_per_slot)

    def begin_step(self, batch: ForwardBatch) -> StepMetadata:
        """The step's block table and slot mapping, from the manager's tables, with array ops.

        Raises:
            ValueError: a sequence runs with more tokens than it holds (allocate first).
        """
        size = self.manager.block_size
        table = self.manager.block_tables(batch.seq_ids, batch.seq_lens.cpu().numpy())
        # The sequence (row of the block table) of each new token: (num_tokens,)
        if batch.is_decode:
            token_rows = np.arange(batch.num_seqs)
        else:
            token_rows = np.repeat(
                np.arange(batch.num_seqs), np.diff(batch.query_start_loc.cpu().numpy())
            )
        positions = batch.positions.cpu().numpy()
        blocks = table[token_rows, positions // size].astype(np.int64)
        slot_mapping = blocks * size + positions % size
        return StepMetadata(
            batch=batch,
            block_table=torch.from_numpy(table).to(self.device),
            slot_mapping=torch.from_numpy(slot_mapping).to(self.device),
            block_size=size,
        )

    def write(self, layer: int, meta: StepMetadata, key: torch.Tensor, value: torch.Tensor) -> None:
        kv = self.kv_caches[layer]
        flat = kv.view(2, -1, self.num_kv_heads, self.head_dim)  # (2, num_slots, H, D)
        flat[0, meta.slot_mapping] = key.to(kv.dtype)
        flat[1, meta.slot_mapping] = value.to(kv.dtype)

    def copy_blocks(self, copies: list[tuple[int, int]]) -> None:
        """Give each ``dst`` block the K/V of its ``src`` block (copy-on-write, fork)."""
        if not copies:
            return
        src, dst = (torch.tensor(ids, device=self.device) for ids in zip(*copies, strict=True))
        for kv in self.kv_caches:
            kv[:, dst] = kv[:, src]


@dataclass(frozen=True)
class CacheUsage:
    """A cache's memory at one moment, in bytes of K/V (all layers).

    Attributes:
        capacity_bytes: the pool's size (for the naive cache: what it holds now).
        reserved_bytes: held by sequences, whether or not a token is written there yet.
        used_bytes: holding tokens that are part of a live sequence.
    """

    capacity_bytes: int
    reserved_bytes: int
    used_bytes: int

    @classmethod
    def of(cls, usage, bytes_per_slot: int) -> CacheUsage:
        """The bytes of a ``kvlab.cache.manager.KVUsage`` (counted in slots)."""
        return cls(
            capacity_bytes=usage.num_slots * bytes_per_slot,
            reserved_bytes=usage.num_reserved_slots * bytes_per_slot,
            used_bytes=usage.num_used_slots * bytes_per_slot,
        )

    @property
    def utilization(self) -> float:
        """used / reserved: 1.0 means no slot is reserved in vain."""
        return self.used_bytes / self.reserved_bytes if self.reserved_bytes else 1.0


@dataclass(frozen=True)
class BlockInfo:
    """One physical block (for the contiguous arena: one fixed-size cell), as the page map draws it.

    Attributes:
        block_id: index in the pool.
        ref_cnt: how many sequences hold it (0: free, or cached for prefix reuse).
        seq_ids: the sequences holding it.
        logical_index: its index in the first holder's block table (None when free).
        num_filled: tokens written in it.
        cached: it carries a ``block_hash`` and can serve a prefix-cache hit.
    """

    block_id: int
    ref_cnt: int
    seq_ids: tuple[int, ...]
    logical_index: int | None
    num_filled: int
    cached: bool
