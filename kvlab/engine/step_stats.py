"""What one engine step did: ``StepStats``, the record ``on_step`` callbacks receive.

A run keeps one per step (``kvlab.engine.metrics.RunMetrics.steps``): which sequences ran
and with how many tokens, who started, finished, was preempted or swapped, the queue
depths and the KV memory after the step. Labs draw timelines, queue plots and page-map
replays from them.

Not handled: per-request latencies (``kvlab.engine.metrics.RequestMetrics``), what the
step computed for the cost clock (``kvlab.engine.step_cost.StepWork``).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvlab.engine.request import Request
    from kvlab.engine.scheduler import Scheduler, SchedulerOutput

_REQUEST_ID = operator.attrgetter("request_id")
_SAMPLE_INDEX = operator.attrgetter("sample_index")


@dataclass(frozen=True)
class StepStats:
    """What one engine step did; ``on_step`` callbacks receive it.

    Attributes:
        step: index of the step (from 0).
        time: the clock when the step ended.
        scheduled_ids, scheduled_samples, scheduled_num_tokens: ``request_id``,
            ``sample_index`` and new tokens of each sequence computed, in row order
            (``scheduled`` zips them). Three flat tuples, not one tuple per sequence: a
            run keeps every step's stats, and thousands of small tuples per step would
            keep the garbage collector busy.
        num_prefill_tokens, num_decode_tokens: this step's tokens, split by kind.
        admitted, finished: ``request_id`` of samples that started or ended this step.
        preempted, swapped_out, swapped_in: samples moved by memory pressure this step.
        num_blocks_swapped, num_blocks_prefetched: KV blocks copied to or from CPU memory
            that the step waited for, and those copied back while it computed (prefetch).
        num_running, num_waiting, num_swapped: queue depths after the step.
        kv_usage: share of the KV pool held by sequences after the step (0..1).
        kv_utilization: share of the held KV memory that holds tokens (used / reserved).
        num_free_blocks: KV units allocatable now: blocks, cached ones included (paged), or
            slots (contiguous).
    """

    step: int
    time: float
    scheduled_ids: tuple[str, ...]
    scheduled_samples: tuple[int, ...]
    scheduled_num_tokens: tuple[int, ...]
    num_prefill_tokens: int
    num_decode_tokens: int
    admitted: tuple[str, ...]
    finished: tuple[str, ...]
    preempted: tuple[str, ...]
    swapped_out: tuple[str, ...]
    swapped_in: tuple[str, ...]
    num_blocks_swapped: int
    num_blocks_prefetched: int
    num_running: int
    num_waiting: int
    num_swapped: int
    kv_usage: float
    kv_utilization: float
    num_free_blocks: int

    @classmethod
    def of(
        cls,
        step: int,
        now: float,
        out: SchedulerOutput,
        finished: list[Request],
        num_decode: int,
        scheduler: Scheduler,
    ) -> StepStats:
        """The stats of a step that ran ``out`` and finished ``finished``, read once the
        finished samples freed their memory."""
        kv = scheduler.kv
        usage = kv.usage()  # counted as blocks come and go: O(1)
        requests = out.requests
        held = usage.num_reserved_slots
        return cls(
            step=step,
            time=now,
            scheduled_ids=tuple(map(_REQUEST_ID, requests)),
            scheduled_samples=tuple(map(_SAMPLE_INDEX, requests)),
            scheduled_num_tokens=tuple(out.num_new_tokens),
            num_prefill_tokens=out.num_tokens - num_decode,
            num_decode_tokens=num_decode,
            admitted=tuple(r.request_id for r in out.admitted),
            finished=tuple(r.request_id for r in finished),
            preempted=tuple(r.request_id for r in out.preempted),
            swapped_out=tuple(r.request_id for r in out.swapped_out),
            swapped_in=tuple(r.request_id for r in out.swapped_in),
            num_blocks_swapped=out.num_blocks_swapped,
            num_blocks_prefetched=out.num_blocks_prefetched,
            num_running=len(scheduler.running),
            num_waiting=len(scheduler.waiting),
            num_swapped=len(scheduler.swapped),
            kv_usage=held / usage.num_slots,
            kv_utilization=usage.num_used_slots / held if held else 1.0,
            num_free_blocks=kv.num_free_blocks,
        )

    @property
    def scheduled(self) -> tuple[tuple[str, int, int], ...]:
        """``(request_id, sample_index, num_new_tokens)`` of each sequence computed."""
        return tuple(
            zip(self.scheduled_ids, self.scheduled_samples, self.scheduled_num_tokens, strict=True)
        )

    @property
    def num_scheduled(self) -> int:
        """Sequences computed in this step."""
        return len(self.scheduled_ids)
