"""A model-free memory simulator: replay a request trace against a KV allocator at GPU scale.

No tensors and no model: each request is a prompt length and an output length. The
allocators are the real bookkeeping of kvlab's caches (``BlockManager``,
``ContiguousManager``), admitted by the same rule the engine's scheduler uses
(``KVCacheManager.admit``), so what the simulator measures is what the engine would do.

It is a fast path of ``LLMEngine.step`` with no token budget (every prompt is computed in
its admission step), recompute preemption and the model-free runner, under continuous or
static batching: ``tests/test_simulator.py`` checks that both admit, preempt and finish the
same requests at the same steps, holding the same memory, and that their clocks agree.
One step:

    1. arrivals join the waiting queue (Poisson arrivals, see ``kvlab.sim.trace``)
    2. every running request computes the token it sampled last step; a paged request
       whose last block is full takes a new one, and if none is free
       the newest running request is preempted (its blocks freed; it waits at the head
       of the queue and later recomputes its prompt and the tokens it had sampled)
    3. unless that step preempted, waiting requests are admitted first-come-first-served
       while memory allows (contiguous: its whole reservation fits in a hole; paged: its
       blocks fit above the watermark, which does not apply when nothing runs); static
       batching admits only when the last batch is done (or a preempted member of the
       running batch comes back)
    4. memory is measured; requests that sampled their last token finish and free
    5. the clock moves on: by ``step_seconds`` (every step equally long), or, given a
       ``step_cost`` (``kvlab.engine.step_cost``: a GPU's ``Roofline``, a ``LinearCost``),
       by what the step computed and read (``StepWork``), as the engine's
       ``StepCostClock`` does: a step of 90 running requests with long contexts reads more
       K/V, and lasts longer, than a step of 10

A request of ``p`` prompt and ``o`` output tokens holds at most ``p + o - 1`` slots: its
last token is sampled, never computed. Token counts are kept in closed form and blocks
are taken at scheduled events, so a step costs O(events), not O(running requests).
Memory is measured in five parts that add up to the KV capacity (``kvlab.sim.metrics``),
latency per request (TTFT, end to end) from the same clock.

Not handled: chunked prefill, prefix sharing, swapping, dynamic batching's timeout,
activation memory (the KV budget is utilization x memory - weights).
"""

from __future__ import annotations

from collections import deque

from kvlab.engine.step_cost import StepWork
from kvlab.memory import GIB, KVSpec
from kvlab.sim.memory import ContiguousMemory, PagedMemory, final_lens
from kvlab.sim.metrics import Latencies, MemoryMeter, SimResult, StepLog
from kvlab.sim.trace import Trace

ALLOCATORS = ("contiguous", "paged")
BATCHING = ("continuous", "static")
A100_40GB = 40 * GIB


# ---- the replay ----------------------------------------------------------------------------


def kv_budget_bytes(
    spec: KVSpec, gpu_memory_bytes: int, gpu_memory_utilization: float = 0.9
) -> int:
    """KV memory left on a device: ``utilization x memory - weights`` (as vLLM sizes it)."""
    budget = int(gpu_memory_bytes * gpu_memory_utilization) - spec.weight_bytes
    if budget <= 0:
        raise ValueError(
            f"{spec.name}'s weights ({spec.weight_bytes / GIB:.1f} GiB) leave no KV memory in "
            f"{gpu_memory_utilization:.0%} of {gpu_memory_bytes / GIB:.1f} GiB"
        )
    return budget


def simulate(
    trace: Trace,
    spec: KVSpec,
    gpu_memory_bytes: int = A100_40GB,
    allocator: str = "paged",
    reservation_policy: str = "max_model_len",
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    max_num_seqs: int = 256,
    step_seconds: float = 0.025,
    watermark: float = 0.01,
    log: list[StepLog] | None = None,
    step_cost=None,
    batching: str = "continuous",
) -> SimResult:
    """Replay ``trace`` on one device's KV memory and measure how it is used.

    Args:
        trace: the requests (``make_trace``).
        spec: the model's KV shape and weight count (e.g. ``preset("llama-2-7b")``).
        gpu_memory_bytes: device memory; KV gets ``kv_budget_bytes`` of it.
        allocator: ``"contiguous"`` or ``"paged"``.
        reservation_policy: what a contiguous request reserves: ``"max_model_len"``,
            ``"pow2"`` or ``"exact"``.
        block_size: tokens per block (paged).
        gpu_memory_utilization: the share of device memory the server may use.
        max_num_seqs: at most this many requests run at once.
        step_seconds: simulated time of every step, on the equal-cost clock (arrivals are
            in seconds); unused with ``step_cost``.
        watermark: share of blocks a paged admission leaves free for running requests
            (the engine's ``SchedulerConfig.watermark``; 0 while nothing runs).
        log: a list that gets one ``StepLog`` per step, if given.
        step_cost: prices each step by its ``StepWork`` (``Roofline.of(spec, "a100-40gb")``,
            a ``LinearCost``); None keeps every step ``step_seconds`` long.
        batching: ``"continuous"`` or ``"static"`` (a batch runs until its last request
            is done; only then do waiting requests start).
    """
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    if batching not in BATCHING:
        raise ValueError(f"batching={batching!r} is not allowed: use one of {BATCHING}")
    if step_cost is not None and not callable(getattr(step_cost, "seconds", None)):
        raise ValueError(
            f"step_cost={step_cost!r} is not allowed: use a Roofline, a LinearCost, or an "
            "object with seconds(StepWork)"
        )
    num_slots = kv_budget_bytes(spec, gpu_memory_bytes, gpu_memory_utilization)
    num_slots //= spec.bytes_per_token
    if allocator == "paged":
        memory = PagedMemory(trace, num_slots, block_size, watermark)
    else:
        memory = ContiguousMemory(trace, num_slots, reservation_policy, spec.max_model_len)
    clock = step_cost if step_cost is not None else _EqualSteps(step_seconds)
    return _Replay(trace, memory, max_num_seqs, clock, batching == "static", log).run()


