"""Calibrate the step-cost clock on the real model, on this machine, and check it.

``calibrate`` serves two seeded workloads through ``LLMEngine.step`` on the wall clock and
times every step. It fits ``kvlab.engine.step_cost.LinearCost`` on the first (least
squares, no negative cost) and reports how far its predictions fall from the measured
steps of the second, which it was not fitted on: the median absolute error, as a share
of each step's measured time. The result is cached per model, machine, torch version and
thread count, so a lab pays for it once (about 35 s for SmolLM2 on one CPU thread).

    python -m kvlab.measure.step_cost --threads 1      # fit, check, print the coefficients

The workloads mix what a step can hold: prompts of 8-256 tokens computed whole or in
chunks (token budgets of 64 and 256), beside 1-12 decoding sequences.

Not handled: GPU timings (``Roofline`` estimates a GPU from its datasheet), copy and swap
costs (measured separately, per block, by copying real blocks), other step shapes than
these workloads' (a step far outside them is an extrapolation).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from kvlab.engine.llm import LLM
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.step_cost import LinearCost, StepWork

CACHE_DIR = Path.home() / ".cache" / "kvlab" / "step_cost"
FEATURES = ("base", "per_prefill_token", "per_decode_seq", "per_context_token")


@dataclass(frozen=True)
class Calibration:
    """A fitted cost model and how well it predicts steps it was not fitted on.

    Attributes:
        cost: the fitted ``LinearCost``.
        median_error: median of |predicted - measured| / measured on the check workload.
        num_fit_steps, num_check_steps: steps measured in each workload.
        check: ``(predicted, measured)`` seconds of every step of the check workload.
    """

    cost: LinearCost
    median_error: float
    num_fit_steps: int
    num_check_steps: int
    check: list[tuple[float, float]]


def features(work: StepWork) -> list[float]:
    """The regressors of ``LinearCost``, in ``FEATURES`` order."""
    return [1.0, work.num_prefill_tokens, work.num_decode_seqs, work.num_context_tokens]


def fit(samples: list[tuple[StepWork, float]], source: str = "") -> LinearCost:
    """Least-squares coefficients, none negative: a term that would come out negative is
    dropped (set to 0) and the rest refitted, until all are >= 0."""
    if len(samples) < len(FEATURES):
        raise ValueError(f"fit needs at least {len(FEATURES)} steps, got {len(samples)}")
    x = np.array([features(work) for work, _ in samples])
    y = np.array([seconds for _, seconds in samples])
    active = list(range(len(FEATURES)))
    while True:
        coef, *_ = np.linalg.lstsq(x[:, active], y, rcond=None)
        if (coef >= 0).all():
            break
        del active[int(np.argmin(coef))]
    values = dict.fromkeys(FEATURES, 0.0)
    for index, value in zip(active, coef, strict=True):
        values[FEATURES[index]] = float(value)
    return LinearCost(**values, source=source)


def median_error(cost, samples: list[tuple[StepWork, float]]) -> float:
    """Median of |predicted - measured| / measured over ``samples``."""
    return statistics.median(abs(cost.seconds(w) - s) / s for w, s in samples)


def measure_steps(llm: LLM, prompts, output_lens, progress=None) -> list[tuple[StepWork, float]]:
    """Serve the requests (all arrive at once) and time every ``engine.step()``."""
    engine = llm.engine
    for i, (prompt, n) in enumerate(zip(prompts, output_lens, strict=True)):
        params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
        engine.add_request(f"calibrate-{i}", prompt, params)
    samples = []
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        seconds = time.perf_counter() - start
        if engine.last_step_work is not None:
            samples.append((engine.last_step_work, seconds))
        if progress is not None:
            progress.update(1)
    return samples


def median_steps(runs: list[list[tuple[StepWork, float]]]) -> list[tuple[StepWork, float]]:
    """Each step's median time over runs of one workload.

    NOTE: one timing per step is noisy on a shared machine (and a step of a new shape is a
    few percent slower the first time). The same workload served again takes the same
    steps (the schedule depends only on lengths), so the median of a few runs keeps each
    step's typical time: with one run, three fits on one machine erred by 7%, 17% and 34%.
    """
    works = [[work for work, _ in run] for run in runs]
    if any(w != works[0] for w in works[1:]):
        raise RuntimeError("the repeated runs of a calibration workload took different steps")
    return [(work, statistics.median(run[i][1] for run in runs)) for i, work in enumerate(works[0])]


def _workload(seed: int, num_requests: int, vocab_size: int):
    rng = np.random.default_rng(seed)
    prompts = [
        rng.integers(0, vocab_size, size=int(n)).tolist()
        for n in rng.integers(8, 257, size=num_requests)
    ]
    return prompts, rng.integers(4, 25, size=num_requests).tolist()


def _per_block_seconds(llm: LLM, repeats: int = 20) -> tuple[float, float]:
    """Seconds to copy one KV block on the device, and to copy one out to CPU memory."""
    cache = llm.engine.cache
    pairs = [(i, i + 1) for i in range(0, 16, 2)]
    start = time.perf_counter()
    for _ in range(repeats):
        cache.copy_blocks(pairs)
    copy = (time.perf_counter() - start) / (repeats * len(pairs))
    layers = [layer[:, 0:1] for layer in cache.kv_caches]  # every layer's K/V of block 0
    start = time.perf_counter()
    for _ in range(repeats):
        [layer.to("cpu", copy=True) for layer in layers]
    swap = (time.perf_counter() - start) / repeats
    return copy, swap


def _machine(model) -> str:
    cpu = platform.processor() or platform.machine()
    device = next(model.parameters()).device
    params = sum(p.numel() for p in model.parameters())
    return (
        f"{type(model).__name__} ({params / 1e6:.0f}M params) on {device}, {cpu}, "
        f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    )


def calibrate(
    model,
    *,
    seed: int = 0,
    num_requests: int = 16,
    repeats: int = 3,
    refresh: bool = False,
    cache_dir: Path | None = CACHE_DIR,
    progress: bool = True,
) -> Calibration:
    """Fit a ``LinearCost`` on this machine's real steps, and check it on other steps.

    Args:
        model: a loaded model (``kvlab.load_model``); its device is used.
        seed, num_requests: the workloads (the check workload uses ``seed + 1``).
        repeats: runs of each workload; each step's time is the median of its runs.
        refresh: measure again even when a cached calibration exists.
        cache_dir: where calibrations are kept; None keeps nothing.
        progress: show a progress bar over the measured steps.
    """
    machine = _machine(model)
    key = hashlib.sha256(f"{machine}|{seed}|{num_requests}|{repeats}".encode()).hexdigest()[:16]
    path = cache_dir / f"{key}.json" if cache_dir is not None else None
    if path is not None and path.exists() and not refresh:
        return _load(path)
    vocab_size = model.config.vocab_size
    bar = None
    if progress:
        # A text bar, not a widget: a notebook saved with it stays readable without a kernel.
        from tqdm import tqdm

        bar = tqdm(desc="calibrating the step-cost clock", unit="step", mininterval=1.0)
    samples = {}
    for name, offset, budget, seats in (("fit", 0, 64, 8), ("check", 1, 256, 12)):
        llm = LLM(
            model,
            num_blocks=512,
            max_num_seqs=seats,
            max_num_batched_tokens=budget,
            enable_prefix_caching=False,
        )
        prompts, outputs = _workload(seed + offset, num_requests, vocab_size)
        measure_steps(llm, prompts[:2], [2, 2])  # warm-up: first calls are slower
        runs = [measure_steps(llm, prompts, outputs, bar) for _ in range(repeats)]
        samples[name] = median_steps(runs)
    if bar is not None:
        bar.close()
    copy, swap = _per_block_seconds(llm)
    fitted = fit(samples["fit"], source=f"calibrated: {machine}")
    cost = LinearCost(
        **{f: getattr(fitted, f) for f in FEATURES},
        per_block_copied=copy,
        per_block_swapped=swap,
        source=fitted.source,
        overlaps_prefetch=next(model.parameters()).device.type == "cuda",
    )
    check = samples["check"]
    result = Calibration(
        cost=cost,
        median_error=median_error(cost, check),
        num_fit_steps=len(samples["fit"]),
        num_check_steps=len(check),
        check=[(cost.seconds(w), s) for w, s in check],
    )
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(asdict(result)))
    return result


def _load(path: Path) -> Calibration:
    data = json.loads(path.read_text())
    data["cost"] = LinearCost(**data["cost"])
    data["check"] = [tuple(pair) for pair in data["check"]]
    return Calibration(**data)


def describe(calibration: Calibration) -> str:
    """The coefficients in milliseconds and the check's error, for printing."""
    c = calibration.cost
    return "\n".join(
        [
            c.source,
            f"  base (weights read, step overheads): {1e3 * c.base:8.3f} ms per step",
            f"  per prefill token:                   {1e3 * c.per_prefill_token:8.3f} ms",
            f"  per decode sequence:                 {1e3 * c.per_decode_seq:8.3f} ms",
            f"  per context token read:              {1e3 * c.per_context_token:8.4f} ms",
            f"  per block copied / swapped:          {1e3 * c.per_block_copied:8.4f} / "
            f"{1e3 * c.per_block_swapped:.4f} ms",
            f"fitted on {calibration.num_fit_steps} steps; on {calibration.num_check_steps} "
            f"other steps the median error is {calibration.median_error:.1%}",
        ]
    )


