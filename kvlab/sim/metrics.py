"""What a simulator replay measures: the five parts of KV memory, per step and on average.

Memory, in token slots, is split into five parts that add up to the KV capacity:

    token_states            slots holding a token of a running request
    reserved_for_future     reserved slots its owner will still fill before it finishes
    internal_fragmentation  reserved slots past the owner's final length: never used
    external_fragmentation  free slots in holes too small for the request waiting at the
                            head of the queue (contiguous only; 0 when nothing waits)
    free                    every other free slot

``token_states`` is what the PagedAttention paper (Kwon et al., SOSP 2023, Fig. 2) reports
as the share of KV memory that holds token states; ``kvlab.sim.paper`` sets kvlab's
figures beside the published ones (``python -m kvlab.sim``). Memory is measured while
requests wait for it (see ``SimResult``).

``MemoryMeter`` sums one sample per step (running requests; used, reserved, useful and
externally fragmented slots) for the time averages ``SimResult`` reports; ``Latencies``
keeps each request's first-token and finish times on the replay's clock; ``StepLog``
records what each step did, for comparing the replay with the engine
(``tests/test_simulator.py``).

Not handled: per-token times (time per output token, the longest gap between tokens: the
engine's ``kvlab.engine.metrics`` has them).
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.engine.metrics import percentile


@dataclass(frozen=True)
class SimResult:
    """What one replay measured.

    Memory is measured while the server is memory-bound: time averages over the steps in
    which a request waited (if none ever waited, over every step). The start, when memory
    fills, and the end, when the last long requests drain, would otherwise weigh in with
    memory that is free only because no request is left to use it.

    Attributes:
        label: allocator and policy, e.g. ``"contiguous/clairvoyant-pow2"`` or ``"paged/16"``.
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
        num_output_tokens: tokens the requests generated, all of them.
        ttft_p50, ttft_p99: seconds from a request's arrival to the end of the step that
            computed its prompt (its first token).
        e2e_p50, e2e_p99: seconds from arrival to the end of its last step.
        normalized_latency: the mean over requests of end-to-end seconds per output token
            (the PagedAttention paper's measure, its Fig. 12).
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
    num_output_tokens: int
    ttft_p50: float
    ttft_p99: float
    e2e_p50: float
    e2e_p99: float
    normalized_latency: float

    @property
    def throughput(self) -> float:
        """Requests finished per simulated second."""
        return self.num_requests / self.sim_seconds if self.sim_seconds else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per simulated second."""
        return self.num_output_tokens / self.sim_seconds if self.sim_seconds else 0.0


class Latencies:
    """Each request's arrival, first-token and finish times on a replay's clock."""

    def __init__(self, trace) -> None:
        self.arrival = trace.arrival_s
        self.output_lens = trace.output_lens
        self.first: dict[int, float] = {}
        self.finish: dict[int, float] = {}

    def first_token(self, request: int, now: float) -> None:
        """``request``'s prompt was computed in the step ending at ``now`` (the first time
        only: a preempted request that recomputes keeps its first token's time)."""
        self.first.setdefault(request, now)

    def finished(self, request: int, now: float) -> None:
        self.finish[request] = now

    def summary(self) -> dict:
        """The ``SimResult`` fields about time, over every finished request."""
        done = sorted(self.finish)
        ttft = [self.first[r] - self.arrival[r] for r in done]
        e2e = [self.finish[r] - self.arrival[r] for r in done]
        return dict(
            num_output_tokens=sum(self.output_lens[r] for r in done),
            ttft_p50=percentile(ttft, 50),
            ttft_p99=percentile(ttft, 99),
            e2e_p50=percentile(e2e, 50),
            e2e_p99=percentile(e2e, 99),
            normalized_latency=sum(t / self.output_lens[r] for t, r in zip(e2e, done, strict=True))
            / len(done),
        )


class MemoryMeter:
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


@dataclass(frozen=True)
class StepLog:
    """What one replay step did, for comparing the replay with the engine.

    Attributes:
        admitted, preempted, finished: request indices, in the order it happened.
        used_slots, reserved_slots: memory at the measuring point, before frees.
        time: the clock when the step ended.
    """

    admitted: tuple[int, ...]
    preempted: tuple[int, ...]
    finished: tuple[int, ...]
    used_slots: int
    reserved_slots: int
    time: float
