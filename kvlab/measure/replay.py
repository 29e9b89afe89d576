"""Replay a seeded request trace through the engine, and read back who ran when.

Lab 04 compares batching policies on one workload: the same requests, arriving at the same
times, through ``kvlab.LLM`` built with different scheduler settings. This module turns a
``kvlab.sim.trace.Trace`` into such requests and runs them:

    trace = make_trace(16, "alpaca", arrival_rate=8.0, seed=0)
    requests = TraceRequests.from_trace(trace, vocab_size=256, max_output_len=32)
    llm = LLM("tiny", num_blocks=64, block_size=8, clock=ManualClock(step_seconds=0.025))
    result = replay(llm, requests)
    result.summary["e2e_p99"], result.mean_batch_size, result.timeline()

With a ``ManualClock`` every step lasts ``step_seconds`` of simulated time, whatever it
took on this CPU, so latencies depend only on the lengths and on the scheduler's decisions:
deterministic, and the same for the tiny model as for SmolLM2 (given the same lengths).
``timeline()`` says, for every request and stretch of time, what it was doing:

    waiting   arrived, not computed in this step (queued, or preempted to recompute)
    prefill   its prompt (or a recompute of prompt + output) computed, whole or a chunk
    decode    its one newest token computed
    swapped   its blocks copied out to CPU memory (preemption_mode="swap")

``format_table`` and ``format_preemption_table`` print runs side by side.

Not handled: requests with ``n > 1`` samples (one row per request), wall-clock step starts
(with a ``WallClock`` a step is taken to start when the one before it ended).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from kvlab.engine.metrics import ManualClock, RunMetrics
from kvlab.engine.outputs import RequestOutput
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.step_stats import StepStats
from kvlab.sim.trace import Trace

STATES = ("waiting", "prefill", "decode", "swapped")
TIME_GRID = 1 / 1024  # seconds; see on_time_grid


def on_time_grid(seconds: float) -> float:
    """``seconds`` rounded to a multiple of 1/1024 s, where sums of times are exact.

    NOTE: a dynamic batch starts once ``now - oldest_arrival >= batch_timeout``, and an
    idle engine jumps to ``oldest_arrival + batch_timeout``. In floating point the
    difference can come out a hair below the timeout (0.8 + 1.463... - 1.463... =
    0.7999...), and the engine then finds nothing to run and stops. Arrival times and
    timeouts on this binary grid make both sums exact.
    """
    return round(seconds / TIME_GRID) * TIME_GRID


@dataclass(frozen=True)
class TraceRequests:
    """Requests ready for ``LLM.generate``: prompts, output lengths and arrival times.

    Attributes:
        prompts: token ids (or texts) of each request.
        max_tokens: output tokens each request may generate.
        arrival_times: seconds after the start at which each request arrives.
        ignore_eos: generate exactly ``max_tokens`` (benchmarks do; random prompts do not
            know when to stop), or stop at the end-of-sequence token (a chat model).
    """

    prompts: list
    max_tokens: list[int]
    arrival_times: list[float]
    ignore_eos: bool = True

    def __post_init__(self) -> None:
        if not len(self.prompts) == len(self.max_tokens) == len(self.arrival_times):
            raise ValueError(
                f"prompts ({len(self.prompts)}), max_tokens ({len(self.max_tokens)}) and "
                f"arrival_times ({len(self.arrival_times)}) must have one entry per request"
            )

    def __len__(self) -> int:
        return len(self.prompts)

    @classmethod
    def from_trace(
        cls,
        trace: Trace,
        vocab_size: int,
        max_output_len: int | None = None,
        seed: int = 0,
    ) -> TraceRequests:
        """Random prompts of the trace's lengths, its outputs (at most ``max_output_len``).

        Token ids are drawn from 3 up (0-2 are pad/bos/eos in Llama-style vocabularies),
        seeded, so the same trace always gives the same prompts.
        """
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 4:
            raise ValueError(f"vocab_size={vocab_size!r} is not allowed: use an int >= 4")
        if max_output_len is not None and max_output_len < 1:
            raise ValueError(f"max_output_len={max_output_len!r} is not allowed: use >= 1")
        generator = torch.Generator().manual_seed(seed)
        prompts = [
            torch.randint(3, vocab_size, (n,), generator=generator).tolist()
            for n in trace.prompt_lens
        ]
        limit = max_output_len or max(trace.output_lens)
        arrivals = [on_time_grid(t) for t in trace.arrival_s]
        return cls(prompts, [min(n, limit) for n in trace.output_lens], arrivals)

    def with_prompts(self, prompts: Sequence, ignore_eos: bool = False) -> TraceRequests:
        """The same arrivals and output lengths for other prompts, e.g. real chat prompts
        (which stop at the end-of-sequence token unless ``ignore_eos``)."""
        return TraceRequests(list(prompts), self.max_tokens, self.arrival_times, ignore_eos)

    def arriving_at_once(self) -> TraceRequests:
        """The same requests, all arriving at time 0 (the most memory pressure)."""
        zeros = [0.0] * len(self)
        return TraceRequests(self.prompts, self.max_tokens, zeros, self.ignore_eos)

    def sampling_params(self) -> list[SamplingParams]:
        """Greedy decoding, so that every policy must produce the same tokens."""
        return [
            SamplingParams(temperature=0, max_tokens=n, ignore_eos=self.ignore_eos)
            for n in self.max_tokens
        ]


@dataclass(frozen=True)
class Segment:
    """One stretch of one request's life: ``state`` from ``start`` to ``end`` (seconds)."""

    request: int
    state: str
    start: float
    end: float


