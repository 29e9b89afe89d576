"""The engine's own cost per step, no model: ``python -m kvlab.measure.engine_overhead``.

A serving engine's CPU work per step grows with the number of running sequences: the
scheduler visits each one, the block manager gives each its next slot, the step's block
table and slot mapping are built, a token is sampled and appended for each, metrics are
recorded. On a GPU that work must stay well below a decode step's few milliseconds, or
the GPU waits for the CPU. This benchmark runs ``LLMEngine.step``, the very loop the labs
use, with ``kvlab.engine.model_free.ModelFreeRunner`` in place of the model and a paged
cache that holds no tensors, at 1,000 and 10,000 running sequences:

    python -m kvlab.measure.engine_overhead --threads 1
    sequences  schedule  metadata  update  rest  total   (microseconds per sequence per step)

    schedule  Scheduler.schedule: seats, budget, each sequence's next slot (allocate_decode)
    metadata  ForwardBatch.build and the cache's begin_step: positions, block table, slots
    update    computed tokens, sampling (greedy over the stand-in's logits), appending
    rest      finishing, outputs and StepStats (the whole step minus the three above)

Requests are admitted and prefilled first (not timed); every timed step is a pure decode
step. Not handled: preemption under memory pressure, prefill steps, sampling with
temperature.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict

import torch

from kvlab.engine.llm_engine import LLMEngine
from kvlab.engine.metrics import ManualClock
from kvlab.engine.model_free import ModelFreeRunner, bookkeeping_cache
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.scheduler_config import SchedulerConfig

PARTS = ("schedule", "metadata", "update", "rest", "total")
PROMPT_LEN = 32


def engine_overhead(num_seqs: int, num_steps: int = 32, block_size: int = 16) -> dict[str, float]:
    """Microseconds per running sequence per decode step, by part (see the module docstring)."""
    engine = _decoding_engine(num_seqs, num_steps, block_size)
    spent: dict[str, float] = defaultdict(float)
    time_calls(engine.scheduler, "schedule", spent, "schedule")
    time_calls(engine, "_forward", spent, "metadata")
    time_calls(engine, "_update", spent, "update")
    start = time.perf_counter()
    for _ in range(num_steps):
        engine.step()
        if engine.metrics.steps[-1].num_decode_tokens != num_seqs:
            raise RuntimeError(f"a timed step did not decode all {num_seqs} sequences")
    spent["total"] = time.perf_counter() - start
    spent["rest"] = spent["total"] - spent["schedule"] - spent["metadata"] - spent["update"]
    return {part: spent[part] / num_steps / num_seqs * 1e6 for part in PARTS}


def _decoding_engine(num_seqs: int, num_steps: int, block_size: int) -> LLMEngine:
    """An engine whose ``num_seqs`` requests are all prefilled and decoding."""
    blocks_per_seq = -(-(PROMPT_LEN + num_steps + 2) // block_size)
    cache = bookkeeping_cache(num_blocks=num_seqs * blocks_per_seq, block_size=block_size)
    config = SchedulerConfig(max_num_seqs=num_seqs, max_num_batched_tokens=num_seqs * PROMPT_LEN)
    engine = LLMEngine(ModelFreeRunner(vocab_size=1000), cache, config, clock=ManualClock(0.01))
    # final_only, as LLM.generate asks: no output object per running request per step.
    params = SamplingParams(
        temperature=0, max_tokens=num_steps + 2, ignore_eos=True, output_kind="final_only"
    )
    for i in range(num_seqs):
        prompt = [(i * 7 + j) % 1000 for j in range(PROMPT_LEN)]  # distinct: no prefix hits
        engine.add_request(str(i), prompt, params)
    engine.step()  # admission and prefill, not timed
    if len(engine.scheduler.running) != num_seqs:
        raise RuntimeError("not every request was admitted in the first step")
    return engine


def time_calls(owner, name: str, spent: dict[str, float], part: str) -> None:
    """Wrap ``owner.name`` so the time spent inside it adds up in ``spent[part]``."""
    method = getattr(owner, name)

    def timed(*args, **kwargs):
        start = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            spent[part] += time.perf_counter() - start

    setattr(owner, name, timed)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m kvlab.measure.engine_overhead", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--num-seqs", type=int, nargs="*", default=[1000, 10000])
    parser.add_argument("--steps", type=int, default=32, help="timed decode steps")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    print("the engine's own cost, microseconds per running sequence per decode step")
    print(f"{'sequences':>10}" + "".join(f"{part:>10}" for part in PARTS))
    for num_seqs in args.num_seqs:
        per = engine_overhead(num_seqs, args.steps, args.block_size)
        print(f"{num_seqs:>10}" + "".join(f"{per[part]:>10.2f}" for part in PARTS))


if __name__ == "__main__":
    main()
