"""The simulator's memory: kvlab's real KV bookkeeping, with no tensors behind it.

``PagedMemory`` wraps a ``BlockManager``, ``ContiguousMemory`` a ``ContiguousManager``;
both admit through ``KVCacheManager.admit``, the engine scheduler's own rule (the
watermark applies only while something runs). The replay (``kvlab.sim.simulator``)
drives them; they report what a request holds and what is reserved, in slots.

Not handled: prefix caching (stand-in prompts share nothing), swapping.
"""

from __future__ import annotations

import math

from kvlab.cache.block_manager import BlockManager
from kvlab.cache.contiguous_manager import ContiguousManager
from kvlab.cache.manager import KVCacheManager
from kvlab.sim.trace import Trace


class SimMemory:
    """A manager, and the slots each running request holds in it."""

    def __init__(self, label: str, kv: KVCacheManager, watermark: float):
        self.label, self.kv, self.watermark = label, kv, watermark
        self.capacity = kv.usage().num_slots

    def admit(self, request: int, length: int, max_tokens: int, anything_running: bool):
        """Admit with the engine's rule; the slots the request now holds, or None."""
        admission = self.kv.admit(
            request,
            range(length),  # stand-in token ids: only their number matters here
            token_budget=math.inf,
            max_tokens=max_tokens,
            watermark=self.watermark if anything_running else 0.0,
        )
        return None if admission is None else self.held(request)

    def held(self, request: int) -> int:
        return self.kv.blocks_for(self.kv.num_tokens(request)) * self.kv.block_size

    def free(self, request: int) -> None:
        self.kv.free(request)

    @property
    def reserved(self) -> int:
        return self.kv.usage().num_reserved_slots


class PagedMemory(SimMemory):
    """Blocks from a ``BlockManager``; a request grows one block at a time."""

    def __init__(self, trace: Trace, num_slots: int, block_size: int, watermark: float):
        manager = BlockManager(num_slots // block_size, block_size, enable_prefix_caching=False)
        super().__init__(f"paged/{block_size}", manager, watermark)
        largest = max(final_lens(trace))
        if manager.blocks_for(largest) > manager.num_blocks:
            raise ValueError(f"a {largest}-token request exceeds {self.capacity} KV slots")

    def grow(self, request: int, length: int) -> int:
        """Let a running request reach ``length`` tokens (one more block); its new capacity."""
        self.kv.allocate_slots(request, length - self.kv.num_tokens(request))
        return self.held(request)

    def can_grow(self) -> bool:
        return self.kv.num_free_blocks > 0

    def external_fragmentation(self, request: int) -> int:
        return 0  # any free block serves any request


# The simulator knows each request's true output length and sizes its reservation from it,
# as the paper's Orca (Pow2) and Orca (Oracle) baselines do. So its "pow2" and "exact" are
# clairvoyant, and their labels say so, apart from the engine's policies of the same names
# (lab 02), which size from the max_tokens a request declares. ("Oracle" in kvlab means a
# trusted reference result, never an allocator.)
LABELS = {"max_model_len": "max_model_len", "pow2": "clairvoyant-pow2", "exact": "clairvoyant"}


class ContiguousMemory(SimMemory):
    """One reservation per request in a ``ContiguousManager``, sized by ``reservation_policy``
    from the request's true output length (labels in ``LABELS``)."""

    def __init__(self, trace: Trace, num_slots: int, reservation_policy: str, max_model_len: int):
        manager = ContiguousManager(num_slots, reservation_policy, max_model_len)
        super().__init__(f"contiguous/{LABELS[reservation_policy]}", manager, 0.0)
        self.arena = manager.arena
        self.sizes = [
            manager.reservation(p, o)
            for p, o in zip(trace.prompt_lens, trace.output_lens, strict=True)
        ]
        if max(self.sizes) > num_slots:
            raise ValueError(f"a {max(self.sizes)}-slot reservation exceeds {num_slots} slots")
        self._blocked: tuple[int, int] | None = None  # (request, arena version) that failed
        self._version = 0  # bumped whenever the arena changes
        self._external: tuple[tuple[int, int] | None, int] = (None, 0)  # memo per version

    def admit(self, request: int, length: int, max_tokens: int, anything_running: bool):
        # NOTE: the arena only changes on admit and free, so a head request that did not fit
        # keeps not fitting until then: skip the first-fit scan.
        if self._blocked == (request, self._version):
            return None
        held = super().admit(request, length, max_tokens, anything_running)
        if held is None:
            self._blocked = (request, self._version)
            return None
        self._version += 1
        return self.arena.range_of(request).num_slots

    def free(self, request: int) -> None:
        super().free(request)
        self._version += 1

    def external_fragmentation(self, request: int) -> int:
        key = (request, self._version)
        if self._external[0] != key:
            self._external = (key, self.arena.external_fragmentation(self.sizes[request]))
        return self._external[1]


def final_lens(trace: Trace) -> list[int]:
    """Slots each request holds at its end: prompt + output - 1 (the last token is only sampled)."""
    return [p + o - 1 for p, o in zip(trace.prompt_lens, trace.output_lens, strict=True)]
