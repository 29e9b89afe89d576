"""The rules lab 04's grader holds a learner's plan to, step by step: ``check_rules``, what
any plan keeps; ``compare``, the plan against kvlab's (with first come first served and
preemption of the newest running request, a step has one right plan); ``check_end``, every
request finished and the pool empty.

A broken rule raises ``Failure(criterion, what happened, misconception)``; requests are
named ``r<seq_id>`` in what happened. ``kvlab.exercises.scheduler_grader`` runs the
steps.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvlab.engine.request import RequestStatus
from kvlab.exercises.grading import plural

# The grader's setting: small enough that prompts are chunked and requests preempted.
NUM_BLOCKS = 10
BLOCK_SIZE = 4
MAX_NUM_SEQS = 3
TOKEN_BUDGET = 8
EXTRA_STEPS = 10  # steps the learner's engine may take after kvlab's has finished

MISCONCEPTIONS = {
    "budget": "a step computes at most max_num_batched_tokens tokens in all: give each "
    "request at most the budget left, and take its tokens off the budget",
    "zero": "a request is in a step only with at least 1 token to compute: once the budget "
    "is spent, stop",
    "skip": "a preempted request computes nothing this step: skip it when the walk reaches "
    "it (it is no longer RUNNING), and do not add it when it was the one being allocated",
    "admitted": "a started request joins out.admitted as well as out (out.admitted.append)",
    "status": "a started request's status becomes RequestStatus.RUNNING: the next step's "
    "walk over self.running skips every request that is not RUNNING",
    "advanced": "the engine advances num_computed_tokens after the step, by the tokens it "
    "computed; your scheduler only plans them (out.add) and leaves the count alone",
    "skipped": "every running request gets its next tokens each step, oldest first, "
    "before anyone waiting is admitted",
    "chunk": "a prompt longer than the budget left gets what is left (a chunk) now and "
    "the rest in later steps; the tokens you add must be the tokens allocated",
    "seats": "admit only while len(self.running) < self.config.max_num_seqs",
    "fcfs": "admit in queue order and stop at the first request that does not fit: "
    "skipping ahead starves the long requests",
    "victim": "preempt the newest running request (self.running[-1]): it loses the least "
    "work, and the oldest keep their place",
    "retry": "after each victim, allocate again: preempt the newest, one at a time, until "
    "the request fits, or until it is the one preempted",
    "listed": "a preempted request joins out.preempted (out.preempted.append(victim)): the "
    "engine and the step's plan read that list",
    "no_victim": "when allocate raises CacheFullError, preempt the newest running request "
    "and allocate again: a request that finds no block does not just wait",
    "free": "a preempted request gives all its blocks back: self.kv.free(victim.seq_id)",
    "recompute": "recompute starts over: num_computed_tokens = 0 and status WAITING, so "
    "its prompt and the outputs so far are computed again",
    "head": "a preempted request goes back to the head of the waiting queue "
    "(self.waiting.push_front) and leaves self.running, so it is the next to start",
    "leak": "every block a request held must come back: on preemption and when it finishes",
    "uncaught": "catch CacheFullError where blocks run out: preempt the newest running "
    "request, then allocate again",
    "raised": "only allocate() raises when blocks run out (CacheFullError); any other error "
    "is a bug in the method it names",
}


class Failure(Exception):
    """A criterion broke at this step; its ``args`` are (criterion, detail, misconception),
    the misconception given by its key in ``MISCONCEPTIONS`` ("" for none)."""

    def __init__(self, criterion: str, detail: str, mistake: str = "") -> None:
        super().__init__(criterion, detail, MISCONCEPTIONS[mistake] if mistake else "")


@dataclass
class Plan:
    """One step as a scheduler planned it, in seq ids (``r<seq_id>`` in messages)."""

    rows: dict[int, int]  # seq_id -> tokens computed this step
    admitted: list[int]
    preempted: list[int]
    before: dict[int, int]  # running before the step: seq_id -> tokens left to compute
    waiting_after: list[int]
    running_after: list[int]


def tokens(n: int) -> str:
    return plural(n, "token")


def plan_of(scheduler, out, before: dict[int, int]) -> Plan:
    return Plan(
        rows={r.seq_id: n for r, n in zip(out.requests, out.num_new_tokens, strict=True)},
        admitted=[r.seq_id for r in out.admitted],
        preempted=[r.seq_id for r in out.preempted],
        before=before,
        waiting_after=[r.seq_id for r in scheduler.waiting],
        running_after=[r.seq_id for r in scheduler.running],
    )


def check_rules(scheduler, out, before: dict[int, int], computed: dict[int, int], where: str):
    """The rules any plan keeps, whatever kvlab planned. ``before``: the running requests'
    tokens left; ``computed``: every request's num_computed_tokens, both before the step."""
    seq_ids = [r.seq_id for r in out.requests]
    if len(set(seq_ids)) != len(seq_ids):
        twice = next(s for s in seq_ids if seq_ids.count(s) > 1)
        raise Failure("running_first", f"{where}: r{twice} is in the step twice", "skipped")
    for request, num_new in zip(out.requests, out.num_new_tokens, strict=True):
        if num_new < 1:
            detail = f"{where}: r{request.seq_id} is given {tokens(num_new)}"
            raise Failure("token_budget", detail, "zero")
    newest = list(before)[-len(out.preempted) :] if out.preempted else []
    for victim in out.preempted:
        _check_preempted(scheduler, out, victim, victim.seq_id in newest, where)
    _check_started(scheduler, before, where)
    _check_counts_untouched(out, computed, where)
    for request, num_new in zip(out.requests, out.num_new_tokens, strict=True):
        held = scheduler.kv.num_tokens(request.seq_id) if request.seq_id in scheduler.kv else 0
        if held != request.num_computed_tokens + num_new:
            prefill = request in out.admitted or num_new > 1
            detail = (
                f"{where}: r{request.seq_id} is to compute {tokens(num_new)} after its "
                f"{request.num_computed_tokens} computed ones, but holds slots for {held}"
            )
            raise Failure("chunked_prefill" if prefill else "running_first", detail, "chunk")
    if out.num_tokens > TOKEN_BUDGET:
        rows = ", ".join(f"r{s}: {n}" for s, n in zip(seq_ids, out.num_new_tokens, strict=True))
        detail = (
            f"{where} the step computes {out.num_tokens} tokens ({rows}) "
            f"with max_num_batched_tokens={TOKEN_BUDGET}"
        )
        raise Failure("token_budget", detail, "budget")
    if len(scheduler.running) > MAX_NUM_SEQS:
        running = ", ".join(f"r{r.seq_id}" for r in scheduler.running)
        detail = f"{where}: {len(scheduler.running)} requests run ({running})"
        raise Failure("max_num_seqs", f"{detail} with max_num_seqs={MAX_NUM_SEQS}", "seats")


