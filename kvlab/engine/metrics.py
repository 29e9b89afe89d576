"""What a serving engine is judged by: latency per request, throughput and memory per run.

Per request (seconds of the engine's clock):

    arrival ---- queue ---- first scheduled ---- prefill ---- first token ... last token
    |<------------ time to first token (TTFT) ------------------>|
                                                   time per output token (TPOT) = the gaps
    |<------------------------ end-to-end latency (E2E) ----------------------------->|

Per run: p50/p99 of those, output tokens/s, requests/s, and, step by step, the queue
depths, the KV memory in use, preemptions, swaps and prefix-cache hits (``StepStats``).

Every time comes from a ``Clock``. ``WallClock`` is real time. ``ManualClock`` moves only
when told (``step_seconds`` per engine step), so tests are deterministic and a lab can
replay a trace of arrival times without waiting for it: requests arrive over time, and
the engine sees a request only once the clock has passed its arrival time.

Not handled: GPU kernel timings, energy, per-layer profiles.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from kvlab.engine.request import Request
from kvlab.engine.step_stats import StepStats

# ---- clocks --------------------------------------------------------------------------------


class WallClock:
    """Real time in seconds since the clock was made; idling really sleeps."""

    def __init__(self) -> None:
        self._start = time.perf_counter()

    def now(self) -> float:
        return time.perf_counter() - self._start

    def advance_to(self, t: float) -> None:
        """Wait until ``t`` (the engine has nothing to do before then)."""
        delay = t - self.now()
        if delay > 0:
            time.sleep(delay)

    def tick(self, work=None) -> None:
        """An engine step ended; real time has moved by itself (``work`` is ignored)."""


class ManualClock:
    """Simulated time: ``step_seconds`` per engine step, and idle gaps jump straight ahead.

    Args:
        step_seconds: how long every engine step lasts, whatever it really took.
        start: the time before the first step.
    """

    def __init__(self, step_seconds: float = 1.0, start: float = 0.0) -> None:
        if not step_seconds >= 0:
            raise ValueError(f"ManualClock.step_seconds={step_seconds!r}: use a number >= 0")
        self.step_seconds = step_seconds
        self._now = start

    def now(self) -> float:
        return self._now

    def advance_to(self, t: float) -> None:
        self._now = max(self._now, t)

    def tick(self, work=None) -> None:
        """An engine step ended: ``step_seconds`` passed, whatever ``work`` it did."""
        self._now += self.step_seconds


# ---- per request ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RequestMetrics:
    """Latencies of one finished request, in seconds of the engine's clock.

    Attributes:
        arrival_time: when it reached the engine.
        queue_time: from arrival to its first step.
        ttft: time to first token.
        tpot: mean time per output token after the first (0 for one-token outputs).
        e2e: arrival to last token.
        num_output_tokens: of all its samples.
        num_cached_tokens: prompt tokens served by the prefix cache at its first admission.
        num_preemptions: of all its samples.
        max_token_gap: the longest wait between two consecutive tokens of any of its
            samples: what a streaming user sees when a decode stalls behind a long prefill.
    """

    arrival_time: float
    queue_time: float
    ttft: float
    tpot: float
    e2e: float
    num_output_tokens: int
    num_cached_tokens: int
    num_preemptions: int
    max_token_gap: float = 0.0

    @classmethod
    def of(cls, samples: Sequence[Request]) -> RequestMetrics:
        """The metrics of one request from its finished samples (one unless ``n > 1``).

        TTFT counts from the first token of any sample, E2E to the last sample's end, and
        TPOT is the mean over samples of each sample's gaps between tokens.
        """
        arrival = samples[0].arrival_time
        first = min(s.first_token_time for s in samples)
        tpots = []
        for s in samples:
            num_out = len(s.output_token_ids)
            gaps = (s.finished_time - s.first_token_time) / (num_out - 1) if num_out > 1 else 0.0
            tpots.append(gaps)
        return cls(
            arrival_time=arrival,
            queue_time=min(s.first_scheduled_time for s in samples) - arrival,
            ttft=first - arrival,
            tpot=sum(tpots) / len(tpots),
            e2e=max(s.finished_time for s in samples) - arrival,
            num_output_tokens=sum(len(s.output_token_ids) for s in samples),
            num_cached_tokens=samples[0].num_cached_tokens or 0,
            num_preemptions=sum(s.num_preemptions for s in samples),
            max_token_gap=max(s.max_token_gap for s in samples),
        )


# ---- per step ------------------------------------------------------------------------------


# ---- per run -------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation; nan for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass
class RunMetrics:
    """Everything an engine measured since it was made (or since ``reset``).

    Attributes:
        requests: metrics of every finished request, in finishing order.
        steps: one ``StepStats`` per engine step.
        num_preemptions, num_swap_outs, num_swap_ins, num_prefetched: memory events;
            ``num_prefetched`` counts the swap-ins a prefetch had already copied back.
        num_prompt_tokens_queried, num_prompt_tokens_hit: prefix-cache lookups, in tokens.
        start_time, end_time: clock times of the first and last step.
    """

    requests: list[RequestMetrics] = field(default_factory=list)
    steps: list[StepStats] = field(default_factory=list)
    num_preemptions: int = 0
    num_swap_outs: int = 0
    num_swap_ins: int = 0
    num_prefetched: int = 0
    num_prompt_tokens_queried: int = 0
    num_prompt_tokens_hit: int = 0
    start_time: float | None = None
    end_time: float | None = None

    @property
    def elapsed(self) -> float:
        if self.start_time is None or self.end_time is None:
            return 0.0
        return self.end_time - self.start_time

    @property
    def num_output_tokens(self) -> int:
        return sum(r.num_output_tokens for r in self.requests)

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Prompt tokens served from the prefix cache / prompt tokens looked up."""
        queried = self.num_prompt_tokens_queried
        return self.num_prompt_tokens_hit / queried if queried else 0.0

    def summary(self) -> dict[str, float]:
        """The headline numbers, as one flat dict (for a table or a plot title)."""
        elapsed = self.elapsed
        out: dict[str, float] = {
            "num_requests": len(self.requests),
            "num_steps": len(self.steps),
            "elapsed_s": elapsed,
            "output_tokens_per_s": self.num_output_tokens / elapsed if elapsed else math.nan,
            "requests_per_s": len(self.requests) / elapsed if elapsed else math.nan,
        }
        for name in ("ttft", "tpot", "e2e", "max_token_gap"):
            values = [getattr(r, name) for r in self.requests]
            out[f"{name}_p50"] = percentile(values, 50)
            out[f"{name}_p99"] = percentile(values, 99)
        usage = [s.kv_usage for s in self.steps]
        out["kv_usage_mean"] = sum(usage) / len(usage) if usage else math.nan
        out["kv_usage_peak"] = max(usage, default=math.nan)
        held = [s.kv_utilization for s in self.steps if s.kv_usage > 0]
        out["kv_utilization_mean"] = sum(held) / len(held) if held else math.nan
        out["num_preemptions"] = self.num_preemptions
        out["num_swap_outs"] = self.num_swap_outs
        out["num_swap_ins"] = self.num_swap_ins
        out["num_prefetched"] = self.num_prefetched
        out["prefix_cache_hit_rate"] = self.prefix_cache_hit_rate
        return out

    def queue_depth(self) -> list[tuple[float, int, int, int]]:
        """``(time, num_running, num_waiting, num_swapped)`` after every step."""
        return [(s.time, s.num_running, s.num_waiting, s.num_swapped) for s in self.steps]

    def kv_usage(self) -> list[tuple[float, float]]:
        """``(time, kv_usage)`` after every step."""
        return [(s.time, s.kv_usage) for s in self.steps]
