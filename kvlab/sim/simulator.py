"""A model-free memory simulator: replay a request trace against a KV allocator at GPU scale.

No tensors and no model: each request is a prompt length and an output length, and each
step every running request gains one token. The allocators are the real bookkeeping of
kvlab's caches (``ContiguousArena`` with ``reservation_size``, ``BlockManager``), so what
the simulator measures is what the tensor caches would do with the same requests.

The serving loop is the simplest continuous batching, one step at a time:

    1. arrivals join the waiting queue (Poisson arrivals, see ``make_trace``)
    2. every running request gains one token; a paged request whose last block is full
       takes a new one, and if none is free the newest running request is preempted
       (its blocks freed; it waits at the head of the queue and later recomputes)
    3. waiting requests are admitted first-come-first-served while memory allows
       (contiguous: its whole reservation fits in a hole; paged: its blocks fit)
    4. memory is measured, requests that reached prompt + output tokens finish and free

Memory, in token slots, is split into five parts that add up to the KV capacity:

    token_states            slots holding a token of a running request
    reserved_for_future     reserved slots its owner will still fill before it finishes
    internal_fragmentation  reserved slots past the owner's final length: never used
    external_fragmentation  free slots in holes too small for the request waiting at the
                            head of the queue (contiguous only; 0 when nothing waits)
    free                    every other free slot

``token_states`` is what the PagedAttention paper (Kwon et al., SOSP 2023, Fig. 2) reports as
the share of KV memory that holds token states: in prior systems 20.4% (Orca, reserving the
maximum length) to 38.2% (Orca, knowing every output length). The seed article says
"20-30%" against "96%" for Llama-2-7B on an A100; vLLM's launch post says "under 4% waste".
``reproduce_seed()`` runs that setting (and the paper's own, OPT-13B) and prints kvlab's
figures beside the published ones:

    python -m kvlab.sim

Memory is measured while requests wait for it (see ``SimResult``). Paged preemption here
always recomputes; the preempted request keeps its generated tokens and prefills them again.

Not handled: compute time (every step lasts ``step_seconds``), chunked prefill, prefix
sharing, swapping, activation memory (the KV budget is utilization x memory - weights).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from kvlab.cache.block_manager import BlockManager
from kvlab.cache.contiguous_arena import ContiguousArena, reservation_size
from kvlab.memory import GIB, KVSpec, preset

ALLOCATORS = ("contiguous", "paged")
A100_40GB = 40 * GIB


# ---- traces --------------------------------------------------------------------------------


@dataclass(frozen=True)
class LengthProfile:
    """Prompt and output lengths of a workload: lognormal with these means and shapes.

    A lognormal with mean ``m`` and shape ``sigma`` draws ``exp(N(log(m) - sigma**2 / 2,
    sigma))``: most requests are short, a few are very long (the long tail of real chats).
    ``sigma=None`` draws uniform integers from 1 to ``2 * mean - 1`` instead (same mean,
    no tail).
    """

    prompt_mean: float
    prompt_sigma: float | None
    output_mean: float
    output_sigma: float | None


# Means from the PagedAttention paper's datasets (Fig. 11): ShareGPT averages 161 input and
# 338 output tokens, Alpaca 19.3 and 58.5. The shapes are ours: lognormal, chosen for a long
# tail (ShareGPT) and short, tight instructions (Alpaca). They are not fitted to the data.
LENGTH_PROFILES = {
    "sharegpt": LengthProfile(161.0, 1.2, 338.0, 0.9),
    "alpaca": LengthProfile(19.3, 0.6, 58.5, 0.8),
    "uniform": LengthProfile(161.0, None, 338.0, None),
}


@dataclass(frozen=True)
class Trace:
    """Requests in arrival order.

    Attributes:
        arrival_s: arrival time of each request, in seconds from the start.
        prompt_lens: prompt tokens of each request.
        output_lens: output tokens each request generates before it finishes.
        lengths: the length profile's name; seed: the seed that drew the trace.
    """

    arrival_s: tuple[float, ...]
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    lengths: str = ""
    seed: int = 0

    def __len__(self) -> int:
        return len(self.prompt_lens)

    @property
    def mean_prompt_len(self) -> float:
        return sum(self.prompt_lens) / len(self)

    @property
    def mean_output_len(self) -> float:
        return sum(self.output_lens) / len(self)


def make_trace(
    num_requests: int,
    lengths: str = "sharegpt",
    arrival_rate: float = 20.0,
    seed: int = 0,
    max_model_len: int = 4096,
) -> Trace:
    """Draw a seeded trace: Poisson arrivals, lengths from a ``LENGTH_PROFILES`` profile.

    Args:
        num_requests: requests in the trace.
        lengths: ``"sharegpt"``, ``"alpaca"`` or ``"uniform"``.
        arrival_rate: mean requests per second; ``math.inf`` puts every arrival at 0.
        seed: the same seed gives the same trace.
        max_model_len: pairs with prompt + output above it are drawn again.
    """
    if lengths not in LENGTH_PROFILES:
        raise ValueError(f"lengths must be one of {sorted(LENGTH_PROFILES)}, got {lengths!r}")
    if num_requests <= 0 or arrival_rate <= 0:
        raise ValueError(
            f"num_requests and arrival_rate must be > 0, got {num_requests}, {arrival_rate}"
        )
    profile = LENGTH_PROFILES[lengths]
    rng = np.random.default_rng(seed)
    prompts, outputs = [], []
    while len(prompts) < num_requests:
        prompt = _draw_lengths(rng, profile.prompt_mean, profile.prompt_sigma, num_requests)
        output = _draw_lengths(rng, profile.output_mean, profile.output_sigma, num_requests)
        keep = prompt + output <= max_model_len
        prompts.extend(prompt[keep].tolist())
        outputs.extend(output[keep].tolist())
    if math.isinf(arrival_rate):
        arrivals = [0.0] * num_requests
    else:
        arrivals = np.cumsum(rng.exponential(1.0 / arrival_rate, num_requests)).tolist()
    return Trace(
        tuple(arrivals),
        tuple(prompts[:num_requests]),
        tuple(outputs[:num_requests]),
        lengths,
        seed,
    )


def _draw_lengths(rng, mean: float, sigma: float | None, num: int) -> np.ndarray:
    if sigma is None:
        return rng.integers(1, round(2 * mean), num)
    draws = rng.lognormal(math.log(mean) - sigma**2 / 2, sigma, num)
    return np.maximum(1, np.rint(draws)).astype(np.int64)


# ---- results -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SimResult:
    """What one replay measured.

    Memory is measured while the server is memory-bound: time averages over the steps in
    which a request waited (if none ever waited, over every step). The start, when memory
    fills, and the end, when the last long requests drain, would otherwise weigh in with
    memory that is free only because no request is left to use it.

    Attributes:
        label: allocator and policy, e.g. ``"contiguous/pow2"`` or ``"paged/16"``.
        capacity_slots: token slots the KV budget holds.
        num_steps, sim_seconds: steps run with at least one request in the system, and
            the simulated time they took.
        measured_steps: the steps the memory figures average over.
        utilization: token slots in use / reserved slots (time-averaged sums).
        token_states, reserved_for_future, internal_fragmentation, external_fragmentation,
            free: the five parts of KV memory (see the module docstring); they add up to 1.
        mean_running, peak_running: requests running per step.
        fit_at_once: mean running requests in steps where a request was left waiting,
            i.e. how many requests the memory holds at once (None if none ever waited).
        num_preemptions: running requests evicted to free blocks (paged only).
    """

    label: str
    capacity_slots: int
    num_requests: int
    num_steps: int
    measured_steps: int
    sim_seconds: float
    utilization: float
    token_states: float
    reserved_for_future: float
    internal_fragmentation: float
    external_fragmentation: float
    free: float
    mean_running: float
    peak_running: int
    fit_at_once: float | None
    num_preemptions: int

    @property
    def throughput(self) -> float:
        """Requests finished per simulated second."""
        return self.num_requests / self.sim_seconds if self.sim_seconds else 0.0


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
    policy: str = "max_model_len",
    block_size: int = 16,
    gpu_memory_utilization: float = 0.9,
    max_num_seqs: int = 256,
    step_seconds: float = 0.025,
    watermark: float = 0.01,
) -> SimResult:
    """Replay ``trace`` on one device's KV memory and measure how it is used.

    Args:
        trace: the requests (``make_trace``).
        spec: the model's KV shape and weight count (e.g. ``preset("llama-2-7b")``).
        gpu_memory_bytes: device memory; KV gets ``kv_budget_bytes`` of it.
        allocator: ``"contiguous"`` or ``"paged"``.
        policy: contiguous reservation policy: ``"max_model_len"``, ``"pow2"``, ``"exact"``.
        block_size: tokens per block (paged).
        gpu_memory_utilization: the share of device memory the server may use.
        max_num_seqs: at most this many requests run at once.
        step_seconds: simulated time of one step (arrivals are in seconds).
        watermark: share of blocks a paged admission leaves free for running requests.
    """
    if allocator not in ALLOCATORS:
        raise ValueError(f"allocator must be one of {ALLOCATORS}, got {allocator!r}")
    num_slots = kv_budget_bytes(spec, gpu_memory_bytes, gpu_memory_utilization)
    num_slots //= spec.bytes_per_token
    if allocator == "paged":
        memory = _PagedMemory(trace, num_slots, block_size, watermark)
    else:
        memory = _ContiguousMemory(trace, num_slots, policy, spec.max_model_len)
    return _Replay(trace, memory, max_num_seqs, step_seconds).run()


class _PagedMemory:
    """Blocks from a ``BlockManager``; a request grows one block at a time."""

    def __init__(self, trace: Trace, num_slots: int, block_size: int, watermark: float):
        self.label = f"paged/{block_size}"
        self.block_size = block_size
        self.manager = BlockManager(num_slots // block_size, block_size, False)
        # Admission leaves this many blocks free for running requests to grow into, so a
        # new request does not push an older one out at once (vLLM's watermark, 1%).
        self.watermark_blocks = math.ceil(watermark * self.manager.num_blocks)
        self.capacity = self.manager.num_blocks * block_size
        largest = max(p + o for p, o in zip(trace.prompt_lens, trace.output_lens, strict=True))
        if -(-largest // block_size) > self.manager.num_blocks:
            raise ValueError(f"a {largest}-token request exceeds {self.capacity} KV slots")

    def admit(self, request: int, length: int) -> int | None:
        """Allocate ``length`` tokens; the slots now held, or None when they do not fit."""
        needed = -(-length // self.block_size) + self.watermark_blocks
        if needed > self.manager.num_free_blocks:
            return None
        self.manager.allocate_slots(request, length)
        return -(-length // self.block_size) * self.block_size

    def grow(self, request: int, length: int) -> int:
        """Let a running request reach ``length`` tokens (one more block); its new capacity."""
        self.manager.allocate_slots(request, length - self.manager.num_tokens(request))
        return -(-length // self.block_size) * self.block_size

    def can_grow(self) -> bool:
        return self.manager.num_free_blocks > 0

    def free(self, request: int) -> None:
        self.manager.free(request)

    @property
    def reserved(self) -> int:
        return (self.manager.num_blocks - self.manager.num_free_blocks) * self.block_size

    def external_fragmentation(self, request: int) -> int:
        return 0  # any free block serves any request


class _ContiguousMemory:
    """One reservation per request in a ``ContiguousArena``, sized by ``policy``."""

    def __init__(self, trace: Trace, num_slots: int, policy: str, max_model_len: int):
        self.label = f"contiguous/{policy}"
        self.arena = ContiguousArena(num_slots)
        self.capacity = num_slots
        self.sizes = [
            reservation_size(policy, p, o, max_model_len)
            for p, o in zip(trace.prompt_lens, trace.output_lens, strict=True)
        ]
        if max(self.sizes) > num_slots:
            raise ValueError(f"a {max(self.sizes)}-slot reservation exceeds {num_slots} slots")
        self._blocked: tuple[int, int] | None = None  # (request, arena version) that failed
        self._version = 0  # bumped whenever the arena changes
        self._external: tuple[tuple[int, int] | None, int] = (None, 0)  # memo per version

    def admit(self, request: int, length: int) -> int | None:
        # NOTE: the arena only changes on admit and free, so a head request that did not fit
        # keeps not fitting until then: skip the first-fit scan.
        if self._blocked == (request, self._version):
            return None
        if not self.arena.can_reserve(self.sizes[request]):
            self._blocked = (request, self._version)
            return None
        self.arena.reserve(request, self.sizes[request])
        self._version += 1
        return self.sizes[request]

    def free(self, request: int) -> None:
        self.arena.free(request)
        self._version += 1

    @property
    def reserved(self) -> int:
        return self.arena.num_reserved_slots

    def external_fragmentation(self, request: int) -> int:
        key = (request, self._version)
        if self._external[0] != key:
            self._external = (key, self.arena.external_fragmentation(self.sizes[request]))
        return self._external[1]


class _Meter:
    """Per-step samples of memory, summed for time averages."""

    def __init__(self) -> None:
        self.steps = self.running = self.used = self.reserved = self.useful = self.external = 0

    def add(self, running: int, used: int, reserved: int, useful: int, external: int) -> None:
        self.steps += 1
        self.running += running
        self.used += used
        self.reserved += reserved
        self.useful += useful  # reserved slots that will hold a token before their owner ends
        self.external += external

    def shares(self, capacity: int) -> dict[str, float]:
        """The five parts of KV memory, as time-averaged fractions of ``capacity``."""
        total = capacity * self.steps
        return dict(
            token_states=self.used / total,
            reserved_for_future=(self.useful - self.used) / total,
            internal_fragmentation=(self.reserved - self.useful) / total,
            external_fragmentation=self.external / total,
            free=1.0 - (self.reserved + self.external) / total,
        )


class _Replay:
    """The serving loop. Token counts are kept in closed form, so a step costs O(events).

    A running request admitted at step ``s0`` with ``L0`` tokens holds ``L0 + t - s0`` at
    step ``t``; sums over running requests give the live token count without a loop.
    """

    def __init__(self, trace: Trace, memory, max_num_seqs: int, step_seconds: float):
        self.trace, self.memory = trace, memory
        self.max_num_seqs, self.step_seconds = max_num_seqs, step_seconds
        self.final_len = [p + o for p, o in zip(trace.prompt_lens, trace.output_lens, strict=True)]
        self.resume_len: dict[int, int] = {}  # preempted request -> tokens to recompute
        self.running: dict[int, tuple[int, int, int]] = {}  # request -> (L0, s0, capacity)
        self.waiting: deque[int] = deque()
        self.events: dict[int, list[tuple[str, int, int]]] = {}  # step -> (kind, req, epoch)
        self.epoch = [0] * len(trace)
        self.sum_base = 0  # sum of L0 - s0 over running requests
        self.useful = 0  # sum of min(capacity, final_len) over running requests
        self.num_preemptions = 0

    def run(self) -> SimResult:
        trace, num_requests = self.trace, len(self.trace)
        every_step, under_load = _Meter(), _Meter()
        peak = finished = 0
        next_arrival, step, now = 0, 0, 0.0
        while finished < num_requests:
            while next_arrival < num_requests and trace.arrival_s[next_arrival] <= now:
                self.waiting.append(next_arrival)
                next_arrival += 1
            if not self.running and not self.waiting:
                now = trace.arrival_s[next_arrival]  # idle: jump to the next arrival
                continue
            events = self.events.pop(step, [])
            preempted = self._grow(step, [e for e in events if e[0] == "block"])
            if not preempted:
                self._admit(step)
            self._measure(step, every_step, under_load)
            peak = max(peak, len(self.running))
            # NOTE: a request whose last token needed a new block finishes in the step that
            # gave it the block, so its finish event was scheduled during this very step.
            for kind, request, epoch in events + self.events.pop(step, []):
                if kind == "finish" and self.epoch[request] == epoch:
                    self._release(request)
                    finished += 1
            step += 1
            now += self.step_seconds
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
        )

    def _measure(self, step: int, every_step: _Meter, under_load: _Meter) -> None:
        num_running = len(self.running)
        used = self.sum_base + num_running * step
        external = 0
        if self.waiting and num_running < self.max_num_seqs:
            external = self.memory.external_fragmentation(self.waiting[0])
        sample = (num_running, used, self.memory.reserved, self.useful, external)
        every_step.add(*sample)
        if self.waiting:
            under_load.add(*sample)

    def _admit(self, step: int) -> None:
        """First come, first served, while memory allows (a blocked head blocks the rest)."""
        while self.waiting and len(self.running) < self.max_num_seqs:
            request = self.waiting[0]
            length = self.resume_len.get(request, self.trace.prompt_lens[request])
            capacity = self.memory.admit(request, length)
            if capacity is None:
                return
            self.waiting.popleft()
            self.resume_len.pop(request, None)
            self.running[request] = (length, step, capacity)
            self.sum_base += length - step
            self.useful += min(capacity, self.final_len[request])
            self._schedule(request, step, length, capacity)

    def _grow(self, step: int, block_events: list[tuple[str, int, int]]) -> bool:
        """Give each request that filled its last block a new one; preempt if none is free."""
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
        """Free a running request; it waits at the head of the queue and recomputes later."""
        length, start, _ = self.running[request]
        self._release(request)
        self.resume_len[request] = length + (step - 1 - start)
        self.waiting.appendleft(request)
        self.num_preemptions += 1

    def _release(self, request: int) -> None:
        length, start, capacity = self.running.pop(request)
        self.memory.free(request)
        self.sum_base -= length - start
        self.useful -= min(capacity, self.final_len[request])
        self.epoch[request] += 1


# ---- the seed setting ----------------------------------------------------------------------

PUBLISHED_POLICIES = ("max_model_len", "pow2", "exact")

# Share of KV memory holding token states, as published. None: a range, not one figure.
PUBLISHED = {
    "contiguous/max_model_len": (0.204, "PagedAttention paper Fig. 2, Orca (Max)"),
    "contiguous/pow2": (None, "paper Fig. 2: prior systems 20.4%-38.2%"),
    "contiguous/exact": (0.382, "PagedAttention paper Fig. 2, Orca (Oracle)"),
    "paged/16": (0.96, "seed article 96%; vLLM post: under 4% waste"),
}

# The paper's own Fig. 2 setting: OPT-13B (max length 2048) on a 40 GB A100, ShareGPT.
# Its shape is OPT-13B's config.json; the weight count is rounded (about 12.85 billion).
OPT_13B = KVSpec("opt-13b", 40, 40, 128, 2, 12_850_000_000, 2048)


def reproduce_seed(
    num_requests: int = 10_000,
    seed: int = 0,
    lengths: str = "sharegpt",
    arrival_rate: float = 20.0,
    spec: KVSpec | str = "llama-2-7b",
    gpu_memory_bytes: int = A100_40GB,
) -> list[SimResult]:
    """The seed article's setting, Llama-2-7B on a 40 GB A100: every allocator, one trace.

    Requests arrive faster than any allocator serves them (20 per second), so memory, not
    arrivals, limits how many run at once.
    """
    spec = preset(spec) if isinstance(spec, str) else spec
    trace = make_trace(num_requests, lengths, arrival_rate, seed, spec.max_model_len)
    runs = [dict(allocator="contiguous", policy=policy) for policy in PUBLISHED_POLICIES]
    runs.append(dict(allocator="paged", block_size=16))
    return [simulate(trace, spec, gpu_memory_bytes, **run) for run in runs]


def format_comparison(results: list[SimResult]) -> str:
    """A table of kvlab's figures beside the published ones, then the concurrency ratios."""
    header = (
        f"{'allocator':<26}{'token states':>13}{'published':>10}{'future':>8}{'internal':>9}"
        f"{'external':>9}{'free':>7}{'used/res':>9}{'fit at once':>12}{'peak':>6}"
    )
    lines = [header, "-" * len(header)]
    for r in results:
        published, _ = PUBLISHED.get(r.label, (None, ""))
        shown = f"{published:.1%}" if published is not None else "20-38%"
        fit = f"{r.fit_at_once:.1f}" if r.fit_at_once is not None else "-"
        lines.append(
            f"{r.label:<26}{r.token_states:>13.1%}{shown:>10}{r.reserved_for_future:>8.1%}"
            f"{r.internal_fragmentation:>9.1%}{r.external_fragmentation:>9.1%}{r.free:>7.1%}"
            f"{r.utilization:>9.1%}{fit:>12}{r.peak_running:>6}"
        )
    paged = [r for r in results if r.label.startswith("paged")]
    if paged and paged[0].fit_at_once:
        lines.append("")
        for r in results:
            if r.label.startswith("contiguous") and r.fit_at_once:
                ratio = paged[0].fit_at_once / r.fit_at_once
                lines.append(f"{paged[0].label} fits {ratio:.1f}x the requests of {r.label}")
    return "\n".join(lines)


def main() -> None:
    import time

    for title, spec in (
        ("The seed article's setting: Llama-2-7B", "llama-2-7b"),
        ("The PagedAttention paper's Fig. 2 setting: OPT-13B", OPT_13B),
    ):
        start = time.perf_counter()
        results = reproduce_seed(spec=spec)
        elapsed = time.perf_counter() - start
        r = results[0]
        print(
            f"{title} on an A100-40GB (90% of memory, less the weights): "
            f"{r.capacity_slots} KV token slots, {r.num_requests} ShareGPT-like requests, "
            f"{elapsed:.1f} s for all four replays\n"
        )
        print(format_comparison(results), end="\n\n")
    print("Token states: share of KV memory holding tokens, while requests wait for memory.")
    print("Fit at once: requests running together while others wait.")
    for label, (_, source) in PUBLISHED.items():
        print(f"published {label}: {source}")


if __name__ == "__main__":
    main()
