"""The scheduler lab 04's learner completes: kvlab's ``Scheduler`` with its step left open.

``StepScheduler`` keeps everything of ``kvlab.engine.scheduler.Scheduler`` except the plan
of a step: its ``schedule`` calls the three methods the learner writes, ``schedule_running``
(running requests first; it calls ``preempt``), then, when nobody was preempted,
``admit_waiting`` (waiting ones, first come first served). Two helpers talk to the KV
bookkeeping for them: ``allocate`` (slots for a request's next tokens) and ``kv_admit``
(kvlab's own ``Scheduler.kv_admit``: the tokens a waiting request's first step computes, at
most ``budget``, or None when the pool's admission rule, watermark included, finds no room).

It supports the setting lab 04's build-it grades: continuous batching, first come first
served, preemption by recompute, one sample per request (``n=1``).
"""

from __future__ import annotations

from kvlab.engine.request import Request
from kvlab.engine.scheduler import Scheduler, SchedulerOutput


class StepScheduler(Scheduler):
    """``Scheduler`` whose step the learner writes (continuous, FCFS, recompute, n=1).

    What the learner's methods read and change:
        self.running: the running requests, oldest first.
        self.waiting: the waiting queue (iterate it in admission order; ``remove``,
            ``push_front``).
        self.config: ``max_num_seqs``, ``max_num_batched_tokens``.
        request.num_tokens (its prompt and the tokens it generated so far),
            request.num_computed_tokens (those already in the KV cache: the engine
            advances it after each step, never the scheduler), request.status.
        out.add(request, num_new), out.admitted, out.preempted.
    """

    def __init__(self, config, kv, num_cpu_blocks: int = 0) -> None:
        settings = {
            "scheduling": "continuous",
            "scheduling_policy": "fcfs",
            "preemption_mode": "recompute",
        }
        for name, allowed in settings.items():
            if getattr(config, name) != allowed:
                raise ValueError(
                    f"{name}={getattr(config, name)!r} is not allowed: a StepScheduler "
                    f"schedules with {name}={allowed!r} only"
                )
        super().__init__(config, kv, num_cpu_blocks)

    def schedule(self, now: float) -> SchedulerOutput:
        """One step: the running requests, then (when nobody was preempted) the waiting."""
        out = SchedulerOutput()
        budget = self.schedule_running(out, self.config.max_num_batched_tokens)
        if not out.preempted:
            self.admit_waiting(out, budget)
        for request in out.admitted:
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
        for victim in out.preempted:  # counted here, so the learner's preempt need not
            victim.num_preemptions += 1
        self.num_preemptions += len(out.preempted)
        return out

    # ---- the learner's three methods -----------------------------------------------------

    def schedule_running(self, out: SchedulerOutput, budget: int) -> int:
        """Give the running requests their next tokens; return the budget left."""
        raise NotImplementedError

    def preempt(self, victim: Request, out: SchedulerOutput) -> None:
        """Take ``victim``'s blocks and send it back to the head of the waiting queue."""
        raise NotImplementedError

    def admit_waiting(self, out: SchedulerOutput, budget: int) -> None:
        """Start waiting requests, first come first served, while they fit."""
        raise NotImplementedError

    # ---- helpers (kv_admit is the Scheduler's own) -----------------------------------------

    def allocate(self, request: Request, num_new: int, out: SchedulerOutput) -> None:
        """KV slots for ``request``'s next ``num_new`` tokens (copies noted in ``out``).

        Raises:
            CacheFullError: too few free blocks; nothing changed.
        """
        start = request.num_computed_tokens
        token_ids = request.token_ids[start : start + num_new]
        out.blocks_to_copy += self.kv.allocate_slots(request.seq_id, num_new, token_ids)
