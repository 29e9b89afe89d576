"""The batch scheduler: each step, which requests run and how many of their tokens.

Three ways to form batches (``SchedulerConfig.scheduling``), from the seed article's "static
vs dynamic batching" to what vLLM and every modern server do:

    static      a batch of up to max_num_seqs requests is admitted together and runs to
                completion; requests that arrive meanwhile wait for the next batch.
    dynamic     the same, but an empty engine waits for the batch to fill: it starts a
                batch once max_num_seqs requests wait, or once the oldest has waited
                batch_timeout seconds (the seed's max_batch_size and batch_timeout).
    continuous  requests join and leave at every step (iteration-level scheduling, Orca);
                each step computes at most max_num_batched_tokens tokens (the token_budget),
                so a long prompt is computed over several steps (chunked prefill) while the
                running requests keep decoding.

    step:    1      2      3      4      5      6
    static:  [A B]  [A B]  [A B]  [C D]  [C D]  ...    C, D wait for the whole batch
    contin.: [A B]  [A B]  [A B C D] ...               C, D join as soon as there is room

One step, in the order of the seed article's flow (admit -> allocate -> compute -> free):

    1. running requests get their next tokens (decode: 1; chunked prefill: a chunk);
       when no block is left, the newest running request is preempted;
    2. swapped-out requests are swapped back in, oldest first;
    3. waiting requests are admitted in FCFS (or priority) order while there are free
       seats (max_num_seqs), tokens in the budget and KV blocks above the watermark;
       their prompts first adopt the prefix cache's blocks, then allocate the rest.

The engine then computes the step and frees what finished; a freed block that holds a
full, hashed block of tokens stays in the prefix cache until it is evicted.

The scheduler's parts, each in its own module:

    scheduler             the queues, and the step: running requests first, decodes batched
    scheduler_admission   who joins: the batching mode's rule, seats, budget, KV admission
    scheduler_preemption  who gives way when blocks run out: the newest (or least
                          important) running request, recomputed or swapped out
    scheduler_swap        swapped requests copied back, a step ahead when memory allows
                          (``prefetch``, the seed article's Prefetch Engine)

A preempted request later produces exactly the tokens it would have produced without the
preemption.

Not handled: multiple KV cache groups, speculative decoding, LoRA, pipeline parallelism.
"""

from __future__ import annotations

import math
from collections import deque
from typing import TYPE_CHECKING

from kvlab.cache.manager import CacheFullError, KVCacheManager
from kvlab.engine.request import Request, RequestStatus
from kvlab.engine.scheduler_admission import Admission
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.engine.scheduler_output import SchedulerOutput
from kvlab.engine.scheduler_preemption import Preemption
from kvlab.engine.scheduler_swap import seats_of
from kvlab.engine.waiting_queue import WaitingQueue

if TYPE_CHECKING:
    from kvlab.cache.swap import SwapSpace