class _EqualSteps:
    """The equal-cost clock: every step lasts ``step_seconds``, whatever it computes."""

    def __init__(self, step_seconds: float) -> None:
        self.step_seconds = step_seconds

    def seconds(self, work: StepWork) -> float:
        return self.step_seconds


class _Replay:
    """The serving loop. Token counts are kept in closed form, so a step costs O(events).

    A running request admitted at step ``s0`` with ``L0`` tokens holds ``L0 + t - s0`` at
    step ``t``; sums over running requests give the live token count without a loop.
    """

    def __init__(self, trace: Trace, memory, max_num_seqs: int, cost, static: bool, log=None):
        self.trace, self.memory = trace, memory
        self.max_num_seqs, self.cost, self.static = max_num_seqs, cost, static
        self.batch: set[int] = set()  # static batching: the running batch's unfinished members
        self.latencies = Latencies(trace)
        self.final_len = final_lens(trace)
        self.resume_len: dict[int, int] = {}  # preempted request -> tokens to recompute
        self.running: dict[int, tuple[int, int, int]] = {}  # request -> (L0, s0, capacity)
        self.waiting: deque[int] = deque()
        self.events: dict[int, list[tuple[str, int, int]]] = {}  # step -> (kind, req, epoch)
        self.epoch = [0] * len(trace)
        self.sum_base = 0  # sum of L0 - s0 over running requests
        self.useful = 0  # sum of min(capacity, final_len) over running requests
        self.num_preemptions = 0
        self.log: list[StepLog] | None = log
        self._step_events: dict[str, list[int]] = {}

    def run(self) -> SimResult:
        trace, num_requests = self.trace, len(self.trace)
        every_step, under_load = MemoryMeter(), MemoryMeter()
        peak = finished = 0
        next_arrival, step, now = 0, 0, 0.0
        while finished < num_requests:
            while next_arrival < num_requests and trace.arrival_s[next_arrival] <= now:
                self.waiting.append(next_arrival)
                next_arrival += 1
            if not self.running and not self.waiting:
                now = trace.arrival_s[next_arrival]  # idle: jump to the next arrival
                continue
            self._step_events = {"admit": [], "preempt": [], "finish": []}
            self._prefill = [0, 0]  # prompt tokens admitted this step, and their attention pairs
            events = self.events.pop(step, [])
            preempted = self._grow(step, [e for e in events if e[0] == "block"])
            if not preempted:
                self._admit(step)
            if not self.running:
                raise RuntimeError(
                    f"request {self.waiting[0]} cannot be admitted even with nothing running: "
                    "this is a bug in kvlab's simulator, please report it"
                )
            sample = self._measure(step, every_step, under_load)
            peak = max(peak, len(self.running))
            now += self.cost.seconds(self._work(sample[1]))
            for request in self._step_events["admit"]:
                self.latencies.first_token(request, now)
            # NOTE: a request whose last token needed a new block finishes in the step that
            # gave it the block, so its finish event was scheduled during this very step.
            for kind, request, epoch in events + self.events.pop(step, []):
                if kind == "finish" and self.epoch[request] == epoch:
                    self._release(request)
                    self.batch.discard(request)
                    self.latencies.finished(request, now)
                    self._step_events["finish"].append(request)
                    finished += 1
            if self.log is not None:
                e = self._step_events
                self.log.append(StepLog(*map(tuple, e.values()), sample[1], sample[2], now))
            step += 1
        meter = under_load if under_load.steps else every_step
        shares = meter.shares(self.memory.capacity)
        return SimResult(
            label=self.memory.label,
            capacity_slots=self.memory.capacity,
            num_requests=num_requests,
            num_steps=every_step.steps,
            measured_steps=meter.steps,
            sim_seconds=now,
            utilization=meter.used / meter.reserved,
            **shares,
            mean_running=every_step.running / every_step.steps,
            peak_running=peak,
            fit_at_once=under_load.running / under_load.steps if under_load.steps else None,
            num_preemptions=self.num_preemptions,
            **self.latencies.summary(),
        )

    def _work(self, context: int) -> StepWork:
        """What this step computed, as the engine's ``pack_step`` counts it: each admitted
        request's prompt (or recomputed tokens), one token for every other running one;
        every sequence reads its whole context (``context``: the tokens held now)."""
        prefill_tokens, prefill_pairs = self._prefill
        decodes = len(self.running) - len(self._step_events["admit"])
        return StepWork(
            num_prefill_tokens=prefill_tokens,
            num_decode_seqs=decodes,
            num_context_tokens=context,
            num_attention_pairs=prefill_pairs + context - prefill_tokens,
        )

    def _measure(self, step: int, every_step: MemoryMeter, under_load: MemoryMeter) -> tuple:
        num_running = len(self.running)
        used = self.sum_base + num_running * step
        external = 0
        if self.waiting and num_running < self.max_num_seqs:
            external = self.memory.external_fragmentation(self.waiting[0])
        sample = (num_running, used, self.memory.reserved, self.useful, external)
        every_step.add(*sample)
        if self.waiting:
            under_load.add(*sample)
        return sample

    def _admit(self, step: int) -> None:
        """First come, first served, while memory allows (a blocked head blocks the rest).

        Static batching admits a new batch only when the last one is done; while one runs,
        only its preempted members (at the head of the queue) come back.
        """
        members_only = self.static and bool(self.batch)
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            if members_only and request not in self.batch:
                return
            length = self.resume_len.get(request, self.trace.prompt_lens[request])
            max_tokens = self.trace.prompt_lens[request] + self.trace.output_lens[request]
            max_tokens -= length  # output tokens it may still sample (sizes a reservation)
            capacity = self.memory.admit(request, length, max_tokens, bool(self.running))
            if capacity is None:
                return
            self.waiting.popleft()
            self.resume_len.pop(request, None)
            self.running[request] = (length, step, capacity)
            self.sum_base += length - step
            self.useful += min(capacity, self.final_len[request])
            self._step_events["admit"].append(request)
            self._prefill[0] += length
            self._prefill[1] += length * (length + 1) // 2
            if self.static:
                self.batch.add(request)
            self._schedule(request, step, length, capacity)

    def _grow(self, step: int, block_events: list[tuple[str, int, int]]) -> bool:
        """Give each request that filled its last block a new one; preempt if none is free.

        The engine visits them oldest first; here they come in event order. Either way the
        newest running request is the one preempted, so the same requests are.
        """
        preempted = False
        for _, request, epoch in block_events:
            if self.epoch[request] != epoch:
                continue  # preempted since the event was scheduled
            while not self.memory.can_grow():
                newest = next(reversed(self.running))
                self._preempt(newest, step)
                preempted = True
                if newest == request:
                    break
            if request not in self.running:
                continue
            length, start, capacity = self.running[request]
            new_capacity = self.memory.grow(request, length + step - start)
            self.running[request] = (length, start, new_capacity)
            final = self.final_len[request]
            self.useful += min(new_capacity, final) - min(capacity, final)
            self._schedule(request, start, length, new_capacity)
        return preempted

    def _schedule(self, request: int, start: int, length: int, capacity: int) -> None:
        """When will this request finish, and (paged) when will its blocks be full?"""
        final, epoch = self.final_len[request], self.epoch[request]
        if capacity < final:
            when = start + capacity - length + 1
            self.events.setdefault(when, []).append(("block", request, epoch))
        else:
            when = start + final - length
            self.events.setdefault(when, []).append(("finish", request, epoch))

    def _preempt(self, request: int, step: int) -> None:
        """Free a running request; it waits at the head of the queue and recomputes later.

        It computed ``L0 + (step - 1 - s0)`` tokens and sampled one more, so it comes back
        with ``L0 + step - s0`` tokens to compute.
        """
        length, start, _ = self.running[request]
        self._release(request)
        self.resume_len[request] = length + step - start
        self.waiting.appendleft(request)
        self.num_preemptions += 1
        self._step_events["preempt"].append(request)

    def _release(self, request: int) -> None:
        length, start, capacity = self.running.pop(request)
        self.memory.free(request)
        self.sum_base -= length - start
        self.useful -= min(capacity, self.final_len[request])
        self.epoch[request] += 1
