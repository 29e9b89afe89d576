"""The swap half of the scheduler: preempted requests parked in CPU memory, and brought back.

With ``preemption_mode="swap"`` a preempted request's blocks are copied to a CPU pool
(``kvlab.cache.swap.SwapSpace``) instead of being freed and recomputed:

    _swap_out         the victim's blocks to CPU memory; it joins ``swapped``
    _resume_swapped   each step, oldest first: its blocks back to the device, then it runs
    prefetch          after a step is planned: start copying back the requests the next
                      step may resume, while this step computes (the seed article's
                      Prefetch Engine)
    _drop_prefetched  memory ran short: give a prefetched request's device blocks back

``SwapScheduling`` is a part of ``kvlab.engine.scheduler.Scheduler``, split out so that
the scheduler's core (batching, admission, recompute) reads on its own; it uses the
scheduler's queues and counters and is not meant to be used alone.

Each step's ``SchedulerOutput`` counts the blocks it moved: ``num_blocks_swapped`` (out,
and in without a prefetch: the step waits for them) and ``num_blocks_prefetched`` (copies
that run while the step computes). The step-cost clock charges the first in full and the
second only where the copy outlasts the step (``kvlab.engine.step_cost``).

Not handled: swapping a request in pieces.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from kvlab.cache.manager import CacheFullError
from kvlab.engine.request import Request, RequestStatus
from kvlab.engine.scheduler_output import SchedulerOutput

if TYPE_CHECKING:
    from kvlab.cache.manager import KVCacheManager
    from kvlab.cache.swap import SwapSpace
    from kvlab.engine.scheduler_config import SchedulerConfig


def seats_of(request: Request) -> int:
    """Seats a request holds: one, plus one per sample still to be forked from it."""
    n = request.sampling_params.n
    if n > 1 and request.sample_index == 0 and not request.output_token_ids:
        return n
    return 1


class SwapScheduling:
    """Swap-out, swap-in and prefetch, for the ``Scheduler`` that inherits them."""

    # Set by Scheduler.__init__.
    config: SchedulerConfig
    kv: KVCacheManager
    swap_space: SwapSpace | None
    running: list[Request]
    swapped: deque[Request]
    num_seats: int
    num_swap_outs: int
    num_swap_ins: int
    num_prefetched: int

    def _may_admit(self, request: Request) -> bool:
        """Whether the batching rule lets ``request`` run now; ``Admission`` defines it."""
        raise NotImplementedError

    def _swap_out(self, victim: Request, out: SchedulerOutput) -> bool:
        """Park a preempted victim's blocks in CPU memory; False if there is no room there
        (or nothing to keep), and the victim is recomputed instead."""
        swap = self.swap_space
        if swap is None or not victim.num_computed_tokens:
            return False
        if not swap.can_swap_out(victim.num_computed_tokens):
            return False
        # The victim may have run earlier in this step (priority mode): its blocks must
        # hold their copies before they are swapped out.
        swap.copy_blocks(out.blocks_to_copy)
        out.blocks_to_copy.clear()
        swap.swap_out(victim.seq_id, victim.num_computed_tokens)
        out.num_blocks_swapped += swap.blocks_for(victim.num_computed_tokens)
        victim.status = RequestStatus.SWAPPED
        self.swapped.append(victim)
        self.num_swap_outs += 1
        out.swapped_out.append(victim)
        return True

    def _resume_swapped(self, out: SchedulerOutput, budget: float) -> float:
        swap = self.swap_space
        while self.swapped and budget > 0 and self._may_admit(self.swapped[0]):
            request = self.swapped[0]
            if self.num_seats + seats_of(request) > self.config.max_num_seqs:
                break
            try:
                # 0 blocks if a prefetch already copied them back: this step does not wait.
                out.num_blocks_swapped += swap.swap_in(
                    request.seq_id, request.token_ids[: request.num_computed_tokens]
                )
            except CacheFullError:
                break
            num_new = min(request.num_tokens - request.num_computed_tokens, budget)
            start = request.num_computed_tokens
            try:
                out.blocks_to_copy += self.kv.allocate_slots(
                    request.seq_id, num_new, request.token_ids[start : start + num_new]
                )
            except CacheFullError:
                swap.undo_swap_in(request.seq_id)
                break
            self.swapped.popleft()
            swap.release(request.seq_id)
            self.num_swap_ins += 1
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.num_seats += seats_of(request)
            out.swapped_in.append(request)
            out.add(request, num_new)
            budget -= num_new
        return budget

    def prefetch(self, out: SchedulerOutput) -> list[Request]:
        """Start copying swapped requests back before the step that will resume them.

        Call it after ``schedule`` planned ``out`` (this step's blocks are taken); the
        copies run while that step computes, and ``out.num_blocks_prefetched`` counts them.
        A swapped request is prefetched when the batching rule and the seats would let it
        run, and its blocks fit with room to spare: one block for every running sequence
        (each may need one next step) plus the watermark. Off with ``config.prefetch``.

        Returns:
            the requests whose copy started.
        """
        swap = self.swap_space
        if swap is None or not self.config.prefetch:
            return []
        started = []
        seats = self.num_seats
        for request in self.swapped:
            if not self._may_admit(request) or seats + seats_of(request) > self.config.max_num_seqs:
                break
            seats += seats_of(request)
            if swap.is_resident(request.seq_id):
                continue
            need = self.kv.blocks_for(request.num_tokens)
            spare = len(self.running) + self.kv.watermark_blocks(self.config.watermark)
            if self.kv.num_free_blocks - need < spare:
                break
            try:
                out.num_blocks_prefetched += swap.swap_in(
                    request.seq_id, request.token_ids[: request.num_computed_tokens]
                )
            except CacheFullError:
                break
            self.num_prefetched += 1
            started.append(request)
        return started

    def _drop_prefetched(self) -> bool:
        """Give back the device blocks of one prefetched request (newest first)."""
        swap = self.swap_space
        if swap is None:
            return False
        for request in reversed(self.swapped):
            if swap.is_resident(request.seq_id):
                swap.undo_swap_in(request.seq_id)
                self.num_prefetched -= 1
                return True
        return False

    def _drop_swapped(self, request: Request) -> None:
        self.swap_space.undo_swap_in(request.seq_id)
        self.swap_space.release(request.seq_id)
        self.swapped.remove(request)
