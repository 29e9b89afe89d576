"""The capstone's measurements: the seed article's claims, on this CPU.

Lab 07 asks the seed article's question twice. On this machine, ``kvlab.measure.bench``
has the workload, the Hugging Face baselines and the token-identical check; this module
adds what the capstone needs beside them:

* ``interleaved``: every method once per round, for several rounds, so that load on a
  shared machine hits all of them; ``timing_table`` prints each method's median and spread,
  its forward passes, and its speed-up over one request at a time, round by round;
* ``run_engine``: a workload through ``kvlab.LLM`` with either KV cache (``"paged"`` or
  ``"contiguous"``), reporting what the engine measured besides time: every step, the
  peak share of the KV pool held, and how much of the held memory held tokens;
* ``run_generate_batch``: the workload through transformers' own continuous batching
  (``generate_batch``'s manager, on its ``PagedAttentionCache``), sized like kvlab,
  reporting how many requests received a token in each step (from its timestamps);
* ``hf_peak_kv_slots``: the KV positions Hugging Face's ``generate`` holds at its fullest;
* ``clock_split``: each engine run's time split by a step-cost clock
  (``kvlab.engine.step_cost``) into steps and tokens, beside the time measured, and the
  clock's error on this run; ``median_step_seconds``: a run's decode steps by width;
* ``time_weight_matmuls``: one step's weight multiplies, as transformers' modules hold
  the weights and as kvlab's runner does (``kvlab.model.linear``);
* ``vllm_timed``: the workload on real vLLM (its side environment), tokens and seconds.

At A100 scale, with no model, the same servers are ``kvlab.sim.servers``.

Not handled: sampling (greedy only, like ``kvlab.measure.bench``), GPU timing,
``generate_batch``'s steps that produce no token (a prefill chunk that does not end its
prompt: its timestamps cannot show them), traces of an hour (minutes here, for speed).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.step_cost import LinearCost
from kvlab.engine.step_stats import StepStats
from kvlab.measure.hf_baselines import generate_batch
from kvlab.measure.vllm_runner import run_vllm, vllm_python
from kvlab.measure.workload import Result, Workload
from kvlab.model.linear import fused_weights

T = TypeVar("T")


@dataclass(frozen=True)
class EngineRun:
    """One workload through ``kvlab.LLM``.

    Attributes:
        result: name, seconds, output tokens and mean KV utilization, as ``kvlab.measure.bench``
            reports every method (so ``bench.format_table`` and ``bench.mismatches`` apply).
        steps: what every engine step did (``kvlab.engine.metrics.StepStats``), in order.
        kv_usage_peak: the largest share of the KV pool held at the end of a step (0..1).
        num_preemptions: running requests that lost their KV memory to another.
    """

    result: Result
    steps: tuple[StepStats, ...]
    kv_usage_peak: float
    num_preemptions: int

    @property
    def peak_running(self) -> int:
        """The most sequences computed together in one step."""
        return max(step.num_scheduled for step in self.steps)

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    def step_seconds(self) -> list[tuple[int, float]]:
        """``(sequences computed, wall seconds)`` of every step after the first."""
        return [
            (step.num_scheduled, step.time - before.time)
            for before, step in zip(self.steps, self.steps[1:], strict=False)
        ]

    def decode_step_seconds(self) -> list[tuple[int, float]]:
        """``(sequences decoded, wall seconds)`` of every step after the first that computed
        no prompt token: the steps whose cost depends on their width alone."""
        return [
            (step.num_decode_tokens, step.time - before.time)
            for before, step in zip(self.steps, self.steps[1:], strict=False)
            if step.num_prefill_tokens == 0
        ]


def run_engine(
    model,
    workload: Workload,
    *,
    kv_cache: str = "paged",
    num_blocks: int,
    block_size: int = 16,
    max_num_seqs: int = 16,
    max_num_batched_tokens: int = 512,
    max_model_len: int | None = None,
    reservation_policy: str = "max_model_len",
    name: str | None = None,
) -> EngineRun:
    """Generate the workload greedily (EOS ignored) with continuous batching.

    Args:
        model: a loaded transformers model (shared by every method of a comparison).
        workload: prompts and output lengths (``kvlab.measure.bench.make_workload``).
        kv_cache: ``"paged"`` or ``"contiguous"``; the contiguous cache gets the same token
            slots, ``num_blocks * block_size``, in one arena.
        num_blocks: the KV budget, in blocks of ``block_size`` tokens.
        max_model_len: the longest sequence the engine accepts; with the contiguous
            ``"max_model_len"`` policy, every request reserves this many slots.
        reservation_policy: contiguous only: ``"max_model_len"``, ``"pow2"`` or ``"exact"``.
        name: the label in tables; default ``"kvlab-<kv_cache>"``.
    """
    from kvlab.engine.llm import LLM

    llm = LLM(
        model,
        kv_cache=kv_cache,
        block_size=block_size,
        num_blocks=num_blocks,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        max_model_len=max_model_len,
        reservation_policy=reservation_policy,
        enable_prefix_caching=False,  # random prompts share nothing; keep the paths equal
        scheduling="continuous",
    )
    params = [
        SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in workload.output_lens
    ]
    start = time.perf_counter()
    outputs = llm.generate(workload.prompts, params, use_tqdm=False)
    seconds = time.perf_counter() - start
    metrics = llm.metrics
    summary = metrics.summary()
    peak = max(step.num_scheduled for step in metrics.steps)
    result = Result(
        name or f"kvlab-{kv_cache}",
        seconds,
        [o.outputs[0].token_ids for o in outputs],
        summary["kv_utilization_mean"],
        f"up to {peak} at once",
    )
    return EngineRun(
        result=result,
        steps=tuple(metrics.steps),
        kv_usage_peak=summary["kv_usage_peak"],
        num_preemptions=metrics.num_preemptions,
    )


def clock_split(
    runs: list[EngineRun], cost: LinearCost, measured: Mapping[str, float] | None = None
) -> str:
    """A table: each run's steps, prompt tokens and decodes, each times its price on ``cost``,
    their sum (what the clock says the run takes), the seconds measured, and the clock's
    error on this run (clock / measured - 1).

    Two runs that computed the same tokens differ on the clock only in their steps. The
    price per context token read (under a millisecond a step for SmolLM2) is left out.

    Args:
        measured: run name -> the seconds to set beside the clock (for example the median
            of ``interleaved`` rounds); default each run's own seconds.
    """
    lines = [
        f"{'':18}{'steps':>6}{'x base':>8}{'prefill tokens':>20}{'decodes':>15}"
        f"{'clock':>8}{'measured':>10}{'clock error':>13}"
    ]
    for run in runs:
        prefill = sum(step.num_prefill_tokens for step in run.steps)
        decodes = sum(step.num_decode_tokens for step in run.steps)
        parts = [
            cost.base * run.num_steps,
            cost.per_prefill_token * prefill,
            cost.per_decode_seq * decodes,
        ]
        seconds = (measured or {}).get(run.result.name, run.result.seconds)
        lines.append(
            f"{run.result.name:18}{run.num_steps:>6}{parts[0]:>7.2f}s{prefill:>12} ->"
            f"{parts[1]:>5.2f}s{decodes:>7} ->{parts[2]:>5.2f}s{sum(parts):>7.2f}s"
            f"{seconds:>9.2f}s{sum(parts) / seconds - 1:>+12.0%}"
        )
    return "\n".join(lines)


def median_step_seconds(steps: Sequence[tuple[int, float]]) -> dict[int, float]:
    """Width -> the median wall seconds of the steps that wide, from ``(width, seconds)``
    pairs (``EngineRun.decode_step_seconds``, of one run or several)."""
    widths = sorted({width for width, _ in steps})
    return {w: statistics.median(s for n, s in steps if n == w) for w in widths}


# ---- repeated runs -------------------------------------------------------------------------


def interleaved(methods: Mapping[str, Callable[[], T]], rounds: int = 3) -> dict[str, list[T]]:
    """Run every method once per round, ``rounds`` times; each method's runs, in order.

    Each round starts one method later than the last (round 2 starts with the second), so
    that no method always runs first, after a pause, or last. On a shared machine, load
    that comes and goes then slows every method in some round, not one method in all.
    """
    if rounds < 1 or not methods:
        raise ValueError(f"give at least one method and rounds >= 1, got {rounds} rounds")
    names = list(methods)
    runs: dict[str, list[T]] = {name: [] for name in names}
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            runs[name].append(methods[name]())
    return runs


def seconds_of(run) -> float:
    """Wall seconds of one run: a ``Result``, or anything with a ``.result`` (``EngineRun``,
    ``BatchedRun``)."""
    return getattr(run, "result", run).seconds


def median_speedup(runs: Mapping[str, Sequence], name: str, baseline: str) -> float:
    """How many times faster ``name`` ran than ``baseline``: the median over ``interleaved``
    rounds of each round's ratio (both saw that round's load)."""
    pairs = zip(runs[baseline], runs[name], strict=True)
    return statistics.median(seconds_of(b) / seconds_of(r) for b, r in pairs)


def median_seconds(runs: Mapping[str, Sequence]) -> dict[str, float]:
    """Method name -> the median wall seconds of its ``interleaved`` runs."""
    return {name: statistics.median(seconds_of(r) for r in method) for name, method in runs.items()}


def timing_table(
    runs: Mapping[str, Sequence],
    num_tokens: int,
    passes: Mapping[str, int],
    baseline: str = "hf-one-at-a-time",
    notes: Mapping[str, str] | None = None,
) -> str:
    """A table of ``interleaved`` runs: each method's median seconds and their range, its
    forward passes and the median time of one, output tokens per second, and its speed-up
    over ``baseline``: the median of the rounds' ratios (each round's methods saw the
    same load), with their range. The notes come last, for a few words each.

    Args:
        runs: method name -> its runs (``Result``, ``EngineRun`` or ``BatchedRun``), one
            per round.
        num_tokens: output tokens of the workload.
        passes: method name -> forward passes (engine steps) it made.
        notes: method name -> a few words for the last column.
    """
    if baseline not in runs:
        raise ValueError(f"baseline={baseline!r} is not among the runs: {list(runs)}")
    base = [seconds_of(r) for r in runs[baseline]]
    header = (
        f"{'method':<18}{'median s':>9}{'range s':>12}{'passes':>7}{'ms/pass':>8}"
        f"{'tokens/s':>9}{'speed-up, range':>17}  notes"
    )
    lines = [header, "-" * len(header)]
    for name, method_runs in runs.items():
        seconds = [seconds_of(r) for r in method_runs]
        median = statistics.median(seconds)
        ratios = [b / s for b, s in zip(base, seconds, strict=True)]
        spread = f"{min(seconds):.2f}-{max(seconds):.2f}"
        speedup = f"{statistics.median(ratios):.1f}x ({min(ratios):.1f}-{max(ratios):.1f})"
        lines.append(
            f"{name:<18}{median:>9.2f}{spread:>12}{passes[name]:>7}"
            f"{1000 * median / passes[name]:>8.0f}{num_tokens / median:>9.1f}{speedup:>17}"
            f"  {(notes or {}).get(name, '')}".rstrip()
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class BatchedRun:
    """One workload through transformers' continuous batching (``generate_batch``'s manager).

    Attributes:
        result: name, seconds and output tokens, as ``kvlab.measure.bench`` reports every
            method (its KV utilization is not measured: ``None``).
        step_sizes: how many requests received a token in each step that produced one, in
            order.
    """

    result: Result
    step_sizes: tuple[int, ...]

    @property
    def num_steps(self) -> int:
        return len(self.step_sizes)

    @property
    def peak_running(self) -> int:
        """The most requests that received a token in one step."""
        return max(self.step_sizes)


def run_generate_batch(
    model,
    workload: Workload,
    *,
    num_blocks: int,
    block_size: int,
    max_num_seqs: int,
    max_num_batched_tokens: int,
) -> BatchedRun:
    """Generate the workload greedily (EOS ignored) with transformers' continuous batching,
    sized like kvlab: the same KV blocks of ``block_size`` tokens, seats and token budget.

    The same run as ``kvlab.measure.hf_baselines.run_hf_generate_batch``, with every token's
    time recorded (transformers' ``record_timestamps``), so that ``steps_from_timestamps``
    can say how many requests each step batched.
    """
    seconds, outputs = generate_batch(
        model,
        workload,
        num_blocks=num_blocks,
        block_size=block_size,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        record_timestamps=True,
    )
    sizes = steps_from_timestamps([o.timestamps for o in outputs])
    tokens = [list(o.generated_tokens) for o in outputs]
    note = f"up to {max(sizes, default=0)} at once"
    return BatchedRun(Result("hf-generate-batch", seconds, tokens, None, note), sizes)


def steps_from_timestamps(timestamps: list[list[float]], fraction: float = 0.25) -> tuple[int, ...]:
    """Requests that received a token in each step, from each request's token times.

    A step hands out its tokens in one pass over its requests, microseconds apart; the next
    step's come a whole step later. So sorted together, the times fall in clusters: a new
    step starts where the gap exceeds ``fraction`` of the median time between one
    request's tokens (about one step), or where a request would get a second token.

    Args:
        timestamps: per request, the time of each of its tokens (seconds, increasing).
        fraction: of the median inter-token time, the gap that separates two steps.
    """
    stamps = sorted((t, r) for r, times in enumerate(timestamps) for t in times)
    if not stamps:
        return ()
    intervals = [b - a for times in timestamps for a, b in zip(times, times[1:], strict=False)]
    gap = fraction * statistics.median(intervals) if intervals else float("inf")
    sizes, current, last = [], set(), stamps[0][0]
    for moment, request in stamps:
        if moment - last > gap or request in current:
            sizes.append(len(current))
            current = set()
        current.add(request)
        last = moment
    return (*sizes, len(current))


def hf_peak_kv_slots(workload: Workload, batch_size: int) -> int:
    """KV positions Hugging Face ``generate`` holds at its fullest, in batches of ``batch_size``.

    A padded batch's ``DynamicCache`` holds ``rows x (width + t)`` positions at decode step
    ``t``: every prompt is left-padded to the longest (``width``), and every row runs for
    the batch's longest output. The last output token is never cached. ``batch_size=1`` is
    the one-at-a-time baseline: the longest request's prompt and output, less one.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size={batch_size!r} is not allowed: use an int >= 1")
    peak = 0
    for first in range(0, len(workload.prompts), batch_size):
        prompts = workload.prompts[first : first + batch_size]
        steps = max(workload.output_lens[first : first + batch_size])
        width = max(len(p) for p in prompts)
        peak = max(peak, len(prompts) * (width + steps - 1))
    return peak


@dataclass(frozen=True)
class MatmulTimes:
    """Median seconds of one pass of ``num_rows`` rows through a model's weight matrices.

    Attributes:
        hf_seconds: through transformers' own ``nn.Linear`` modules (seven per layer:
            q, k, v, o, gate, up, down), the weights row-major as loaded.
        kvlab_seconds: through kvlab's runner's matrices: four per layer (q|k|v and gate|up
            fused), laid out for oneDNN where that applies (float32 on a CPU).
    """

    num_rows: int
    hf_seconds: float
    kvlab_seconds: float


@torch.inference_mode()
def time_weight_matmuls(model, num_rows: int, repeats: int = 5) -> MatmulTimes:
    """Time the weight multiplies of one step of ``num_rows`` tokens, two ways.

    Every decoder layer's matrices get ``num_rows`` rows, the LM head one (a step projects
    only each sequence's last token; one here). Attention, norms and everything else a
    step does are left out: this is only the part that depends on how the weights are
    held. The two ways alternate within each repeat, so load on the machine hits both.

    Args:
        model: a loaded ``*ForCausalLM`` (``kvlab.load_model``).
        num_rows: tokens in the step: 1 for one decode, the prompt tokens of a prefill.
        repeats: runs of each way; the median is kept.
    """
    if num_rows < 1 or repeats < 1:
        raise ValueError(f"num_rows and repeats must be >= 1, got {num_rows}, {repeats}")
    kvlab_weights = fused_weights(model)  # made on first use: before the clock starts
    hf_seconds, kvlab_seconds = [], []
    for _ in range(repeats):
        for way, seconds in ((_hf_matmuls, hf_seconds), (_kvlab_matmuls, kvlab_seconds)):
            start = time.perf_counter()
            way(model, kvlab_weights, num_rows)
            seconds.append(time.perf_counter() - start)
    return MatmulTimes(num_rows, statistics.median(hf_seconds), statistics.median(kvlab_seconds))


def _layer_inputs(model, num_rows: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Inputs of a layer's matrices: (rows, hidden), (rows, heads x head_dim), (rows,
    intermediate); all ones (the values do not change the time)."""
    layer = model.model.layers[0]
    return tuple(
        torch.ones(num_rows, linear.in_features, dtype=model.dtype, device=model.device)
        for linear in (layer.self_attn.q_proj, layer.self_attn.o_proj, layer.mlp.down_proj)
    )


def _hf_matmuls(model, kvlab_weights, num_rows: int) -> list[torch.Tensor]:
    hidden, attended, intermediate = _layer_inputs(model, num_rows)
    outputs = []
    for layer in model.model.layers:
        attn, mlp = layer.self_attn, layer.mlp
        outputs += [attn.q_proj(hidden), attn.k_proj(hidden), attn.v_proj(hidden)]
        outputs += [attn.o_proj(attended), mlp.gate_proj(hidden), mlp.up_proj(hidden)]
        outputs.append(mlp.down_proj(intermediate))
    return outputs + [model.lm_head(hidden[-1:])]


def _kvlab_matmuls(model, kvlab_weights, num_rows: int) -> list[torch.Tensor]:
    hidden, attended, intermediate = _layer_inputs(model, num_rows)
    outputs = []
    for layer in kvlab_weights.layers:
        outputs += [*layer.qkv_proj.split(hidden), layer.o_proj(attended)]
        outputs += [*layer.gate_up_proj.split(hidden), layer.down_proj(intermediate)]
    return outputs + [kvlab_weights.lm_head(hidden[-1:])]


# ---- vLLM beside kvlab ---------------------------------------------------------------------


@dataclass(frozen=True)
class VLLMRun:
    """The workload on real vLLM (``kvlab.measure.vllm_runner``), in its own environment.

    Attributes:
        version: vLLM's version; load_seconds: its start-up (model load and compilation).
        seconds: each round's ``LLM.generate`` time, in order (rounds run back to back).
        tokens: each request's output tokens (the last round's).
        counters: vLLM's own metrics (preemptions, prefix-cache queries and hits).
        compute_cores: cores vLLM bound its compute threads to (None if its log did not say).
    """

    version: str
    load_seconds: float
    seconds: tuple[float, ...]
    tokens: list[list[int]]
    counters: dict
    compute_cores: int | None


def vllm_timed(
    workload: Workload,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    block_size: int = 32,
    rounds: int = 3,
    memory_utilization: float = 0.25,
) -> VLLMRun:
    """Serve the workload on vLLM ``rounds`` times (greedy, EOS ignored, float32, no prefix
    caching), with vLLM's own KV pool (it sizes it from ``memory_utilization``).

    Raises:
        VLLMUnavailable: no side environment; the message says how to build it.
    """
    settings = dict(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        block_size=block_size,  # vLLM's CPU attention needs a multiple of 32
        enable_prefix_caching=False,
        max_model_len=2048,
        memory_utilization=memory_utilization,
    )
    out = run_vllm(vllm_python(), workload, settings, rounds=rounds)
    shown = ("preemption", "prefix_cache")  # its KV usage is a gauge: 0 once all finished
    counters = {k: v for k, v in out["counters"].items() if any(n in k for n in shown)}
    return VLLMRun(
        version=out["version"],
        load_seconds=out["load_seconds"],
        seconds=tuple(out["seconds"]),
        tokens=out["tokens"],
        counters=counters,
        compute_cores=out["compute_cores"],
    )


def rate_table(seconds: Mapping[str, Sequence[float]], num_tokens: int, baseline: str) -> str:
    """Output tokens per second of each engine's median run, the range over its runs, and
    the ratio of medians against ``baseline``."""
    if baseline not in seconds:
        raise ValueError(f"baseline={baseline!r} is not among {list(seconds)}")
    base = num_tokens / statistics.median(seconds[baseline])
    lines = [f"{'engine':<18}{'tokens/s':>9}{'range':>14}{'runs':>6}{f'vs {baseline}':>24}"]
    for name, runs in seconds.items():
        rate = num_tokens / statistics.median(runs)
        spread = f"{num_tokens / max(runs):.1f}-{num_tokens / min(runs):.1f}"
        lines.append(f"{name:<18}{rate:>9.1f}{spread:>14}{len(runs):>6}{rate / base:>23.1f}x")
    return "\n".join(lines)
