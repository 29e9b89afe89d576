"""Preemption: when a running request's next tokens find no free block, whose blocks to take.

Each step the scheduler gives the running requests their next tokens first
(``kvlab.engine.scheduler``). When ``allocate_slots`` raises ``CacheFullError``,
``_preempt_until_fits`` frees memory until the request's tokens fit, one victim at a time:

    1. a request prefetched for a later step gives its device blocks back first
       (``kvlab.engine.scheduler_swap``): it has not run yet, so no work is lost;
    2. else the victim is the newest running request (FCFS), or under
       ``scheduling_policy="priority"`` the least important one (the largest
       ``priority``, then the latest arrival); it may be the request itself;
    3. the victim is preempted, as ``preemption_mode`` says:

    recompute   free its blocks and requeue it at the head of the waiting queue; its prompt
                and the tokens generated so far are computed again as one longer prompt
                (often cheaply: its full blocks are still in the prefix cache);
    swap        copy its blocks to a CPU pool (``kvlab.cache.swap``), free them, and copy them
                back later (``kvlab.engine.scheduler_swap``); when the CPU pool is full, the
                victim is recomputed instead.

Either way the request later produces exactly the tokens it would have produced without
the preemption: its sampled tokens are kept, and its random generator only advances when
it draws a token.

``Preemption`` is a part of ``kvlab.engine.scheduler.Scheduler``, split out so that the
scheduler's step reads on its own; it uses the scheduler's queues and counters and is not
meant to be used alone.

Not handled: choosing a victim by the memory it holds or the work it would lose (vLLM,
too, takes the newest or the least important), preempting only part of a request.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvlab.cache.manager import CacheFullError
from kvlab.engine.request import Request, RequestStatus
from kvlab.engine.scheduler_output import SchedulerOutput
from kvlab.engine.scheduler_swap import SwapScheduling, seats_of

if TYPE_CHECKING:
    from kvlab.engine.waiting_queue import WaitingQueue


class Preemption(SwapScheduling):
    """Victims, recompute, and swap-out (inherited), for the ``Scheduler`` that inherits them."""

    # Set by Scheduler.__init__.
    waiting: WaitingQueue
    num_preemptions: int

    def _preempt_until_fits(
        self, request: Request, num_new: int, out: SchedulerOutput
    ) -> tuple[bool, int]:
        """Free blocks until ``request``'s next tokens fit.

        Returns:
            whether they fit (False: ``request`` was preempted itself), and the tokens of
            victims already scheduled in this step, which go back to the step's token
            budget (as vLLM's scheduler gives them back).
        """
        start = request.num_computed_tokens
        token_ids = request.token_ids[start : start + num_new]
        given_back = 0
        while True:
            if not self._drop_prefetched():
                victim = self._pick_victim()
                if victim.status is RequestStatus.RUNNING and victim in out.requests:
                    given_back += out._remove(victim)  # priority: a less important one ran first
                self._preempt(victim, out)
                if victim is request:
                    return False, given_back
            try:
                out.blocks_to_copy += self.kv.allocate_slots(request.seq_id, num_new, token_ids)
                return True, given_back
            except CacheFullError:
                pass

    def _pick_victim(self) -> Request:
        if self.config.scheduling_policy == "priority":
            return max(self.running, key=lambda r: (r.priority, r.arrival_time, r.seq_id))
        return self.running[-1]

    def _preempt(self, victim: Request, out: SchedulerOutput) -> None:
        self.running.remove(victim)
        self.num_seats -= seats_of(victim)
        victim.num_preemptions += 1
        self.num_preemptions += 1
        out.preempted.append(victim)
        if self._swap_out(victim, out):
            return
        # Recompute (also the fallback when there is no CPU pool, or it is full).
        self.kv.free(victim.seq_id)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        self.waiting.push_front(victim)
