"""Build it (lab 04): the continuous scheduler's step, checked, then run inside the engine.

The learner subclasses ``StepScheduler`` (``kvlab.exercises.step_scheduler`` describes
it) and writes the three methods of one step: ``schedule_running`` (running requests first,
oldest first, preempting the newest when a block runs out), ``preempt`` (by recompute) and
``admit_waiting`` (in queue order while seats, budget and blocks last); ``CRITERIA`` says
what each must do, the third hint how.

``check_scheduler(MyScheduler)`` grades it (``grading.BuildIt``): seeded random traces
through the model-free engine, the learner's plan of every step checked beside kvlab's
(``scheduler_grader``); then SmolLM2 serves chat requests, chunked and preempted, with the
learner's scheduler planning every step, and the tokens must equal kvlab's own run.

    hint_scheduler(1), (2), (3)   help in steps, from a nudge to the algorithm
    reveal_scheduler()            kvlab's own step (``kvlab.engine.scheduler``)

Not handled: swapping, priorities, static and dynamic batching, partial credit.
"""

from __future__ import annotations

from kvlab.engine.request import Request, RequestStatus
from kvlab.engine.sampling_params import SamplingParams
from kvlab.engine.scheduler import Scheduler, SchedulerOutput, seats_of
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.exercises import scheduler_grader as grader
from kvlab.exercises.block_manager_engine import step_engine
from kvlab.exercises.grading import (
    BuildIt,
    Report,
    Search,
    Verdict,
    different_requests,
    engine_stopped,
    model_and_prompts,
    one_torch_thread,
    plural,
)
from kvlab.exercises.step_scheduler import StepScheduler

CRITERIA = {
    "written": "schedule_running, preempt and admit_waiting run (none raises NotImplementedError)",
    "running_first": "every running request gets its next tokens each step, oldest first",
    "token_budget": "a step never computes more than max_num_batched_tokens tokens",
    "chunked_prefill": "a prompt longer than the budget left is computed a chunk at a time",
    "max_num_seqs": "never more than max_num_seqs requests run at once",
    "fcfs_admission": "waiting requests start in queue order, stopping at the first that "
    "does not fit",
    "preemption": "when blocks run out, the newest running request is preempted by "
    "recompute: blocks freed, progress reset, back at the head of the queue",
    "finishes": "every request finishes with all its tokens, and the pool ends empty",
    "generation": "SmolLM2 requests, chunked and preempted, give kvlab's tokens",
}

HINTS = (
    "Two calls take KV slots, never both for one request: self.allocate for a running "
    "request's next tokens, self.kv_admit for a waiting one (it takes the slots of the "
    "first chunk itself). out.add(request, n) only writes the plan, with the n the slots "
    "were taken for. Get a step right where every request fits first; preemption comes "
    "after.",
    "Preemption is a loop around allocate: while self.allocate(request, n, out) raises "
    "CacheFullError, preempt victim = self.running[-1] and try again. It ends when allocate "
    "returns, or when the victim was the request itself: that one computes nothing this "
    "step, so it gets no out.add and the walk goes on. preempt must also list the victim "
    "(out.preempted.append): schedule admits nobody in a step that preempted.",
    "schedule_running(out, budget): for request in list(self.running):\n"
    "  1. if request.status is not RequestStatus.RUNNING: continue\n"
    "  2. if budget == 0: break (the walk ends; nobody after it gets tokens)\n"
    "  3. n = min(request.num_tokens - request.num_computed_tokens, budget)\n"
    "  4. try self.allocate(request, n, out); on CacheFullError: victim = self.running[-1],\n"
    "     self.preempt(victim, out), and back to 4 unless victim is request\n"
    "  5. if 4 preempted the request itself: continue (no out.add for it)\n"
    "  6. out.add(request, n); budget -= n\n"
    "  after the loop: return budget\n"
    "admit_waiting(out, budget): started = []; for request in self.waiting:\n"
    "  1. if budget == 0 or len(self.running) >= self.config.max_num_seqs: break\n"
    "  2. n = self.kv_admit(request, budget); if n is None: break\n"
    "  3. request.status = RequestStatus.RUNNING; self.running.append(request)\n"
    "  4. out.add(request, n); out.admitted.append(request); budget -= n\n"
    "  5. started.append(request)\n"
    "  after the loop: self.waiting.remove(r) for each r in started",
)