def _check_started(scheduler, before: dict[int, int], where: str) -> None:
    """A request that joined self.running this step was started by admit_waiting: it must
    be RUNNING, or the next step's walk skips it."""
    for request in scheduler.running:
        if request.seq_id not in before and request.status is not RequestStatus.RUNNING:
            detail = (
                f"{where}: r{request.seq_id} was started (it is in self.running) with "
                f"status {request.status.name}"
            )
            raise Failure("fcfs_admission", detail, "status")


def _check_counts_untouched(out, computed: dict[int, int], where: str) -> None:
    """The scheduler plans tokens; the engine counts them computed after the step. Only
    preempt (reset to 0) and kv_admit (to the cached prefix: 0 in the grader, whose pool
    caches nothing) may change num_computed_tokens."""
    for request in out.requests:
        admitted = request in out.admitted  # perhaps preempted earlier in the same step
        was = 0 if admitted else computed.get(request.seq_id, 0)
        if request.num_computed_tokens == was:
            continue
        method = "admit_waiting" if admitted else "schedule_running"
        detail = (
            f"{where}: {method} changed r{request.seq_id}'s num_computed_tokens from "
            f"{was} to {request.num_computed_tokens}"
        )
        raise Failure("fcfs_admission" if admitted else "running_first", detail, "advanced")