@dataclass(frozen=True)
class ReplayResult:
    """What one replay produced and measured.

    Attributes:
        outputs: one ``RequestOutput`` per request, in the order of the requests.
        metrics: the engine's ``RunMetrics`` (``StepStats`` of every step included).
        arrival_times: when each request arrived (seconds of the engine's clock).
        step_seconds: length of a step (a ``ManualClock``); None for other clocks.
    """

    outputs: list[RequestOutput]
    metrics: RunMetrics
    arrival_times: list[float]
    step_seconds: float | None

    @property
    def summary(self) -> dict[str, float]:
        """``RunMetrics.summary()`` plus ``mean_batch_size``."""
        return {**self.metrics.summary(), "mean_batch_size": self.mean_batch_size}

    @property
    def token_ids(self) -> list[list[int]]:
        """The generated token ids of each request (first sample)."""
        return [o.outputs[0].token_ids for o in self.outputs]

    @property
    def mean_batch_size(self) -> float:
        """Sequences computed per step, averaged over the steps that ran."""
        steps = self.metrics.steps
        return sum(s.num_scheduled for s in steps) / len(steps) if steps else math.nan

    @property
    def num_prefill_tokens(self) -> int:
        """Prompt tokens computed over the run, recomputed ones (after a preemption) too."""
        return sum(s.num_prefill_tokens for s in self.metrics.steps)

    @property
    def max_step_tokens(self) -> int:
        """The most tokens one step computed (prefill and decode): compare it with the
        ridge of a roofline (lab 04)."""
        steps = self.metrics.steps
        return max((s.num_prefill_tokens + s.num_decode_tokens for s in steps), default=0)

    @property
    def num_blocks_swapped(self) -> int:
        """KV blocks copied between the device and CPU memory that a step waited for."""
        return sum(s.num_blocks_swapped for s in self.metrics.steps)

    @property
    def num_blocks_prefetched(self) -> int:
        """KV blocks copied back to the device while a step computed (a prefetch)."""
        return sum(s.num_blocks_prefetched for s in self.metrics.steps)

    def longest_token_gap(self, requests: Sequence[int] | None = None) -> float:
        """The longest wait between two consecutive tokens of any of ``requests`` (indices
        into ``outputs``; all by default): the stall a streaming user sees."""
        chosen = range(len(self.outputs)) if requests is None else requests
        return max(self.outputs[i].metrics.max_token_gap for i in chosen)

    def mean_ttft(self, requests: Sequence[int] | None = None) -> float:
        """The mean time to first token of ``requests`` (indices; all by default)."""
        chosen = list(range(len(self.outputs)) if requests is None else requests)
        return sum(self.outputs[i].metrics.ttft for i in chosen) / len(chosen)

    def step_starts(self) -> list[float]:
        """When each step began: its end minus ``step_seconds`` (else the previous end)."""
        steps = self.metrics.steps
        if self.step_seconds is not None:
            return [s.time - self.step_seconds for s in steps]
        start = self.metrics.start_time or 0.0
        return [start] + [s.time for s in steps[:-1]]

    def step_log(self, events_only: bool = True) -> str:
        """One line per step: when it ended, what each request computed, and what moved.

        ``r3:P37`` is a prefill of 37 tokens of request 3 (a chunk, or a recompute), ``r3:D``
        one decode token. Events: ``+r3`` admitted, ``r3 done``, ``r3 preempted``,
        ``r3 swapped out`` / ``in``. With ``events_only``, steps where nothing joined,
        left or moved are left out.
        """
        name = {o.request_id: f"r{i}" for i, o in enumerate(self.outputs)}
        lines = [f"{'step':>4} {'t (s)':>7}  {'computed':<34} {'waiting':>7}  events"]
        for step in self.metrics.steps:
            events = [f"+{name[r]}" for r in step.admitted if r in name]
            events += [f"{name[r]} preempted" for r in step.preempted if r in name]
            events += [f"{name[r]} swapped out" for r in step.swapped_out if r in name]
            events += [f"{name[r]} swapped in" for r in step.swapped_in if r in name]
            events += [f"{name[r]} done" for r in step.finished if r in name]
            if events_only and not events:
                continue
            computed = " ".join(
                f"{name.get(r, r)}:{'P' + str(n) if n > 1 else 'D'}" for r, _, n in step.scheduled
            )
            lines.append(
                f"{step.step:>4} {step.time:>7.3f}  {computed:<34} {step.num_waiting:>7}  "
                + ", ".join(events)
            )
        return "\n".join(lines)

    def timeline(self) -> list[Segment]:
        """Every request's waiting / prefill / decode / swapped stretches, in time order."""
        index = {o.request_id: i for i, o in enumerate(self.outputs)}
        per_request: list[list[Segment]] = [[] for _ in self.outputs]
        cursor = list(self.arrival_times)  # where each request's drawn time ends
        done = [False] * len(self.outputs)
        swapped: set[int] = set()
        for step, start in zip(self.metrics.steps, self.step_starts(), strict=True):
            states = _states_in_step(step, index)
            swapped |= {index[r] for r in step.swapped_out if r in index}
            swapped -= {index[r] for r in step.swapped_in if r in index}
            for i in range(len(self.outputs)):
                if done[i] or self.arrival_times[i] >= step.time:
                    continue
                if cursor[i] < start:  # the engine idled: whoever had arrived waited
                    _extend(per_request[i], Segment(i, "waiting", cursor[i], start))
                default = "swapped" if i in swapped and i not in states else "waiting"
                state = states.get(i, default)
                _extend(per_request[i], Segment(i, state, max(start, cursor[i]), step.time))
                cursor[i] = step.time
            for request_id in step.finished:
                if request_id in index:
                    done[index[request_id]] = True
        return [segment for segments in per_request for segment in segments]


