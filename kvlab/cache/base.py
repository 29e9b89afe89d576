"""The interface between the model runner and wherever K and V live.

The runner never knows how a cache stores tokens. Each step it hands the cache a
``ForwardBatch`` (which sequences run and how many new tokens each brings) and gets back
the step's ``StepMetadata`` (``kvlab.cache.step``); then, layer by layer, it ``write``s the
new keys and values and attention ``read``s each sequence's context back, both through
that metadata. The naive cache (``kvlab.cache.naive``) grows one tensor per sequence like
Hugging Face's ``DynamicCache``; the contiguous and paged caches (``PooledKVCache``) place
tokens in slots of one preallocated pool and keep their bookkeeping in a
``kvlab.cache.manager.KVCacheManager``. Swapping one for another changes no model code.

Not handled here: allocation policy (each cache decides), sampling, scheduling.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from kvlab.cache.step import ForwardBatch, StepMetadata

if TYPE_CHECKING:
    from kvlab.cache.manager import KVCacheManager


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
