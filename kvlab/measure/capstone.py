"""The capstone's measurements: one workload, naive Hugging Face against kvlab's two caches.

Lab 07 asks the seed article's question on this machine. ``kvlab.measure.bench`` already has the
workload, the Hugging Face baselines and the token-identical check; this module adds what
the capstone needs beside them:

* ``run_engine``: a workload through ``kvlab.LLM`` with either KV cache (``"paged"`` or
  ``"contiguous"``), reporting what the engine measured besides time: the most requests
  that ran at once, the peak share of the KV pool held, and how much of the held memory
  held tokens (KV utilization);
* ``hf_peak_kv_slots``: the KV cache positions Hugging Face's ``generate`` holds at its
  fullest, for the same workload run one at a time or in padded batches, so its memory can
  be set against a KV budget it does not itself enforce.

    workload --> hf-one-at-a-time  (bench)     tokens, seconds, KV util
             --> hf-static-padded  (bench)     tokens, seconds, KV util
             --> run_engine(contiguous)        + peak running, peak KV share
             --> run_engine(paged)             + peak running, peak KV share

Not handled: sampling (greedy only, like ``kvlab.measure.bench``), latency targets (the
PagedAttention paper compares throughput at equal latency), GPU timing.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from kvlab.engine.metrics import StepStats
from kvlab.engine.sampling_params import SamplingParams
from kvlab.measure.workload import Result, Workload


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
