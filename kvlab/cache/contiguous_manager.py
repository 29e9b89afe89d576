"""Contiguous bookkeeping: one reserved range of slots per request, behind the manager interface.

``ContiguousManager`` is the contiguous implementation of
``kvlab.cache.manager.KVCacheManager``: a request is admitted only when its whole
reservation (sized by the policy, see ``kvlab.cache.contiguous_arena``) fits in one hole
of the arena, and each later step just fills more of its own range. Its allocation unit
is a single slot (``block_size == 1``), so the copies a fork returns are slot pairs.

    admit:   reserve prompt + (policy's share of max_tokens) slots, first-fit
    step:    grow inside the range; past its end: CacheFullError (a range cannot grow)
    fork:    a second whole range, every token copied (contiguous memory cannot be shared)

Not handled: prefix caching (nothing is ever found cached), compaction, swapping.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvlab.cache.contiguous_arena import ContiguousArena, Range, reservation_size
from kvlab.cache.manager import KVCacheManager, KVUsage, not_held_error


class ContiguousManager(KVCacheManager):
    """Per-request ranges in one ``ContiguousArena`` of ``num_slots`` slots.

    Args:
        num_slots: token slots in the arena.
        reservation_policy: how much a request reserves: ``"max_model_len"``, ``"pow2"``
            or ``"exact"``.
        max_model_len: the longest sequence; defaults to ``num_slots``.
        arena: the arena that places the ranges (default: kvlab's first-fit one); lab 02's
            build-it exercise passes the learner's (``kvlab.exercises.build_arena``).
    """

    block_size = 1

    def __init__(
        self,
        num_slots: int,
        reservation_policy: str,
        max_model_len: int | None = None,
        arena: ContiguousArena | None = None,
    ) -> None:
        if arena is not None and arena.num_slots != num_slots:
            raise ValueError(f"arena has {arena.num_slots} slots; num_slots={num_slots}")
        self.arena = arena if arena is not None else ContiguousArena(num_slots)
        self.num_blocks = num_slots
        self.reservation_policy = reservation_policy
        self.max_model_len = max_model_len or num_slots
        self.reservation(1, 0)  # validates the policy's name

    @property
    def num_free_blocks(self) -> int:
        return self.arena.num_free_slots

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self.arena

    def seq_ids(self) -> list[int]:
        return self.arena.seq_ids()

    def num_tokens(self, seq_id: int) -> int:
        return self.arena.range_of(seq_id).num_tokens

    def held_slots(self, seq_id: int) -> int:
        return self.arena.range_of(seq_id).num_slots

    def range_of(self, seq_id: int) -> Range:
        return self.arena.range_of(seq_id)

    def usage(self) -> KVUsage:
        arena = self.arena
        return KVUsage(arena.num_slots, arena.num_reserved_slots, arena.num_used_slots)

    def external_fragmentation(self, request_size: int | None = None) -> int:
        return self.arena.external_fragmentation(request_size)

    def block_tables(self, seq_ids: Sequence[int], seq_lens: np.ndarray) -> np.ndarray:
        """Each row: the slots of one range, in order (a "block" here is one slot)."""
        ranges = [self.arena.range_of(seq_id) for seq_id in seq_ids]
        held = np.array([r.num_tokens for r in ranges], dtype=np.int64)
        if (seq_lens > held).any():
            raise not_held_error(seq_ids, seq_lens, held)
        starts = np.array([r.start for r in ranges], dtype=np.int32)
        offsets = np.arange(int(seq_lens.max(initial=0)), dtype=np.int32)
        table = starts[:, None] + offsets[None, :]
        table[offsets[None, :] >= seq_lens[:, None]] = 0
        return table

    def check_request(self, prompt_len: int, max_tokens: int, max_model_len: int) -> str | None:
        need = self.reservation(prompt_len, max_tokens)
        if need > self.num_blocks:
            return (
                f"it reserves {need} KV slots (reservation_policy="
                f"{self.reservation_policy!r}) but the contiguous pool has only {self.num_blocks}"
            )
        return None

    def plan_admission(
        self, token_ids: Sequence[int], token_budget: float, max_tokens: int
    ) -> tuple[int, int, int] | None:
        size = self.reservation(len(token_ids), max_tokens)
        if not self.arena.can_reserve(size):
            return None
        return 0, int(min(len(token_ids), token_budget)), size

    def add_sequence(self, seq_id: int, token_ids: Sequence[int], max_tokens: int | None) -> int:
        """Reserve ``seq_id``'s whole range under the policy; return 0 (nothing is cached).

        Raises:
            CacheFullError: no hole is long enough; nothing changes.
        """
        num_slots = self.reservation(len(token_ids), max_tokens)
        if num_slots > self.num_blocks:
            raise ValueError(
                f"seq {seq_id} would reserve {num_slots} slots under reservation_policy="
                f"{self.reservation_policy!r}; the arena has only {self.num_blocks}"
            )
        self.arena.reserve(seq_id, num_slots)
        return 0

    def allocate_slots(
        self, seq_id: int, num_new_tokens: int, token_ids: Sequence[int] | None = None
    ) -> list[tuple[int, int]]:
        """Take ``num_new_tokens`` more slots inside ``seq_id``'s range (``token_ids`` unused).

        A ``seq_id`` never declared with ``add_sequence`` is declared here, its first tokens
        taken as its prompt; only the "max_model_len" policy can size it without ``max_tokens``.
        """
        if seq_id not in self.arena:
            if self.reservation_policy != "max_model_len":
                raise KeyError(
                    f"seq {seq_id} has no reservation; with reservation_policy="
                    f"{self.reservation_policy!r} declare it first with add_request(seq_id, "
                    "prompt_token_ids, max_tokens)"
                )
            self.add_sequence(seq_id, range(num_new_tokens), None)
        self.arena.grow(seq_id, num_new_tokens)
        return []

    def fork(self, parent_seq_id: int, child_seq_id: int) -> list[tuple[int, int]]:
        """A second range as long as the parent's; each of its tokens is a slot to copy."""
        parent = self.arena.range_of(parent_seq_id)
        start = self.arena.reserve(child_seq_id, parent.num_slots)
        if parent.num_tokens:
            self.arena.grow(child_seq_id, parent.num_tokens)
        return [(parent.start + i, start + i) for i in range(parent.num_tokens)]

    def free(self, seq_id: int) -> None:
        self.arena.free(seq_id)

    def reservation(self, prompt_len: int, max_tokens: int | None) -> int:
        """Slots a request of ``prompt_len`` tokens and ``max_tokens`` outputs reserves."""
        return reservation_size(self.reservation_policy, prompt_len, max_tokens, self.max_model_len)