def _check_preempted(scheduler, out, victim, was_newest: bool, where: str) -> None:
    """A preempted request's state; ``was_newest``: it was among the newest running ones
    (the right victims), so computing it anyway means it was not skipped."""
    who = f"{where}: r{victim.seq_id} was preempted"
    if victim in out.requests:
        why = "skip" if was_newest else "victim"
        raise Failure("preemption", f"{who} and still computes in the same step", why)
    if victim.seq_id in scheduler.kv:
        held = scheduler.kv.num_tokens(victim.seq_id)
        raise Failure("preemption", f"{who} but still holds {held} slots", "free")
    if victim.num_computed_tokens != 0 or victim.status is not RequestStatus.WAITING:
        state = f"num_computed_tokens={victim.num_computed_tokens}, status {victim.status.name}"
        raise Failure("preemption", f"{who} with {state}", "recompute")
    if victim in scheduler.running or victim not in scheduler.waiting:
        raise Failure("preemption", f"{who} but is not back in the waiting queue alone", "head")


def compare(mine: Plan, ref: Plan, where: str) -> None:
    """The learner's plan against kvlab's, from the preemptions to the queue."""
    if mine.preempted != ref.preempted:
        detail = f"{where}: kvlab preempted {_names(ref.preempted)}, yours {_names(mine.preempted)}"
        mistake, taken = _preemption_mistake(mine, ref)
        if mistake == "listed":
            detail += f" in out.preempted, though your step took {_names(taken)} off self.running"
        raise Failure("preemption", detail, mistake)
    for seq_id, left in ref.before.items():
        got, want = mine.rows.get(seq_id, 0), ref.rows.get(seq_id, 0)
        if got == want:
            continue
        detail = (
            f"{where}: r{seq_id}, running with {tokens(left)} to compute, is given "
            f"{tokens(got)}; kvlab gives it {want}"
        )
        if mine.preempted and got == 0:
            raise Failure("preemption", detail, "retry")
        if left > 1 and 0 < want < left or 0 < got < want:
            raise Failure("chunked_prefill", detail, "chunk")
        raise Failure("running_first", detail, "skipped")
    if mine.admitted != ref.admitted:
        detail = f"{where}: kvlab admits {_names(ref.admitted)}, yours {_names(mine.admitted)}"
        started = set(ref.admitted) <= set(mine.rows) and set(mine.admitted) < set(ref.admitted)
        raise Failure("fcfs_admission", detail, "admitted" if started else "fcfs")
    for seq_id in ref.admitted:
        if mine.rows.get(seq_id) != ref.rows[seq_id]:
            detail = (
                f"{where}: r{seq_id} starts with {mine.rows.get(seq_id)} tokens; "
                f"kvlab gives it {ref.rows[seq_id]}"
            )
            raise Failure("chunked_prefill", detail, "chunk")
    if mine.waiting_after != ref.waiting_after:
        detail = (
            f"{where}: the waiting queue is {_names(mine.waiting_after)}, kvlab's "
            f"{_names(ref.waiting_after)}"
        )
        if ref.preempted:
            raise Failure("preemption", detail, "head")
        raise Failure("fcfs_admission", detail, "fcfs")


def _preemption_mistake(mine: Plan, ref: Plan) -> tuple[str, list[int]]:
    """The misconception a step whose preemptions differ from kvlab's shows, from who the
    learner's step took off self.running (re-admitted in the same step counts too); and
    those requests."""
    taken = [s for s in mine.before if s not in mine.running_after or s in mine.admitted]
    if sorted(taken) == sorted(ref.preempted):
        return "listed", taken  # the right victims, not (all) listed in out.preempted
    if not taken:
        return "no_victim", taken
    shorter, longer = sorted((mine.preempted, ref.preempted), key=len)
    if shorter and longer[: len(shorter)] == shorter:
        return "retry", taken  # the right victims, but too few or too many
    return "victim", taken


def check_end(engine, num_steps: int):
    """Every request finished, and the pool empty, once kvlab's engine is done."""
    if engine.has_unfinished_requests():
        left = engine.scheduler.running + list(engine.scheduler.waiting)
        detail = (
            f"kvlab's scheduler finished the trace; after {num_steps} steps and "
            f"{EXTRA_STEPS} more, yours has {_names([r.seq_id for r in left])} unfinished"
        )
        return Failure("finishes", detail, "skipped").args
    held, free = engine.kv.seq_ids(), engine.kv.num_free_blocks
    if held or free != NUM_BLOCKS:
        detail = f"every request finished, but the pool holds {NUM_BLOCKS - free} blocks"
        return Failure("finishes", f"{detail} (of {_names(held)})", "leak").args
    return None


def _names(seq_ids: list[int]) -> str:
    return "[" + ", ".join(f"r{s}" for s in seq_ids) + "]" if seq_ids else "nobody"
