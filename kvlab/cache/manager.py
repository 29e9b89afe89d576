"""KV bookkeeping: which token slots each sequence owns, with no tensor in sight.

A KV cache has two halves. The *bookkeeping* decides where every sequence's tokens go:
which blocks (or which range of slots) it holds, who shares what, what is free. The
*storage* holds the K/V tensors in those slots (``kvlab.cache.paged``,
``kvlab.cache.contiguous``). This module is the interface of the first half, the one the
scheduler talks to; it is plain Python (numpy arrays serve the block tables), so the
scheduler, the simulator and a learner's own allocator never touch a tensor. Two
implementations stand behind it:

    BlockManager       (kvlab.cache.block_manager)      paged: blocks of block_size
                                                        slots, ref_cnt, copy-on-write,
                                                        prefix cache
    ContiguousManager  (kvlab.cache.contiguous_manager) one reserved range per request
                                                        (its "blocks" are single slots)

A sequence's life, as the scheduler drives it:

    admit(seq_id, token_ids, ...)  -> (num_computed_tokens, num_new_tokens) or None
    allocate_slots(seq_id, n, ids) -> copies   each later step (decode: allocate_decode)
    fork(parent, child)            -> copies   parallel sampling
    free(seq_id)                               finished or preempted

Every change either succeeds or raises ``CacheFullError`` and changes nothing. A change
returns the ``(src, dst)`` block pairs whose K/V the storage must copy before the step
runs (copy-on-write, or a contiguous fork): the bookkeeping never copies data itself.

``usage()`` is kept as operations happen (no walk over the held blocks), so the engine can
read it every step at any scale.

Not handled here: the tensors, swapping to CPU memory (``kvlab.swap``), scheduling.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np


class CacheFullError(RuntimeError):
    """A cache cannot hold the tokens asked for; the message says why. Nothing was changed."""


@dataclass(frozen=True, slots=True)
class KVUsage:
    """The bookkeeping's memory at one moment, in token slots.

    Attributes:
        num_slots: slots in the pool.
        num_reserved_slots: slots held by some sequence, written or not.
        num_used_slots: slots holding a token of a live sequence (a shared block once).
    """

    num_slots: int
    num_reserved_slots: int
    num_used_slots: int


@dataclass
class DecodeAllocation:
    """What ``allocate_decode`` did.

    Attributes:
        num_allocated: the leading sequences that got their slot (all, unless the pool ran
            out: then the next one did not fit, and it and the rest are unchanged).
        copies: ``(src, dst)`` blocks to copy before writing, as from ``allocate_slots``.
    """

    num_allocated: int
    copies: list[tuple[int, int]]


class KVCacheManager(ABC):
    """The bookkeeping of one KV pool: the interface between the scheduler and the cache.

    Attributes:
        num_blocks: allocation units in the pool.
        block_size: token slots per unit (1 for a contiguous arena).
    """

    num_blocks: int
    block_size: int

    # ---- what the scheduler asks ---------------------------------------------------------

    @property
    @abstractmethod
    def num_free_blocks(self) -> int:
        """Units that can be handed out now (for a paged pool: evictable cached ones too)."""

    @abstractmethod
    def __contains__(self, seq_id: int) -> bool:
        """``seq_id`` holds memory here."""

    @abstractmethod
    def num_tokens(self, seq_id: int) -> int:
        """Token slots ``seq_id`` holds (written, or allocated for this step)."""

    @abstractmethod
    def seq_ids(self) -> list[int]:
        """The sequences that hold memory here."""

    @abstractmethod
    def held_slots(self, seq_id: int) -> int:
        """Slots ``seq_id`` holds, written or not: its blocks' slots, or its range."""

    @abstractmethod
    def usage(self) -> KVUsage:
        """Slots in the pool, reserved by sequences, holding their tokens; O(1)."""

    @abstractmethod
    def block_tables(self, seq_ids: Sequence[int], seq_lens):
        """(len(seq_ids), max_blocks) int32 numpy array: each sequence's first blocks, 0-padded.

        Args:
            seq_ids: the step's sequences.
            seq_lens: (len(seq_ids),) numpy array, tokens each holds after the step.

        Raises:
            ValueError: a sequence holds fewer slots than its seq_len (allocate first).
        """

    def external_fragmentation(self, request_size: int | None = None) -> int:
        """Free slots that a request of ``request_size`` slots cannot use (0 when any free
        unit serves any request, as a paged pool's blocks do)."""
        return 0

    def watermark_blocks(self, watermark: float) -> int:
        """Units the admission rule keeps free for a ``watermark`` share of the pool, rounded
        down as vLLM 0.32.0 does (``KVCacheManager.watermark_blocks``,
        ``vllm/v1/core/kv_cache_manager.py``; its V0 block manager did the same)."""
        return int(watermark * self.num_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        """Units that ``num_tokens`` tokens fill."""
        return -(-num_tokens // self.block_size)

    def check_request(self, prompt_len: int, max_tokens: int, max_model_len: int) -> str | None:
        """Why a request could never run here, even alone; None when it could.

        A request is sized by its longest possible sequence, ``prompt_len + max_tokens``
        capped at ``max_model_len``.
        """
        need = self.blocks_for(min(prompt_len + max_tokens, max_model_len))
        if need > self.num_blocks:
            return (
                f"it needs {need} KV blocks ({prompt_len} prompt + {max_tokens} max_tokens, "
                f"block_size={self.block_size}) but the KV pool has only "
                f"num_blocks={self.num_blocks}"
            )
        return None

    def admit(
        self,
        seq_id: int,
        token_ids: Sequence[int],
        *,
        token_budget: float,
        max_tokens: int,
        watermark: float = 0.0,
    ) -> tuple[int, int] | None:
        """The admission rule: start ``seq_id`` if its first step fits above the watermark.

        The first step computes the tokens not found in the prefix cache, at most
        ``token_budget`` of them. They fit when, after taking their blocks, at least
        ``int(watermark * num_blocks)`` blocks are still free: the reserve that lets
        running sequences grow without being preempted.

        Args:
            seq_id: a new sequence.
            token_ids: its tokens so far (the prompt, plus outputs after a preemption).
            token_budget: tokens this step may still compute, >= 1 (inf: no budget).
            max_tokens: output tokens it may still generate (sizes a contiguous range).
            watermark: share of the pool to keep free, in [0, 1).

        Returns:
            ``(num_computed_tokens, num_new_tokens)``: tokens found cached, and tokens
            allocated for this step. None when it does not fit; nothing changed then.
        """
        plan = self.plan_admission(token_ids, token_budget, max_tokens)
        if plan is None:
            return None
        num_computed, num_new, need = plan
        if self.num_free_blocks - need < self.watermark_blocks(watermark):
            return None
        self.add_sequence(seq_id, token_ids, max_tokens)
        try:
            copies = self.allocate_slots(seq_id, num_new, token_ids[num_computed:][:num_new])
        except CacheFullError:
            self.free(seq_id)  # not expected: plan_admission counted them
            return None
        assert not copies, "a new sequence shares no partly filled block"
        return num_computed, num_new

    @abstractmethod
    def plan_admission(
        self, token_ids: Sequence[int], token_budget: float, max_tokens: int
    ) -> tuple[int, int, int] | None:
        """What admitting a sequence would take now, changing nothing.

        Returns:
            ``(num_computed_tokens, num_new_tokens, num_blocks)``: tokens the prefix cache
            holds already, tokens its first step computes (at most ``token_budget``), and
            free units it would take. None when it cannot fit at all.
        """

    # ---- changes -------------------------------------------------------------------------

    @abstractmethod
    def add_sequence(self, seq_id: int, token_ids: Sequence[int], max_tokens: int) -> int:
        """Register ``seq_id`` (adopting cached prefix blocks); return tokens already computed.

        Raises:
            CacheFullError: there is no room for it; nothing changes.
        """

    @abstractmethod
    def allocate_slots(
        self, seq_id: int, num_new_tokens: int, token_ids: Sequence[int] | None = None
    ) -> list[tuple[int, int]]:
        """Make room for ``num_new_tokens`` more tokens of ``seq_id``.

        Args:
            token_ids: their ids, if known (a paged pool hashes the blocks they complete).

        Returns:
            ``(src, dst)`` blocks to copy before this step writes.

        Raises:
            CacheFullError: they do not fit; nothing changes.
        """

    def allocate_decode(
        self, seq_ids: Sequence[int], token_ids: Sequence[int] | None = None
    ) -> DecodeAllocation:
        """One more slot for each sequence, in order, stopping at the first that does not fit.

        The same as ``allocate_slots(seq_id, 1, [token_id])`` for each; an implementation
        may do it faster.
        """
        copies: list[tuple[int, int]] = []
        for index, seq_id in enumerate(seq_ids):
            ids = None if token_ids is None else (token_ids[index],)
            try:
                copies += self.allocate_slots(seq_id, 1, ids)
            except CacheFullError:
                return DecodeAllocation(index, copies)
        return DecodeAllocation(len(seq_ids), copies)

    @abstractmethod
    def fork(self, parent_seq_id: int, child_seq_id: int) -> list[tuple[int, int]]:
        """Start ``child_seq_id`` as a copy of its parent; return the blocks to copy.

        Raises:
            CacheFullError: no room for the child; nothing changes.
        """

    @abstractmethod
    def free(self, seq_id: int) -> None:
        """Release everything ``seq_id`` holds."""


def not_held_error(seq_ids: Sequence[int], seq_lens, held) -> ValueError:
    """The error for a step in which a sequence runs with more tokens than it holds slots
    for, naming the first such sequence (``block_tables`` raises it).

    Args:
        seq_lens, held: numpy arrays (or sequences) of ints, one entry per sequence; in at
            least one entry ``seq_lens`` exceeds ``held``.
    """
    i = int(np.flatnonzero(np.asarray(seq_lens) > np.asarray(held))[0])
    return ValueError(
        f"seq {seq_ids[i]} runs with seq_len {int(seq_lens[i])} but holds {int(held[i])} "
        "slots: call allocate_slots first"
    )