def _states_in_step(step: StepStats, index: dict[str, int]) -> dict[int, str]:
    """Request index -> "prefill" or "decode", for the requests computed in ``step``."""
    states = {}
    for request_id, sample_index, num_new in step.scheduled:
        if sample_index == 0 and request_id in index:
            states[index[request_id]] = "prefill" if num_new > 1 else "decode"
    return states


def _extend(segments: list[Segment], segment: Segment) -> None:
    """Append ``segment``, merged into the last one when it continues it."""
    if segment.end <= segment.start:
        return
    last = segments[-1] if segments else None
    if last is not None and last.state == segment.state and math.isclose(last.end, segment.start):
        segments[-1] = Segment(last.request, last.state, last.start, segment.end)
    else:
        segments.append(segment)


def replay(
    llm,
    requests: TraceRequests,
    on_step: Callable[[StepStats], None] | None = None,
) -> ReplayResult:
    """Run ``requests`` through ``llm`` (a ``kvlab.LLM``), arriving at their times.

    Args:
        llm: the engine; build it with ``clock=ManualClock(step_seconds)`` for exact,
            repeatable latencies.
        requests: the workload.
        on_step: called after every engine step (e.g. to redraw a page map).

    Returns:
        The outputs and the metrics of this run only.
    """
    clock = llm.engine.clock
    start = clock.now()
    outputs = llm.generate(
        requests.prompts,
        requests.sampling_params(),
        use_tqdm=False,
        on_step=on_step,
        arrival_times=requests.arrival_times,
    )
    step_seconds = clock.step_seconds if isinstance(clock, ManualClock) else None
    arrivals = [start + t for t in requests.arrival_times]
    return ReplayResult(outputs, llm.metrics, arrivals, step_seconds)