def check_written(scheduler_class) -> Verdict:
    """The first criterion: a ``StepScheduler`` subclass whose three methods each run once,
    on a fresh scheduler with one request waiting (admit) or decoding (the other two)."""
    if not (isinstance(scheduler_class, type) and issubclass(scheduler_class, StepScheduler)):
        detail = f"{scheduler_class!r} is not a StepScheduler subclass"
        why = "write class MyScheduler(StepScheduler): with the three methods"
        return Verdict("written", False, detail, why)
    calls = (
        ("schedule_running", False, lambda s, r: s.schedule_running(SchedulerOutput(), 8)),
        ("preempt", False, lambda s, r: s.preempt(r, SchedulerOutput())),
        ("admit_waiting", True, lambda s, r: s.admit_waiting(SchedulerOutput(), 8)),
    )
    for method, waiting, call in calls:
        try:
            scheduler, request = _one_request(scheduler_class, waiting)
        except Exception as error:  # noqa: BLE001 - any error of the learner's code is a verdict
            return Verdict("written", False, f"__init__ raised {type(error).__name__}: {error}")
        where = "waits" if waiting else "decodes"
        try:
            call(scheduler, request)
        except NotImplementedError:
            return Verdict("written", False, f"{method}() is not written yet")
        except Exception as error:  # noqa: BLE001
            detail = f"{method}() raised {type(error).__name__}: {error}"
            return Verdict("written", False, f"{detail} (one request {where}, the pool has room)")
    return Verdict("written", True)


def _one_request(scheduler_class, waiting: bool):
    """A fresh scheduler over 4 free blocks of 4 tokens, with one 3-token request that
    waits, or that has its prompt computed and one output token to compute (decodes)."""
    from kvlab.engine.model_free import bookkeeping_cache

    kv = bookkeeping_cache(num_blocks=4, block_size=4, enable_prefix_caching=False).manager
    scheduler = scheduler_class(SchedulerConfig(max_num_seqs=2, max_num_batched_tokens=8), kv)
    request = Request("0", 0, [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    scheduler.add_request(request)
    if not waiting:
        kv.admit(0, request.token_ids, token_budget=8, max_tokens=4)
        scheduler.waiting.remove(request)
        request.status = RequestStatus.RUNNING
        request.num_computed_tokens = 3
        request.append_token(0)
        scheduler.running.append(request)
    return scheduler, request


def check_generation(scheduler_class, model=None, prompts=None) -> Verdict:
    """Serve chat prompts with the learner's scheduler planning every step, against kvlab's,
    on a pool (24 blocks of 4 tokens) and a budget (16 tokens a step) small enough that every
    prompt is chunked and running requests are preempted."""
    from kvlab.cache.paged import PagedKVCache
    from kvlab.engine.llm_engine import LLMEngine
    from kvlab.model.runner import ModelRunner

    model, prompts = model_and_prompts(model, prompts)
    runner = ModelRunner(model, attention="sdpa")
    config = SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=16)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    runs = {}
    try:
        with one_torch_thread():
            for label, cls in (("yours", scheduler_class), ("kvlab", Scheduler)):
                cache = PagedKVCache.from_spec(
                    runner.kv_spec(), 24, block_size=4, device="cpu", enable_prefix_caching=False
                )
                engine = LLMEngine(runner, cache, config, scheduler_class=cls)
                for index, prompt in enumerate(prompts):
                    engine.add_request(str(index), prompt, params)
                finished: dict[str, list] = {}
                while engine.has_unfinished_requests():
                    step_engine(engine, finished)
                runs[label] = ([finished.get(str(i)) for i in range(len(prompts))], engine)
    except Exception as error:  # noqa: BLE001 - the learner's scheduler inside the engine
        return engine_stopped(error)
    (mine, engine), (theirs, _) = runs["yours"], runs["kvlab"]
    why = "a preempted request must compute its prompt and outputs again from the start"
    preemptions = plural(engine.metrics.num_preemptions, "preemption")
    detail = f"{len(prompts)} requests, {preemptions}, every token as with kvlab's Scheduler"
    return different_requests(mine, theirs, why) or Verdict("generation", True, detail)


SCHEDULER = BuildIt(
    CRITERIA,
    HINTS,
    stuck="Stuck? hint_scheduler(1), then 2 and 3; print(reveal_scheduler()) shows kvlab's own.",
    written=check_written,
    search=Search(
        grader.first_difference, grader.candidates, grader.random_trace, show_case=grader.show_trace
    ),
    reveal_sources=lambda: (
        Scheduler.schedule,
        Scheduler._schedule_running,
        Scheduler._schedule_decodes,
        Scheduler._preempt_until_fits,
        Scheduler._pick_victim,
        Scheduler._preempt,
        Scheduler._admit_waiting,
        Scheduler.kv_admit,
        seats_of,
    ),
)
hint_scheduler, reveal_scheduler = SCHEDULER.hint, SCHEDULER.reveal


def check_scheduler(
    scheduler_class, model=None, num_traces: int = 200, seed: int = 0, prompts=None
) -> Report:
    """``SCHEDULER.check`` of a ``StepScheduler`` subclass on ``num_traces`` seeded random
    traces; the last criterion serves ``prompts`` (default: the chat questions) on
    ``model`` (default: SmolLM2-135M)."""
    return SCHEDULER.check(
        scheduler_class, lambda: check_generation(scheduler_class, model, prompts), num_traces, seed
    )