@dataclass(frozen=True)
class PreemptionCost:
    """What bringing back one preempted sequence costs, two ways, under a cost model.

    Attributes:
        context_len: tokens the sequence held when it was preempted.
        swap_s: its blocks copied out and back in (the swap-in is what stalls a step).
        recompute_s: the extra time of the step that recomputes it as a prefill, beside
            the decodes that run anyway (a step bound by reading the weights computes a
            few hundred tokens more for free).
    """

    context_len: int
    swap_s: float
    recompute_s: float

    @property
    def cheaper(self) -> str:
        return "swap" if self.swap_s < self.recompute_s else "recompute"


def preemption_costs(
    cost, context_lens, num_decodes: int = 32, decode_context: int = 500, block_size=None
) -> list[PreemptionCost]:
    """Swap against recompute for sequences of ``context_lens`` tokens, in a step that also
    decodes ``num_decodes`` sequences of ``decode_context`` tokens each.

    Args:
        block_size: tokens per block; None takes the cost model's own (a ``Roofline``'s),
            else 16.
    """
    if block_size is None:
        block_size = getattr(cost, "block_size", 16)
    decodes = StepWork(
        num_decode_seqs=num_decodes,
        num_context_tokens=num_decodes * decode_context,
        num_attention_pairs=num_decodes * decode_context,
    )
    rows = []
    for n in context_lens:
        blocks = -(-n // block_size)
        with_prefill = StepWork(
            num_prefill_tokens=n,
            num_decode_seqs=decodes.num_decode_seqs,
            num_context_tokens=decodes.num_context_tokens + n,
            num_attention_pairs=decodes.num_attention_pairs + n * (n + 1) // 2,
        )
        swap = cost.seconds(StepWork(num_blocks_swapped=2 * blocks)) - cost.seconds(StepWork())
        recompute = cost.seconds(with_prefill) - cost.seconds(decodes)
        rows.append(PreemptionCost(n, swap, recompute))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    parser.add_argument("--refresh", action="store_true", help="ignore a cached calibration")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    from kvlab.model.loading import load_model

    model, _ = load_model(args.model, device="cpu")
    print(describe(calibrate(model, refresh=args.refresh)))


if __name__ == "__main__":
    main()