class Scheduler(Admission, Preemption):
    """Decides every step who runs; allocates their KV slots; preempts when blocks run out.

    Args:
        config: how batches are formed, and their limits.
        kv: the KV bookkeeping (``kvlab.cache.manager.KVCacheManager``): the scheduler
            asks it whether a request fits and takes slots from it, and never sees a tensor.
        swap_space: the CPU block pool, for ``preemption_mode="swap"``.

    Attributes:
        waiting, running, swapped: the three queues.
        num_preemptions, num_swap_outs, num_swap_ins, num_prefetched: event counts.
        num_prompt_tokens_queried, num_prompt_tokens_hit: prefix-cache lookups, in tokens.
    """

    def __init__(
        self, config: SchedulerConfig, kv: KVCacheManager, swap_space: SwapSpace | None = None
    ) -> None:
        if config.preemption_mode == "swap" and swap_space is None:
            raise ValueError(
                "preemption_mode='swap' needs a swap_space (kvlab.cache.swap.SwapSpace)"
            )
        if not isinstance(kv, KVCacheManager):
            raise TypeError(
                f"kv={kv!r} is not allowed: the scheduler needs a kvlab.cache.KVCacheManager "
                "(a tensor cache has one as its .manager)"
            )
        self.config = config
        self.kv = kv
        self.swap_space = swap_space if config.preemption_mode == "swap" else None
        self.waiting = WaitingQueue(config.scheduling_policy)
        self.running: list[Request] = []
        self.swapped: deque[Request] = deque()
        self.num_seats = 0  # running sequences, plus the seats reserved for forks
        self._batch: set[int] = set()  # static/dynamic: seq_ids of the batch in progress
        self._continuous = config.scheduling == "continuous"
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
        if not self._continuous:
            self._batch.add(request.seq_id)

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
        if not self._continuous:
            self._batch.add(request.seq_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def finish(self, request: Request) -> None:
        """Release a finished (or aborted) request's memory and seat."""
        if request.status is RequestStatus.RUNNING:
            self.kv.free(request.seq_id)
            self.num_seats -= seats_of(request)
            self.running.remove(request)
        elif request.status is RequestStatus.SWAPPED:
            self._drop_swapped(request)
        elif request.status is RequestStatus.WAITING:
            self.waiting.remove(request)
        request.status = RequestStatus.FINISHED
        self._batch.discard(request.seq_id)

    def finish_running(self, finished: list[Request]) -> None:
        """Release many running requests at once (the engine's end of a step)."""
        if not finished:
            return
        for request in finished:
            self.kv.free(request.seq_id)
            self.num_seats -= seats_of(request)
            request.status = RequestStatus.FINISHED
            self._batch.discard(request.seq_id)
        self.running = [r for r in self.running if r.status is RequestStatus.RUNNING]

    # ---- one step ------------------------------------------------------------------------

    def schedule(self, now: float) -> SchedulerOutput:
        """Plan one step at clock time ``now`` and allocate its KV slots."""
        out = SchedulerOutput()
        budget = self.config.max_num_batched_tokens if self._continuous else math.inf
        budget = self._schedule_running(out, budget)
        if not out.preempted and self.swapped:
            budget = self._resume_swapped(out, budget)
        if not out.preempted and not self.swapped and self.waiting:
            self._admit_waiting(out, budget, now)
        for request in out.admitted:
            if request.first_scheduled_time is None:
                request.first_scheduled_time = now
        return out

    def _schedule_running(self, out: SchedulerOutput, budget: float) -> float:
        # NOTE: this loop runs for every running sequence every step; it is written for
        # speed (locals, no helper calls on the path where the allocation succeeds).
        allocate = self.kv.allocate_slots
        requests, nums, copies = out.requests, out.num_new_tokens, out.blocks_to_copy
        running = RequestStatus.RUNNING
        todo = list(self.running)
        index = 0
        while index < len(todo):
            request = todo[index]
            index += 1
            if request.status is not running:
                continue  # preempted earlier in this loop
            start = request.num_computed_tokens
            token_ids = request.token_ids
            num_new = len(token_ids) - start
            if num_new == 1 and budget >= 1:
                index, budget = self._schedule_decodes(out, todo, index - 1, budget)
                continue
            if num_new > budget:
                num_new = int(budget)
                if num_new == 0:
                    break
            try:
                copies += allocate(request.seq_id, num_new, token_ids[start : start + num_new])
            except CacheFullError:
                fits, given_back = self._preempt_until_fits(request, num_new, out)
                budget += given_back
                if not fits:
                    continue  # it preempted itself
            requests.append(request)
            nums.append(num_new)
            budget -= num_new
        return budget

    def _schedule_decodes(
        self, out: SchedulerOutput, todo: list[Request], first: int, budget: float
    ) -> tuple[int, float]:
        """Allocate the run of decoding requests ``todo[first:]`` in one ``allocate_decode``.

        The same as scheduling them one by one: a request that finds no block preempts
        (``_preempt_until_fits``) exactly where the one-by-one loop would.

        Returns:
            the index in ``todo`` to go on from, and the budget left.
        """
        running = RequestStatus.RUNNING
        batch: list[Request] = []
        seq_ids, token_ids, where = [], [], []  # where: each one's index in todo
        index = first
        while index < len(todo) and len(batch) < budget:
            request = todo[index]
            ids = request.token_ids
            start = request.num_computed_tokens
            if request.status is running:
                if len(ids) - start != 1:
                    break
                batch.append(request)
                seq_ids.append(request.seq_id)
                token_ids.append(ids[start])
                where.append(index)
            index += 1
        result = self.kv.allocate_decode(seq_ids, token_ids)
        num_allocated = result.num_allocated
        out.blocks_to_copy += result.copies
        out.requests.extend(batch[:num_allocated])
        out.num_new_tokens.extend([1] * num_allocated)
        budget -= num_allocated
        if num_allocated == len(batch):
            return index, budget
        stuck = batch[num_allocated]
        fits, given_back = self._preempt_until_fits(stuck, 1, out)
        budget += given_back
        if fits:
            out.add(stuck, 1)
            budget -= 1
        return where[num_allocated] + 1, budget
