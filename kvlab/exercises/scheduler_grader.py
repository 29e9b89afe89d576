"""The grading engine of lab 04's build-it scheduler: the learner's scheduler and kvlab's
serve the same small trace side by side, step by step. ``first_difference``,
``random_trace``, ``candidates`` and ``show_trace`` are the build-it's ``Search``.

Both schedulers run inside ``LLMEngine`` with the model-free runner
(``kvlab.engine.model_free``) over a small paged pool, so every step is the engine's real
loop and only the forward pass is skipped. At each step kvlab's engine plans first; the
learner's plan is then checked, before the engine uses it, against the rules any plan
must keep and then against kvlab's plan (``kvlab.exercises.scheduler_rules``). At the end
every request must have all its tokens and the pool must be empty.

Not handled: swapping, priorities, static and dynamic batching, forks (``n > 1``).
"""

from __future__ import annotations

import random
import traceback
from collections.abc import Callable

from kvlab.cache.manager import CacheFullError
from kvlab.engine.llm_engine import LLMEngine
from kvlab.engine.metrics import ManualClock
from kvlab.engine.model_free import ModelFreeRunner, bookkeeping_cache
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.scheduler import Scheduler
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.exercises import scheduler_rules as rules

Request = tuple  # (arrival step, prompt tokens, output tokens)

# The criterion a learner's method stands for when it raises.
_CRITERION_OF = {
    "schedule_running": "running_first",
    "preempt": "preemption",
    "admit_waiting": "fcfs_admission",
}


def show_trace(trace: list[Request]) -> str:
    """``r0 arrives at t=0, 9 prompt + 3 output tokens; r1 ...``: times in steps (a
    step lasts 1 on the grader's clock), seq ids in the order of the trace."""
    return "; ".join(
        f"r{index} arrives at t={arrival}, {prompt} prompt + {output} output tokens"
        for index, (arrival, prompt, output) in enumerate(trace)
    )


def random_trace(rng: random.Random) -> list[Request]:
    """2 to 6 requests, arriving over the first steps, of prompts 1-20 and outputs 1-8."""
    trace = [
        (rng.randint(0, 6), rng.randint(1, 20), rng.randint(1, 8)) for _ in range(rng.randint(2, 6))
    ]
    return sorted(trace, key=lambda r: r[0])


def engine_for(scheduler_class, trace: list[Request], on_plan=None) -> LLMEngine:
    """The model-free engine over a small pool, the trace's requests added."""
    config = SchedulerConfig(
        max_num_seqs=rules.MAX_NUM_SEQS, max_num_batched_tokens=rules.TOKEN_BUDGET
    )
    cache = bookkeeping_cache(
        num_blocks=rules.NUM_BLOCKS, block_size=rules.BLOCK_SIZE, enable_prefix_caching=False
    )
    watched, clock = _watched(scheduler_class, on_plan), ManualClock(1.0)
    engine = LLMEngine(ModelFreeRunner(), cache, config, scheduler_class=watched, clock=clock)
    for index, (arrival, prompt, output) in enumerate(trace):
        params = SamplingParams(max_tokens=output, ignore_eos=True)
        engine.add_request(str(index), [1 + index] * prompt, params, arrival_time=float(arrival))
    return engine


def _watched(scheduler_class, on_plan):
    """``scheduler_class`` whose every plan goes to ``on_plan(scheduler, out, before,
    computed, now)``: ``before``, the running requests' tokens left to compute, and
    ``computed``, every request's num_computed_tokens, as the step began."""

    class Watched(scheduler_class):
        def schedule(self, now):
            before = {r.seq_id: r.num_tokens - r.num_computed_tokens for r in self.running}
            computed = {r.seq_id: r.num_computed_tokens for r in [*self.running, *self.waiting]}
            try:
                out = super().schedule(now)
            except Exception as error:  # noqa: BLE001 - any error of the learner's code
                raise _learner_failure(error, now) from error
            if on_plan is not None:
                on_plan(self, out, before, computed, now)
            return out

    return Watched


def _learner_failure(error: Exception, now: float) -> rules.Failure:
    """The failure a learner's method raising ``error`` at clock time ``now`` stands for."""
    methods = [f.name for f in traceback.extract_tb(error.__traceback__) if f.name in _CRITERION_OF]
    method = methods[-1] if methods else "schedule_running"
    what = f"at t={now:g}: {method}() raised {type(error).__name__}: {error}"
    if isinstance(error, NotImplementedError):
        return rules.Failure(_CRITERION_OF[method], f"at t={now:g}: {method}() is not written yet")
    if isinstance(error, CacheFullError):
        return rules.Failure("preemption", what, "uncaught")
    return rules.Failure(_CRITERION_OF[method], what, "raised")


def first_difference(make: Callable, trace: list[Request]) -> tuple[str, str, str] | None:
    """(criterion, what happened, misconception) of the first difference, or None."""
    reference: list[rules.Plan] = []
    steps = [0]

    def on_reference(scheduler, out, before, computed, now):
        reference.append(rules.plan_of(scheduler, out, before))

    def on_learner(scheduler, out, before, computed, now):
        steps[0] += 1
        where = f"at t={now:g}"
        rules.check_rules(scheduler, out, before, computed, where)
        rules.compare(rules.plan_of(scheduler, out, before), reference[-1], where)

    kvlab = engine_for(Scheduler, trace, on_reference)
    yours = engine_for(make, trace, on_learner)
    try:
        while kvlab.has_unfinished_requests():
            kvlab.step()
            yours.step()
        for _ in range(rules.EXTRA_STEPS):  # a few more chances: an idle step, a late finish
            if not yours.has_unfinished_requests():
                break
            yours.step()
    except rules.Failure as failure:
        return failure.args
    except Exception as error:  # noqa: BLE001 - the engine refused the learner's plan
        detail = f"after {steps[0]} steps, the engine stopped: {type(error).__name__}: {error}"
        return rules.Failure("finishes", detail, "leak").args
    return rules.check_end(yours, steps[0])


def candidates(trace: list[Request]):
    """Smaller traces: from t=0, fewer requests, shorter prompts and outputs, earlier."""
    first = trace[0][0] if trace else 0
    if first > 0:
        yield [(arrival - first, prompt, output) for arrival, prompt, output in trace]
    for i in range(len(trace)):
        yield trace[:i] + trace[i + 1 :]
    for i, (arrival, prompt, output) in enumerate(trace):
        smaller = [
            (arrival, prompt // 2, output),
            (arrival, prompt - 1, output),
            (arrival, prompt, output - 1),
            (arrival - 1, prompt, output),
        ]
        for request in smaller:
            if min(request[1:]) >= 1 and request[0] >= 0:
                yield sorted(trace[:i] + [request] + trace[i + 1 :], key=lambda r: r[0])