# ---- a table of results ----------------------------------------------------------------------

_COLUMNS = (
    # (header, summary key, format)
    ("steps", "num_steps", "{:.0f}"),
    ("batch", "mean_batch_size", "{:.2f}"),
    ("TTFT p50", "ttft_p50", "{:.3f}"),
    ("TTFT p99", "ttft_p99", "{:.3f}"),
    ("TPOT p99", "tpot_p99", "{:.3f}"),
    ("E2E p50", "e2e_p50", "{:.3f}"),
    ("E2E p99", "e2e_p99", "{:.3f}"),
    ("tokens/s", "output_tokens_per_s", "{:.0f}"),
    ("peak KV", "kv_usage_peak", "{:.0%}"),
    ("preempt", "num_preemptions", "{:.0f}"),
)


def format_table(results: dict[str, ReplayResult]) -> str:
    """One row per run: steps, mean batch size, latencies (s), tokens/s, KV, preemptions.

    Narrow enough (about 105 characters with short run names) for a notebook's HTML page
    to show each row on one line.
    """
    width = max(len("run"), *(len(name) for name in results))
    header = f"{'run':<{width}}" + "".join(f"{h:>9}" for h, _, _ in _COLUMNS)
    lines = [header, "-" * len(header)]
    for name, result in results.items():
        summary = result.summary
        cells = "".join(f"{fmt.format(summary[key]):>9}" for _, key, fmt in _COLUMNS)
        lines.append(f"{name:<{width}}" + cells)
    return "\n".join(lines)


def format_preemption_table(
    results: dict[str, ReplayResult], reference: ReplayResult, seconds_per_block: float
) -> str:
    """One row per run: what running out of blocks cost it, beside ``reference`` (the same
    requests with plenty of memory).

    Columns: whether it generated the reference's tokens; the prompt tokens it computed
    again (a recompute); its largest step, in tokens (to hold against a roofline's ridge);
    the KV blocks steps waited to copy to or from CPU memory (a swap), and that wait at
    ``seconds_per_block``; the blocks copied back ahead of a step (a prefetch).
    """
    headers = ("same tokens", "tokens again", "largest step", "blocks copied", "copy (ms)")
    headers += ("prefetched",)
    width = max(len("run"), *(len(name) for name in results))
    widths = [len(h) + 2 for h in headers]
    lines = [
        f"{'run':<{width}}" + "".join(f"{h:>{w}}" for h, w in zip(headers, widths, strict=True))
    ]
    lines.append("-" * len(lines[0]))
    for name, result in results.items():
        cells = (
            str(result.token_ids == reference.token_ids),
            result.num_prefill_tokens - reference.num_prefill_tokens,
            result.max_step_tokens,
            result.num_blocks_swapped,
            f"{1e3 * seconds_per_block * result.num_blocks_swapped:.1f}",
            result.num_blocks_prefetched,
        )
        row = "".join(f"{c:>{w}}" for c, w in zip(cells, widths, strict=True))
        lines.append(f"{name:<{width}}" + row)
    return "\n".join(lines)
