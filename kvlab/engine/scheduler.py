"""The batch scheduler: each step, which requests run and how many of their tokens.

One step, in the order lab 04 teaches it (the seed article's admit -> allocate -> compute
-> free):

    1. running requests get their next tokens (decode: 1; chunked prefill: a chunk);
       when no block is left, a running request is preempted (``_preempt_until_fits``):
       the newest (FCFS) or the least important (priority), recomputed or swapped out;
    2. swapped-out requests are copied back, oldest first (``_resume_swapped``);
    3. waiting requests are admitted in the queue's order while there are free seats
       (``max_num_seqs``), tokens in the budget and KV blocks above the watermark; their
       prompts first adopt the prefix cache's blocks, then allocate the rest
       (``_admit_waiting``).

The step's plan is a ``SchedulerOutput`` (at the end of this file). The engine executes
it: copies the blocks it lists, computes the step and frees what finished; a freed block
that holds a full, hashed block of tokens stays in the prefix cache until it is evicted.

What varies are objects the scheduler holds: the waiting queue's order (``WaitingQueue``:
first come, first served, or by priority), the swap planner (below), and the batching mode
(``SchedulerConfig.scheduling``), from the seed article's "static vs dynamic batching" to
what vLLM and every modern server do:

    StaticBatching      a batch of up to max_num_seqs requests is admitted together and
                        runs to completion; requests that arrive meanwhile wait
    DynamicBatching     the same, but an empty engine waits for the batch to fill: it starts
                        once max_num_seqs requests wait, or once the oldest has waited
                        batch_timeout seconds (the seed's max_batch_size and batch_timeout)
    ContinuousBatching  requests join and leave at every step (iteration-level scheduling,
                        Orca); each step computes at most max_num_batched_tokens tokens, so
                        a long prompt is computed over several steps (chunked prefill)

    step:    1      2      3      4      5      6
    static:  [A B]  [A B]  [A B]  [C D]  [C D]  ...    C, D wait for the whole batch
    contin.: [A B]  [A B]  [A B C D] ...               C, D join as soon as there is room

Preemption, as ``preemption_mode`` says:

    recompute   free the victim's blocks and requeue it at the head of the waiting queue;
                its prompt and the tokens generated so far are computed again as one longer
                prompt (often cheaply: its full blocks are still in the prefix cache)
    swap        park its blocks in a CPU pool and free them, and copy them back later;
                ``prefetch`` plans that copy a step ahead when memory allows (the seed
                article's Prefetch Engine). When the CPU pool is full, the victim is
                recomputed instead. The swap planner (``kvlab.engine.swap_planner``)
                decides which blocks move; the engine copies them.

Either way the request later produces exactly the tokens it would have produced without
the preemption: its sampled tokens are kept, and its random generator only advances when
it draws a token.

Not handled: multiple KV cache groups, speculative decoding, LoRA, pipeline parallelism;
admitting out of order to fill a step; choosing a victim by the memory it holds (vLLM,
too, takes the newest or the least important); swapping or preempting part of a request;
fairness between users, deadlines.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import deque
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from kvlab.cache.manager import CacheFullError, KVCacheManager
from kvlab.engine.request import Request, RequestStatus
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.engine.swap_planner import SwapPlanner


def seats_of(request: Request) -> int:
    """Seats a request holds: one, plus one per sample still to be forked from it."""
    n = request.sampling_params.n
    if n > 1 and request.sample_index == 0 and not request.output_token_ids:
        return n
    return 1


class Scheduler:
    """Decides every step who runs; allocates their KV slots; preempts when blocks run out.

    Args:
        config: how batches are formed, and their limits.
        kv: the KV bookkeeping (``kvlab.cache.manager.KVCacheManager``): the scheduler
            asks it whether a request fits and takes slots from it, and never sees a tensor.
        num_cpu_blocks: blocks of the CPU pool swapped blocks are parked in, for
            ``preemption_mode="swap"``.

    Attributes:
        waiting, running, swapped: the three queues.
        swap: the swap planner (``SwapPlanner``), or None without swapping.
        batching: the batching mode (``StaticBatching``, ``DynamicBatching``,
            ``ContinuousBatching``): who may join, and each step's token budget.
        num_seats: running sequences, plus the seats reserved for forks.
        num_preemptions, num_swap_outs, num_swap_ins: event counts; ``num_prefetched``
            counts the swap-ins a prefetch had already copied back (one dropped or aborted
            before it resumes counts nothing).
        num_prompt_tokens_queried, num_prompt_tokens_hit: prefix-cache lookups, in tokens.
    """

    def __init__(
        self, config: SchedulerConfig, kv: KVCacheManager, num_cpu_blocks: int = 0
    ) -> None:
        if not isinstance(kv, KVCacheManager):
            raise TypeError(
                f"kv={kv!r} is not allowed: the scheduler needs a kvlab.cache.KVCacheManager "
                "(a tensor cache has one as its .manager)"
            )
        self.config = config
        self.kv = kv
        self.swap = SwapPlanner(kv, num_cpu_blocks) if config.preemption_mode == "swap" else None
        self.batching = BATCHING[config.scheduling](config)
        self.waiting = WaitingQueue(config.scheduling_policy)
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.num_seats = 0
        self.reset_counters()

    def reset_counters(self) -> None:
        self.num_preemptions = self.num_swap_outs = self.num_swap_ins = self.num_prefetched = 0
        self.num_prompt_tokens_queried = self.num_prompt_tokens_hit = 0

    # ---- queues --------------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        """A request that has arrived joins the waiting queue."""
        request.status = RequestStatus.WAITING
        self.waiting.push(request)

    def add_forked(self, request: Request) -> None:
        """A sample forked from a running request runs at once, in a seat its parent reserved."""
        request.status = RequestStatus.RUNNING
        self.running.append(request)
        self.batching.joined(request)

    def fork_failed(self, request: Request) -> None:
        """A forked sample found no memory for its copy (contiguous cache).

        It gives back its seat; unless its first token already finished it, it waits and
        will compute its prompt (and that token) again, like a preempted request.
        """
        self.num_seats -= 1
        request.num_computed_tokens = 0
        if request.is_finished:
            request.status = RequestStatus.FINISHED
            return
        request.status = RequestStatus.WAITING
        self.waiting.push_front(request)
        self.batching.joined(request)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def next_wakeup(self) -> float | None:
        """When a dynamic batch times out (the engine idles until then), else None."""
        return self.batching.next_wakeup(self.waiting)

    def finish(self, request: Request) -> None:
        """Release a finished (or aborted) request's memory and seat."""
        if request.status is RequestStatus.RUNNING:
            self.kv.free(request.seq_id)
            self.num_seats -= seats_of(request)
            self.running.remove(request)
        elif request.status is RequestStatus.SWAPPED:
            self.swap.undo_swap_in(request.seq_id)
            self.swap.release(request.seq_id)
            self.swapped.remove(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        self.batching.left(request)

    def finish_running(self, finished: list[Request]) -> None:
        """Release many running requests at once (the engine's end of a step)."""
        if not finished:
            return
        for request in finished:
            self.kv.free(request.seq_id)
            self.num_seats -= seats_of(request)
            request.status = RequestStatus.FINISHED
            self.batching.left(request)
        self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]

    # ---- one step ------------------------------------------------------------------------

    def schedule(self, now: float) -> SchedulerOutput:
        """Plan one step at clock time ``now`` and allocate its KV slots."""
        out = SchedulerOutput()
        budget = self._schedule_running(out, self.batching.token_budget)
        if not out.preempted and self.swapped:
            budget = self._resume_swapped(out, budget)
        if not out.preempted and not self.swapped and self.waiting:
            self._admit_waiting(out, budget, now)
        for request in out.admitted:
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: float) -> float:
        """Give each running request, oldest first, its next tokens; return the budget left.

        A request's next tokens are all its uncomputed ones (one when it decodes), cut to
        the budget (a chunk of its prompt). When the KV pool has no room for them, running
        requests give way until they fit (``_preempt_until_fits``).
        """
        num_decoding = self._schedule_decodes(out)
        budget -= num_decoding
        for request in self.running[num_decoding:]:  # a copy: preemption changes the list
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this loop
            start = request.num_computed_tokens
            num_new = int(min(request.num_tokens - start, budget))
            if num_new == 0:
                break
            try:
                out.blocks_to_copy += self.kv.allocate_slots(
                    request.seq_id, num_new, request.token_ids[start : start + num_new]
                )
            except CacheFullError:
                fits, given_back = self._preempt_until_fits(request, num_new, out)
                budget += given_back
                if not fits:
                    continue  # it preempted itself
            out.add(request, num_new)
            budget -= num_new
        return budget

    def _schedule_decodes(self, out: SchedulerOutput) -> int:
        """Schedule the leading run of running requests that decode (one token each) in one
        ``kv.allocate_decode`` call; return how many were scheduled.

        The same as the loop of ``_schedule_running`` over them, only faster at thousands
        of sequences; it stops at the first request that does not fit, and the loop goes
        on from there (and preempts exactly where it would have). The budget, at least
        ``max_num_seqs`` tokens, covers one token for each of them.
        """
        seq_ids, token_ids = [], []
        for request in self.running:
            ids = request.token_ids
            if len(ids) - request.num_computed_tokens != 1:
                break
            seq_ids.append(request.seq_id)
            token_ids.append(ids[-1])
        if not seq_ids:
            return 0
        result = self.kv.allocate_decode(seq_ids, token_ids)
        out.blocks_to_copy += result.copies
        out.requests += self.running[: result.num_allocated]
        out.num_new_tokens += [1] * result.num_allocated
        return result.num_allocated

    # ---- preemption: who gives way when blocks run out -----------------------------------

    def _preempt_until_fits(
        self, request: Request, num_new: int, out: SchedulerOutput
    ) -> tuple[bool, int]:
        """Free blocks until ``request``'s next tokens fit, one victim at a time.

        A request prefetched for a later step gives its device blocks back first (it has
        not run yet: no work is lost); else the victim is the newest running request
        (FCFS), or the least important one under priority; it may be ``request`` itself.

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
                    given_back += out.remove(victim)  # priority: a less important one ran first
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

    # ---- swapping: preempted requests parked in CPU memory, and brought back -------------
    #
    # The swap planner takes and frees the blocks; this step's SchedulerOutput records the
    # copies (blocks_to_swap_out, blocks_to_swap_in: the step waits for them;
    # blocks_to_prefetch: they run while the step computes), and the engine makes them.

    def _swap_out(self, victim: Request, out: SchedulerOutput) -> bool:
        """Park a preempted victim's blocks in CPU memory; False if there is no room there
        (or nothing to keep), and the victim is recomputed instead."""
        swap = self.swap
        if swap is None or not victim.num_computed_tokens:
            return False
        if not swap.can_swap_out(victim.num_computed_tokens):
            return False
        # The victim may have run earlier in this step (priority mode): a block it took a
        # copy-on-write copy into is still empty, and its source is copied out instead.
        moves = swap.swap_out(victim.seq_id, victim.num_computed_tokens, out.blocks_to_copy)
        out.blocks_to_swap_out += moves
        victim.status = RequestStatus.SWAPPED
        self.swapped.append(victim)
        self.num_swap_outs += 1
        out.swapped_out.append(victim)
        return True

    def _resume_swapped(self, out: SchedulerOutput, budget: float) -> float:
        """Bring swapped requests back, oldest first, while they fit; they run this step."""
        swap = self.swap
        while self.swapped and budget > 0 and self.batching.may_admit(self.swapped[0]):
            request = self.swapped[0]
            if self.num_seats + seats_of(request) > self.config.max_num_seqs:
                break
            prefetched = swap.is_resident(request.seq_id)
            try:
                # No copy if a prefetch already brought it back: this step does not wait.
                moves = swap.swap_in(
                    request.seq_id, request.token_ids[: request.num_computed_tokens]
                )
            except CacheFullError:
                break
            # Copied even if the swap-in is undone below: its full blocks carry their hashes
            # from the moment they were taken, so they must hold their K/V when freed.
            out.blocks_to_swap_in += moves
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
            self.num_prefetched += prefetched
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            self.num_seats += seats_of(request)
            out.swapped_in.append(request)
            out.add(request, num_new)
            budget -= num_new
        return budget

    def prefetch(self, out: SchedulerOutput) -> list[Request]:
        """Plan copying swapped requests back a step before the step that will resume them.

        Call it after ``schedule`` planned ``out`` (this step's blocks are taken); the
        copies (``out.blocks_to_prefetch``) run while that step computes. A swapped
        request is prefetched when the batching mode and the seats would let it run, and
        its blocks fit with room to spare: one block for every running sequence (each may
        need one next step) plus the watermark. Off with ``config.prefetch``.

        Returns:
            the requests whose copy is planned.
        """
        swap = self.swap
        if swap is None or not self.config.prefetch:
            return []
        started = []
        seats = self.num_seats
        for request in self.swapped:
            if (
                not self.batching.may_admit(request)
                or seats + seats_of(request) > self.config.max_num_seqs
            ):
                break
            seats += seats_of(request)
            if swap.is_resident(request.seq_id):
                continue
            need = self.kv.blocks_for(request.num_tokens)
            spare = len(self.running) + self.kv.watermark_blocks(self.config.watermark)
            if self.kv.num_free_blocks - need < spare:
                break
            try:
                out.blocks_to_prefetch += swap.swap_in(
                    request.seq_id, request.token_ids[: request.num_computed_tokens]
                )
            except CacheFullError:
                break
            started.append(request)
        return started

    def _drop_prefetched(self) -> bool:
        """Give back the device blocks of one prefetched request (newest first)."""
        swap = self.swap
        if swap is None:
            return False
        for request in reversed(self.swapped):
            if swap.is_resident(request.seq_id):
                swap.undo_swap_in(request.seq_id)
                return True
        return False

    # ---- admission: who joins ------------------------------------------------------------

    def _admit_waiting(self, out: SchedulerOutput, budget: float, now: float) -> None:
        """Admit waiting requests in the queue's order, among those the batching mode lets
        in, while a seat, the budget and the KV pool (``kv_admit``) allow; stop at the first
        that does not fit, so a long prompt at the head is not overtaken."""
        admitted = []
        for request in self.batching.candidates(self.waiting, now):
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
            self.batching.joined(request)
        for request in admitted:
            self.waiting.remove(request)

    def kv_admit(self, request: Request, budget: float) -> int | None:
        """Start a waiting ``request`` in the KV pool if its first step fits.

        Its first step computes at most ``budget`` tokens of its prompt (prompt and
        outputs so far, after a preemption); cached prefix blocks are adopted, and
        ``request.num_computed_tokens`` set to the tokens they hold. The KV bookkeeping
        decides (``KVCacheManager.admit``, the same rule the simulator uses).

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
        if request.num_cached_tokens is None:
            request.num_cached_tokens = num_hit
        self.num_prompt_tokens_queried += request.num_tokens
        self.num_prompt_tokens_hit += num_hit
        request.num_computed_tokens = num_hit
        return num_new


# ---- the waiting queue: FCFS or priority ------------------------------------------------


class WaitingQueue:
    """The waiting requests, in admission order: first come, first served (``"fcfs"``), or
    by ``priority`` then arrival (``"priority"``); a preempted request goes back to the head
    (in priority order, to its rank)."""

    def __init__(self, scheduling_policy: str = "fcfs") -> None:
        self.scheduling_policy = scheduling_policy
        self._fcfs: deque[Request] = deque()
        self._heap: list[tuple[int, float, int, Request]] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._fcfs) if self.scheduling_policy == "fcfs" else len(self._heap)

    def __bool__(self) -> bool:
        return len(self) > 0

    def __iter__(self) -> Iterator[Request]:
        """Requests in the order they would be admitted (do not push or remove meanwhile)."""
        if self.scheduling_policy == "fcfs":
            return iter(self._fcfs)
        return iter([entry[-1] for entry in sorted(self._heap, key=lambda e: e[:3])])

    def push(self, request: Request) -> None:
        if self.scheduling_policy == "fcfs":
            self._fcfs.append(request)
        else:
            key = (request.priority, request.arrival_time, next(self._order), request)
            heapq.heappush(self._heap, key)

    def push_front(self, request: Request) -> None:
        """A preempted request: first in FCFS; in priority order by its priority and age."""
        if self.scheduling_policy == "fcfs":
            self._fcfs.appendleft(request)
        else:
            self.push(request)

    def remove(self, request: Request) -> None:
        if self.scheduling_policy == "fcfs":
            if self._fcfs and self._fcfs[0] is request:
                self._fcfs.popleft()
            else:
                self._fcfs.remove(request)
            return
        if self._heap and self._heap[0][-1] is request:
            heapq.heappop(self._heap)
            return
        self._heap = [entry for entry in self._heap if entry[-1] is not request]
        heapq.heapify(self._heap)

    def oldest_arrival(self) -> float:
        requests = self._fcfs if self.scheduling_policy == "fcfs" else [e[-1] for e in self._heap]
        return min(r.arrival_time for r in requests)


