"""Lab 07's design challenge: choose the engine's knobs so a busy server meets its targets.

The setting is a GPU server kvlab cannot run here but can replay exactly: Llama-2-7B on an
A100-40GB (the step-cost clock's roofline estimate), 4 GiB of KV memory, and 300
ShareGPT-like requests arriving at 4 per second, through ``LLMEngine.step`` with the
model-free runner (the same loop as every lab, no forward pass). The learner picks the knobs
of ``replay_design`` (``block_size``, ``max_num_seqs``, ``max_num_batched_tokens``,
``watermark``), and ``check_design(...)`` replays the trace with them and grades the three
targets of ``CRITERIA``: p99 time to first token, p99 of each request's longest wait between
two tokens, output tokens per second.

The budget is tight on purpose (about 16 average requests fit, a sixth of what an A100-40GB
leaves after the weights), so the knobs pull against each other: more seats and a small
reserve start requests sooner, but then blocks run out mid-answer, and a preempted request
recomputes while its reader waits; a reserve that prevents that keeps requests waiting for
their first token. Seats beyond about 32 change nothing (512 blocks of 16 tokens hold
fewer ShareGPT-like requests). Each missed target prints what usually moves it.

Not handled: sampling, prefix caching (the replayed prompts share nothing), swapping.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.engine.llm_engine import LLMEngine
from kvlab.engine.model_free import ModelFreeRunner, bookkeeping_cache
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.engine.step_cost import Roofline, StepCostClock
from kvlab.exercises.grading import Report, Verdict
from kvlab.memory import GIB, preset
from kvlab.sim.trace import make_trace

KV_BUDGET = 4 * GIB
NUM_REQUESTS, ARRIVAL_RATE, SEED = 300, 4.0, 0
TTFT_P99, GAP_P99, THROUGHPUT = 10.0, 0.5, 1100.0
CRITERIA = {
    "ttft": f"p99 time to first token <= {TTFT_P99:g} s",
    "token_gap": f"p99 longest wait between two tokens <= {GAP_P99:g} s",
    "throughput": f"output tokens per second >= {THROUGHPUT:,.0f}",
}
ADVICE = {
    "ttft": "requests wait too long to start: more seats (max_num_seqs) or a smaller "
    "reserve (watermark) admits them sooner",
    "token_gap": "running requests stall: blocks run out mid-answer and a preempted request "
    "recomputes while its reader waits: keep more blocks in reserve (raise the watermark) "
    "or run fewer requests at once (max_num_seqs under about 32)",
    "throughput": "too few requests run at once to fill the GPU's steps: more seats, or "
    "less reserve",
}


@dataclass(frozen=True)
class DesignRun:
    """What one replay of the challenge's trace measured."""

    ttft_p99: float
    token_gap_p99: float
    throughput: float
    num_preemptions: int
    num_blocks: int


def replay_design(
    block_size: int = 16,
    max_num_seqs: int = 256,
    max_num_batched_tokens: int = 8192,
    watermark: float = 0.01,
) -> DesignRun:
    """The challenge's trace through the engine with these knobs (about 2 s on a CPU)."""
    spec = preset("llama-2-7b")
    num_blocks = KV_BUDGET // (spec.bytes_per_token * block_size)
    cache = bookkeeping_cache(
        num_blocks=num_blocks, block_size=block_size, enable_prefix_caching=False
    )
    config = SchedulerConfig(
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        watermark=watermark,
    )
    clock = StepCostClock(Roofline.of(spec, "a100-40gb", block_size))
    engine = LLMEngine(ModelFreeRunner(), cache, config, clock=clock)
    trace = make_trace(NUM_REQUESTS, "sharegpt", ARRIVAL_RATE, SEED, spec.max_model_len)
    lengths = zip(trace.prompt_lens, trace.output_lens, trace.arrival_s, strict=True)
    for index, (prompt_len, output_len, arrival) in enumerate(lengths):
        params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
        engine.add_request(str(index), [1] * prompt_len, params, arrival_time=arrival)
    while engine.has_unfinished_requests():
        engine.step()
    summary = engine.metrics.summary()
    return DesignRun(
        ttft_p99=summary["ttft_p99"],
        token_gap_p99=summary["max_token_gap_p99"],
        throughput=summary["output_tokens_per_s"],
        num_preemptions=engine.metrics.num_preemptions,
        num_blocks=num_blocks,
    )


def check_design(**knobs) -> Report:
    """Replay the challenge with ``knobs`` (those of ``replay_design``) and grade each target."""
    run = replay_design(**knobs)
    measured = {
        "ttft": (run.ttft_p99 <= TTFT_P99, f"{run.ttft_p99:.2f} s"),
        "token_gap": (run.token_gap_p99 <= GAP_P99, f"{run.token_gap_p99:.3f} s"),
        "throughput": (run.throughput >= THROUGHPUT, f"{run.throughput:,.0f} tokens/s"),
    }
    verdicts = []
    for key, (passed, value) in measured.items():
        detail = f"measured {value} ({run.num_preemptions} preemptions, {run.num_blocks} blocks)"
        verdicts.append(Verdict(key, passed, detail, "" if passed else ADVICE[key]))
    stuck = "Change the knobs and run again; each replay takes a couple of seconds."
    return Report(verdicts, CRITERIA, stuck)
