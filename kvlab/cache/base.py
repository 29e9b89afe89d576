"""The interface between the model runner and wherever K and V live.

The runner never knows how a cache stores tokens. Each step it hands the cache a
``ForwardBatch`` (which sequences run and how many new tokens each brings), then, layer by
layer, ``write``s the new keys and values and ``read``s each sequence's whole context back
for attention. The naive cache (``kvlab.cache.naive``) grows one tensor per sequence like
Hugging Face's ``DynamicCache``; the contiguous and paged allocators place tokens in slots
of one preallocated pool. Swapping one for another changes no model code.

Token layout in a step (varlen, as in vLLM): the new tokens of all sequences are packed
into one flat batch of ``num_tokens``; sequence ``i`` owns rows
``query_start_loc[i]:query_start_loc[i+1]``.

    seq 0: |---- context (cached) ----|== new ==|
    seq 1: |-- context --|===== new (prefill) =====|
                                  seq_lens[i] = context + new

Not handled here: allocation policy (each cache decides), sampling, scheduling.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from kvlab.cache.manager import KVCacheManager


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
        """Pack sequences that already hold ``num_computed`` tokens and add ``num_new`` each."""
        if not (len(seq_ids) == len(num_computed) == len(num_new)):
            raise ValueError("seq_ids, num_computed and num_new must have the same length")
        if any(n <= 0 for n in num_new):
            raise ValueError(f"every sequence must bring at least one new token, got {num_new}")
        starts = [0]
        positions = []
        for done, new in zip(num_computed, num_new, strict=True):
            starts.append(starts[-1] + new)
            positions.extend(range(done, done + new))
        return cls(
            seq_ids=list(seq_ids),
            query_start_loc=torch.tensor(starts, dtype=torch.long, device=device),
            seq_lens=torch.tensor(
                [d + n for d, n in zip(num_computed, num_new, strict=True)],
                dtype=torch.long,
                device=device,
            ),
            positions=torch.tensor(positions, dtype=torch.long, device=device),
        )

    @property
    def num_seqs(self) -> int:
        return len(self.seq_ids)

    @property
    def num_tokens(self) -> int:
        return int(self.query_start_loc[-1])


class KVCache(ABC):
    """Storage for the keys and values of many sequences, for every layer.

    Life of a sequence: ``allocate_slots(seq_id, n)`` before each step that adds ``n``
    tokens (raises ``CacheFullError`` and changes nothing if they cannot fit), then the
    runner's ``write``/``read`` calls during the step, and ``free(seq_id)`` at the end.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int

    @abstractmethod
    def allocate_slots(self, seq_id: int, num_new_tokens: int) -> None:
        """Make room for ``num_new_tokens`` more tokens of ``seq_id`` (new or existing)."""

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Release everything ``seq_id`` holds."""

    @abstractmethod
    def num_tokens(self, seq_id: int) -> int:
        """Tokens ``seq_id`` has room for (written, or allocated for this step)."""

    def begin_step(self, batch: ForwardBatch) -> None:  # noqa: B027 (optional hook)
        """Called once before the layers run; slot-based caches compute slot mappings here."""

    @abstractmethod
    def write(
        self, layer: int, batch: ForwardBatch, key: torch.Tensor, value: torch.Tensor
    ) -> None:
        """Store this step's new keys and values, each (num_tokens, num_kv_heads, head_dim)."""

    @abstractmethod
    def read(
        self, layer: int, batch: ForwardBatch, index: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of sequence ``batch.seq_ids[index]``, each (seq_len, num_kv_heads, head_dim)."""

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
        kv_caches: per layer, one tensor whose dim 1 indexes the manager's blocks.
    """

    manager: KVCacheManager
    kv_caches: list[torch.Tensor]
    device: torch.device

    @property
    def bytes_per_slot(self) -> int:
        """K and V bytes of one token, all layers."""
        element = self.kv_caches[0].element_size()
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * element

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.manager

    def num_tokens(self, seq_id: int) -> int:
        return self.manager.num_tokens(seq_id)

    def free(self, seq_id: int) -> None:
        self.manager.free(seq_id)

    def usage(self) -> CacheUsage:
        return CacheUsage.of(self.manager.usage(), self.bytes_per_slot)

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