# ---- the batching modes ------------------------------------------------------------------


class ContinuousBatching:
    """Anyone may join at any step; a step computes at most ``max_num_batched_tokens``."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.config = config
        self.token_budget: float = config.max_num_batched_tokens

    def may_admit(self, request: Request) -> bool:
        """Whether ``request`` (waiting or swapped) may run now."""
        return True

    def candidates(self, waiting: WaitingQueue, now: float) -> Iterable[Request]:
        """The waiting requests that may be admitted this step, in admission order."""
        return iter(waiting)

    def next_wakeup(self, waiting: WaitingQueue) -> float | None:
        """When an idle engine should look again (None: when a request arrives)."""
        return None

    def joined(self, request: Request) -> None:
        """``request`` started running (admitted, forked, or requeued after a failed fork)."""

    def left(self, request: Request) -> None:
        """``request`` finished or was aborted."""


class StaticBatching(ContinuousBatching):
    """A batch is admitted together and runs to completion; no token budget per step.

    Attributes:
        batch: the seq_ids of the batch in progress (empty: the next may start).
    """

    def __init__(self, config: SchedulerConfig) -> None:
        super().__init__(config)
        self.token_budget = math.inf
        self.batch: set[int] = set()

    def may_admit(self, request: Request) -> bool:
        return request.seq_id in self.batch or not self.batch

    def candidates(self, waiting: WaitingQueue, now: float) -> Iterable[Request]:
        if self.batch:
            # A batch is in progress: only its own preempted members may come back.
            return (r for r in waiting if r.seq_id in self.batch)
        return iter(waiting) if self.batch_is_ready(waiting, now) else ()

    def batch_is_ready(self, waiting: WaitingQueue, now: float) -> bool:
        """Static: a batch starts as soon as the last one is done."""
        return True

    def joined(self, request: Request) -> None:
        self.batch.add(request.seq_id)

    def left(self, request: Request) -> None:
        self.batch.discard(request.seq_id)


class DynamicBatching(StaticBatching):
    """Static batches that an empty engine waits to fill: a batch starts once
    ``max_num_seqs`` requests wait, or once the oldest has waited ``batch_timeout``."""

    def batch_is_ready(self, waiting: WaitingQueue, now: float) -> bool:
        if len(waiting) >= self.config.max_num_seqs:
            return True
        # NOTE: the same sum as next_wakeup, so that an engine idling until exactly that
        # moment finds the batch ready (now - arrival could round just below the timeout).
        return now >= waiting.oldest_arrival() + self.config.batch_timeout

    def next_wakeup(self, waiting: WaitingQueue) -> float | None:
        if self.batch or not waiting:
            return None
        return waiting.oldest_arrival() + self.config.batch_timeout


BATCHING = {
    "static": StaticBatching,
    "dynamic": DynamicBatching,
    "continuous": ContinuousBatching,
}


# ---- the plan: what one step hands the engine --------------------------------------------
#
# The engine reads it to build the step's batch (``requests``, ``num_new_tokens``), to move
# and copy blocks before anything writes, to report what moved, and to time the swaps the
# step waits for or hides. It is vLLM's ``SchedulerOutput`` (``vllm/v1/core/sched/output.py``)
# cut to what kvlab needs, with the swap lists of vLLM's V0 scheduler. Not handled:
# per-request sampling metadata, structured-output masks, KV connector state.


@dataclass
class SchedulerOutput:
    """One step's plan: what to compute, and what moved.

    Attributes:
        requests: the sequences to compute, in row order.
        num_new_tokens: tokens of each to compute this step (its next, uncomputed ones).
        admitted: requests that got their first blocks this step (new or recomputed).
        preempted: requests that lost their blocks this step (both modes).
        swapped_out, swapped_in: the subset that went to / came back from the CPU pool.
        blocks_to_swap_out: ``(device_block, cpu_block)`` pairs to copy to CPU memory
            first: their device blocks are free now, and may be reused by this step.
        blocks_to_copy: ``(src, dst)`` blocks whose K/V the storage must copy next
            (copy-on-write), in order.
        blocks_to_swap_in: ``(cpu_block, device_block)`` pairs to copy back, which this
            step waits for: its resumed requests read them.
        blocks_to_prefetch: ``(cpu_block, device_block)`` pairs to copy back while this
            step computes, for requests a later step resumes (``Scheduler.prefetch``).
    """

    requests: list[Request] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    admitted: list[Request] = field(default_factory=list)
    preempted: list[Request] = field(default_factory=list)
    swapped_out: list[Request] = field(default_factory=list)
    swapped_in: list[Request] = field(default_factory=list)
    blocks_to_swap_out: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_swap_in: list[tuple[int, int]] = field(default_factory=list)
    blocks_to_prefetch: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    @property
    def num_blocks_swapped(self) -> int:
        """Blocks copied between the device and CPU memory that the step waits for."""
        return len(self.blocks_to_swap_out) + len(self.blocks_to_swap_in)

    @property
    def num_blocks_prefetched(self) -> int:
        """Blocks copied back while the step computes."""
        return len(self.blocks_to_prefetch)

    def __bool__(self) -> bool:
        return bool(self.requests)

    def add(self, request: Request, num_new_tokens: int) -> None:
        """Compute ``num_new_tokens`` of ``request`` this step (its slots are allocated)."""
        self.requests.append(request)
        self.num_new_tokens.append(num_new_tokens)

    def remove(self, request: Request) -> int:
        """Take a request back out of this step; return the tokens it had."""
        index = self.requests.index(request)
        del self.requests[index]
        return self.num_new_tokens.pop(index)
