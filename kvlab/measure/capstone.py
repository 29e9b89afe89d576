"""The capstone's measurements: one workload, naive Hugging Face against kvlab's two caches.

Lab 07 asks the seed article's question on this machine. ``kvlab.measure.bench`` already has the
workload, the Hugging Face baselines and the token-identical check; this module adds what
the capstone needs beside them:

* ``run_engine``: a workload through ``kvlab.LLM`` with either KV cache (``"paged"`` or
  ``"contiguous"``), reporting what the engine measured besides time: the most requests
  that ran at once, the peak share of the KV pool held, and how much of the held memory
  held tokens (KV utilization);
* ``run_generate_batch``: the workload through transformers' own continuous batching
  (``generate_batch``'s manager), sized like kvlab, reporting what it batched: how many
  requests received a token in each step, read from transformers' per-token timestamps;
* ``hf_peak_kv_slots``: the KV cache positions Hugging Face's ``generate`` holds at its
  fullest, for the same workload run one at a time or in padded batches, so its memory can
  be set against a KV budget it does not itself enforce;
* ``clock_split``: each engine run's time split by a step-cost clock (``kvlab.engine.step_cost``)
  into its steps and its tokens, beside the time measured;
* ``time_weight_matmuls``: one pass of a batch of rows through every weight matrix, as
  transformers' modules hold them and as kvlab's runner does (``kvlab.model.linear``):
  the part of a step that differs between the two when they run the same batches.

    workload --> hf-one-at-a-time  (bench)     tokens, seconds, KV util
             --> hf-static-padded  (bench)     tokens, seconds, KV util
             --> run_generate_batch            + requests per step
             --> run_engine(contiguous)        + every step, peak KV share
             --> run_engine(paged)             + every step, peak KV share

Not handled: sampling (greedy only, like ``kvlab.measure.bench``), latency targets (the
PagedAttention paper compares throughput at equal latency), GPU timing, steps of
``generate_batch`` that produce no token (a prefill chunk that does not end its prompt:
its timestamps cannot show them).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from kvlab.engine.metrics import StepStats
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.step_cost import LinearCost
from kvlab.measure.hf_baselines import generate_batch
from kvlab.measure.workload import Result, Workload
from kvlab.model.linear import fused_weights


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


def clock_split(runs: list[EngineRun], cost: LinearCost) -> str:
    """A table: each run's steps, prompt tokens and decodes, each times its price on ``cost``,
    their sum (what the clock says the run takes) and the seconds the run measured.

    Two runs that computed the same tokens differ on the clock only in their steps. The
    price per context token read (under a millisecond a step for SmolLM2) is left out.
    """
    lines = [
        f"{'':18}{'steps':>6}{'x base':>8}{'prefill tokens':>20}{'decodes':>15}"
        f"{'clock':>8}{'measured':>10}"
    ]
    for run in runs:
        prefill = sum(step.num_prefill_tokens for step in run.steps)
        decodes = sum(step.num_decode_tokens for step in run.steps)
        parts = [
            cost.base * run.num_steps,
            cost.per_prefill_token * prefill,
            cost.per_decode_seq * decodes,
        ]
        lines.append(
            f"{run.result.name:18}{run.num_steps:>6}{parts[0]:>7.2f}s{prefill:>12} ->"
            f"{parts[1]:>5.2f}s{decodes:>7} ->{parts[2]:>5.2f}s{sum(parts):>7.2f}s"
            f"{run.result.seconds:>9.2f}s"
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
