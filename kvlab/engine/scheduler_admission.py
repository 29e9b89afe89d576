"""Admission: which waiting requests start running this step, under each batching mode.

After the running (and swapped) requests have their tokens, the scheduler admits waiting
ones (``_admit_waiting``), in the waiting queue's order (FCFS or priority), while

    a seat is free         ``max_num_seqs`` sequences run at once (a request with ``n > 1``
                           samples takes a seat for each)
    the budget has tokens  each step computes at most ``max_num_batched_tokens`` (continuous)
    its first step fits    ``kv_admit``: the KV bookkeeping adopts the prompt's cached prefix
                           blocks and takes blocks for the rest, keeping the watermark free
                           (``KVCacheManager.admit``, the same rule the simulator uses)

and stops at the first that does not fit, so a long prompt at the head is not overtaken.
The batching mode decides who may be admitted at all:

    static      only when no batch is in progress; the batch then runs to completion
                (its own preempted members may come back, nobody else)
    dynamic     the same, but an empty engine waits for the batch to fill: it starts once
                max_num_seqs requests wait, or once the oldest has waited batch_timeout
                seconds (``next_wakeup`` tells the engine when to look again)
    continuous  any waiting request, every step

``Admission`` is a part of ``kvlab.engine.scheduler.Scheduler``, split out so that the
scheduler's step reads on its own; it uses the scheduler's queues and counters and is not
meant to be used alone.

Not handled: admitting out of order to fill a step (skipping a request that does not fit),
reserving seats for the requests of one user or tenant.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from kvlab.engine.request import Request, RequestStatus
from kvlab.engine.scheduler_output import SchedulerOutput
from kvlab.engine.scheduler_swap import seats_of

if TYPE_CHECKING:
    from kvlab.cache.manager import KVCacheManager
    from kvlab.engine.scheduler_config import SchedulerConfig
    from kvlab.engine.waiting_queue import WaitingQueue


class Admission:
    """The batching rule and KV admission, for the ``Scheduler`` that inherits them."""

    # Set by Scheduler.__init__.
    config: SchedulerConfig
    kv: KVCacheManager
    waiting: WaitingQueue
    running: list[Request]
    num_seats: int
    num_prompt_tokens_queried: int
    num_prompt_tokens_hit: int
    _batch: set[int]
    _continuous: bool

    def next_wakeup(self) -> float | None:
        """When a dynamic batch times out (the engine idles until then), else None."""
        if self.config.scheduling != "dynamic" or self._batch or not self.waiting:
            return None
        return self.waiting.oldest_arrival() + self.config.batch_timeout

    def _admit_waiting(self, out: SchedulerOutput, budget: float, now: float) -> None:
        if self._continuous:
            candidates: Iterator[Request] = iter(self.waiting)
        elif self._batch:
            # A batch is in progress: only its own preempted members may come back.
            candidates = (r for r in self.waiting if r.seq_id in self._batch)
        elif self._batch_is_ready(now):
            candidates = iter(self.waiting)
        else:
            return
        admitted = []
        for request in candidates:
            if budget <= 0 or self.num_seats + seats_of(request) > self.config.max_num_seqs:
                break
            num_new = self.kv_admit(request, budget)
            if num_new is None:
                break
            admitted.append(request)
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.num_seats += seats_of(request)
            out.add(request, num_new)
            out.admitted.append(request)
            budget -= num_new
            if not self._continuous:
                self._batch.add(request.seq_id)
        for request in admitted:
            self.waiting.remove(request)

    def kv_admit(self, request: Request, budget: float) -> int | None:
        """Start a waiting ``request`` in the KV pool if its first step fits.

        Its first step computes at most ``budget`` tokens of its prompt (prompt and
        outputs so far, after a preemption); cached prefix blocks are adopted, and
        ``request.num_computed_tokens`` set to the tokens they hold.

        Returns:
            the tokens its first step computes, or None when it does not fit (nothing
            changed).
        """
        admission = self.kv.admit(
            request.seq_id,
            request.token_ids,
            token_budget=budget,
            max_tokens=request.sampling_params.max_tokens - len(request.output_token_ids),
            # The reserve does not apply when nothing runs: a request that fits alone is
            # never starved.
            watermark=self.config.watermark if self.running else 0.0,
        )
        if admission is None:
            return None
        num_hit, num_new = admission
        self._count_prefix_lookup(request, num_hit)
        request.num_computed_tokens = num_hit
        return num_new

    def _may_admit(self, request: Request) -> bool:
        """Whether the batching rule lets ``request`` run now (a swapped one too)."""
        return self._continuous or request.seq_id in self._batch or not self._batch

    def _batch_is_ready(self, now: float) -> bool:
        """Static: a batch starts as soon as the last one is done. Dynamic: also when full
        or when the oldest waiting request has waited ``batch_timeout`` seconds."""
        if self.config.scheduling == "static":
            return True
        if len(self.waiting) >= self.config.max_num_seqs:
            return True
        # NOTE: the same sum as next_wakeup, so that an engine idling until exactly that
        # moment finds the batch ready (now - arrival could round just below the timeout).
        return now >= self.waiting.oldest_arrival() + self.config.batch_timeout

    def _count_prefix_lookup(self, request: Request, num_hit: int) -> None:
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_hit
        self.num_prompt_tokens_queried += request.num_tokens
        self.num_prompt_tokens_hit += num_hit
