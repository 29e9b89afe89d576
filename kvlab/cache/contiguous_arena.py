"""Contiguous allocation: every request reserves one unbroken range of token slots up front.

This is how serving systems before PagedAttention kept the KV cache (Orca, FasterTransformer,
and Hugging Face's static cache): attention kernels want each sequence's K/V in one
contiguous run, and a run cannot grow past its neighbour, so a request reserves room for
its final length before its first token. The final length is unknown, hence a policy:

* ``"max_model_len"``: reserve the longest sequence the model accepts (as Orca (Max) in
  the PagedAttention paper does);
* ``"pow2"``: reserve the prompt plus ``max_tokens`` rounded up to a power of two, capped
  at ``max_model_len``;
* ``"exact"``: reserve exactly the prompt plus ``max_tokens``.

``max_tokens`` is the output length a request *declares*, the most it may generate, not
the length it will reach: a request that stops early leaves the rest of its reservation
unused. So ``"pow2"`` and ``"exact"`` are not the paper's Orca (Pow2) and Orca (Oracle),
which size each reservation from the request's *true* output length. The simulator does
that with a trace's lengths and labels those runs ``contiguous/clairvoyant-pow2`` and
``contiguous/clairvoyant`` (``kvlab.sim.memory.LABELS``).

Ranges are placed first-fit in one arena of ``num_slots``; freeing a range leaves a hole.

    slots: |AAAAAAaaaa|.....|BBBbbbbbbbbbbbb|..|CCCCcc|..........|
            A: 6 used, 4 reserved      holes: 5, 2 and 10 slots

Waste, in slots:

* internal fragmentation: reserved by a request but not (yet) holding one of its tokens
  (``num_reserved_slots - num_used_slots``). The simulator, which knows each request's
  final length, splits it as the PagedAttention paper does: reservation (slots held for
  tokens still to come) and true internal fragmentation (slots past the final length,
  never used);
* external fragmentation: free slots in holes too small for a request of ``request_size``
  slots (``external_fragmentation(request_size)``). Without a size, it is every free slot
  outside the largest hole: the part of free memory that no single request can use.

Not handled: the K/V tensors (``kvlab.cache.contiguous``), compaction (moving ranges to
merge holes), growing a range in place.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from kvlab.cache.manager import CacheFullError

RESERVATION_POLICIES = ("max_model_len", "pow2", "exact")


def reservation_size(
    reservation_policy: str, prompt_len: int, max_tokens: int | None, max_model_len: int
) -> int:
    """Slots a request reserves under ``reservation_policy``.

    Args:
        reservation_policy: ``"max_model_len"``, ``"pow2"`` or ``"exact"``.
        prompt_len: prompt tokens.
        max_tokens: output tokens the request may generate (needed by "pow2" and "exact").
        max_model_len: the longest sequence the model accepts.
    """
    policy = reservation_policy
    if policy not in RESERVATION_POLICIES:
        raise ValueError(
            f"reservation_policy={policy!r} is not allowed: use one of {RESERVATION_POLICIES}"
        )
    if prompt_len <= 0:
        raise ValueError(f"prompt_len must be >= 1, got {prompt_len}")
    if policy == "max_model_len":
        if prompt_len > max_model_len:
            raise ValueError(f"prompt_len={prompt_len} exceeds max_model_len={max_model_len}")
        return max_model_len
    if max_tokens is None or max_tokens < 0:
        raise ValueError(f"reservation_policy={policy!r} needs max_tokens >= 0, got {max_tokens!r}")
    final_len = prompt_len + max_tokens
    if final_len > max_model_len:
        raise ValueError(
            f"prompt_len + max_tokens = {final_len} exceeds max_model_len={max_model_len}"
        )
    if policy == "exact":
        return final_len
    output_slots = 1 << (max_tokens - 1).bit_length() if max_tokens > 0 else 0
    return min(prompt_len + output_slots, max_model_len)


@dataclass
class Range:
    """One request's reservation: slots ``start .. start + num_slots - 1``, the first
    ``num_tokens`` of them holding its tokens."""

    start: int
    num_slots: int
    num_tokens: int = 0


class ContiguousArena:
    """``num_slots`` token slots handed out as contiguous ranges, first-fit.

    Attributes:
        num_slots: slots in the arena.
        num_reserved_slots: slots inside some request's range.
        num_used_slots: slots holding a token of a live request.
    """

    def __init__(self, num_slots: int) -> None:
        if not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        self.num_slots = num_slots
        self.num_reserved_slots = 0
        self.num_used_slots = 0
        self._ranges: dict[int, Range] = {}
        self._starts: list[tuple[int, int]] = []  # (start, seq_id), sorted by start

    # ---- queries -------------------------------------------------------------------------

    def __contains__(self, seq_id: int) -> bool:
        return seq_id in self._ranges

    def seq_ids(self) -> list[int]:
        return list(self._ranges)

    def range_of(self, seq_id: int) -> Range:
        """A copy of ``seq_id``'s reservation."""
        r = self._range(seq_id)
        return Range(r.start, r.num_slots, r.num_tokens)

    @property
    def num_free_slots(self) -> int:
        return self.num_slots - self.num_reserved_slots

    def holes(self) -> list[tuple[int, int]]:
        """Every free run as ``(start, length)``, in address order."""
        holes, cursor = [], 0
        for start, seq_id in self._starts:
            if start > cursor:
                holes.append((cursor, start - cursor))
            cursor = start + self._ranges[seq_id].num_slots
        if cursor < self.num_slots:
            holes.append((cursor, self.num_slots - cursor))
        return holes

    @property
    def largest_hole(self) -> int:
        return max((length for _, length in self.holes()), default=0)

    @property
    def internal_fragmentation(self) -> int:
        """Reserved slots that hold none of their owner's tokens (yet)."""
        return self.num_reserved_slots - self.num_used_slots

    def external_fragmentation(self, request_size: int | None = None) -> int:
        """Free slots that a request of ``request_size`` slots cannot use.

        Those are the slots in holes shorter than ``request_size``. Without a size: every
        free slot outside the largest hole (no single request can span two holes).
        """
        lengths = [length for _, length in self.holes()]
        if request_size is None:
            return sum(lengths) - max(lengths, default=0)
        return sum(length for length in lengths if length < request_size)

    def can_reserve(self, num_slots: int) -> bool:
        return self._first_fit(num_slots) is not None

    # ---- changes -------------------------------------------------------------------------

    def reserve(self, seq_id: int, num_slots: int) -> int:
        """Reserve ``num_slots`` contiguous slots for ``seq_id`` in the first hole that fits.

        Returns:
            The first slot of the range.

        Raises:
            CacheFullError: no hole is long enough (even if enough slots are free in
                total: that is external fragmentation); nothing changes.
        """
        if seq_id in self._ranges:
            raise ValueError(f"seq {seq_id} already holds a range")
        if not isinstance(num_slots, int) or num_slots <= 0:
            raise ValueError(f"num_slots must be a positive int, got {num_slots!r}")
        start = self._first_fit(num_slots)
        if start is None:
            raise CacheFullError(self._refusal(seq_id, num_slots))
        self._ranges[seq_id] = Range(start, num_slots)
        bisect.insort(self._starts, (start, seq_id))
        self.num_reserved_slots += num_slots
        return start

    def _refusal(self, seq_id: int, num_slots: int) -> str:
        """Why no hole takes ``num_slots``: too few free slots, or free slots in holes too
        short (external fragmentation)."""
        need = f"seq {seq_id} needs {num_slots} contiguous slots"
        free = self.num_free_slots
        if self.largest_hole == free:  # one hole (or none): the total is what is short
            return f"{need}; only {free} of {self.num_slots} are free"
        return (
            f"{need}; {free} of {self.num_slots} are free but the largest hole has "
            f"{self.largest_hole}"
        )

    def grow(self, seq_id: int, num_new_tokens: int) -> int:
        """Let ``seq_id`` hold ``num_new_tokens`` more tokens inside its range.

        Returns:
            The slot of the first new token.

        Raises:
            CacheFullError: the range is too short; nothing changes.
        """
        r = self._range(seq_id)
        if num_new_tokens <= 0:
            raise ValueError(f"num_new_tokens must be >= 1, got {num_new_tokens}")
        if r.num_tokens + num_new_tokens > r.num_slots:
            raise CacheFullError(
                f"seq {seq_id} reserved {r.num_slots} slots and holds {r.num_tokens} tokens; "
                f"{num_new_tokens} more do not fit (a contiguous range cannot grow)"
            )
        first = r.start + r.num_tokens
        r.num_tokens += num_new_tokens
        self.num_used_slots += num_new_tokens
        return first

    def free(self, seq_id: int) -> None:
        """Release ``seq_id``'s range; it becomes (part of) a hole."""
        r = self._range(seq_id)
        del self._starts[bisect.bisect_left(self._starts, (r.start, seq_id))]
        del self._ranges[seq_id]
        self.num_reserved_slots -= r.num_slots
        self.num_used_slots -= r.num_tokens

    # ---- helpers -------------------------------------------------------------------------

    def _range(self, seq_id: int) -> Range:
        try:
            return self._ranges[seq_id]
        except KeyError:
            raise KeyError(f"unknown seq_id {seq_id}; known: {sorted(self._ranges)}") from None

    def _first_fit(self, num_slots: int) -> int | None:
        for start, length in self.holes():
            if length >= num_slots:
                return start
        return None
