"""Lab 04's build-it exercise: the grader passes a right scheduler step, gives an untouched
stub nothing, and catches each planted defect with the criterion meant for it.

``Right`` is what a learner writes: the three methods of ``StepScheduler``, from scratch
(not kvlab's ``Scheduler`` code: one request at a time, no batched decode path); each
planted defect changes one thing in it.
"""

from __future__ import annotations

import re

import pytest

from kvlab.cache.manager import CacheFullError
from kvlab.engine.model_free import bookkeeping_cache
from kvlab.engine.request import RequestStatus
from kvlab.engine.scheduler_config import SchedulerConfig
from kvlab.exercises.build_scheduler import (
    CRITERIA,
    StepScheduler,
    check_generation,
    check_scheduler,
    hint_scheduler,
    reveal_scheduler,
)
from kvlab.exercises.scheduler_grader import first_difference
from kvlab.exercises.scheduler_rules import MISCONCEPTIONS
from tests.conftest import random_prompts

pytestmark = pytest.mark.usefixtures("one_thread")


class Right(StepScheduler):
    def schedule_running(self, out, budget):
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING:
                continue  # preempted earlier in this walk
            n = self.tokens_now(request, budget)
            if n == 0:
                break
            if not self.allocate_or_preempt(request, n, out):
                continue
            out.add(request, n)
            budget -= n
        return budget

    def tokens_now(self, request, budget):
        return min(request.num_tokens - request.num_computed_tokens, budget)

    def allocate_or_preempt(self, request, n, out):
        while True:
            try:
                self.allocate(request, n, out)
                return True
            except CacheFullError:
                victim = self.pick_victim()
                self.preempt(victim, out)
                if victim is request:
                    return False

    def pick_victim(self):
        return self.running[-1]

    def preempt(self, victim, out):
        self.running.remove(victim)
        self.kv.free(victim.seq_id)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        self.waiting.push_front(victim)
        out.preempted.append(victim)

    def admit_waiting(self, out, budget):
        started = []
        for request in self.waiting:
            if budget <= 0 or not self.has_seat():
                break
            n = self.kv_admit(request, budget)
            if n is None:
                break
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.add(request, self.first_tokens(request, n))
            out.admitted.append(request)
            budget -= n
            started.append(request)
        for request in started:
            self.waiting.remove(request)

    def has_seat(self):
        return len(self.running) < self.config.max_num_seqs

    def first_tokens(self, request, n):
        return n


class OverBudget(Right):
    def tokens_now(self, request, budget):
        return request.num_tokens - request.num_computed_tokens


class NoSeatLimit(Right):
    def has_seat(self):
        return True


class NoChunk(Right):
    def tokens_now(self, request, budget):
        left = request.num_tokens - request.num_computed_tokens
        return left if left <= budget else 0


class WholePrompt(Right):
    def first_tokens(self, request, n):
        return request.num_tokens


class SkipsAhead(Right):
    def admit_waiting(self, out, budget):
        started = []
        for request in self.waiting:
            if budget <= 0 or not self.has_seat():
                break
            n = self.kv_admit(request, budget)
            if n is None:
                continue  # tries the next one instead of stopping
            request.status = RequestStatus.RUNNING
            self.running.append(request)
            out.add(request, n)
            out.admitted.append(request)
            budget -= n
            started.append(request)
        for request in started:
            self.waiting.remove(request)


class DecodesSkipped(Right):
    def tokens_now(self, request, budget):
        left = request.num_tokens - request.num_computed_tokens
        return (
            0
            if left == 1 and request.num_computed_tokens > 0 and request.seq_id % 2
            else (min(left, budget))
        )

    def schedule_running(self, out, budget):
        for request in list(self.running):
            if request.status is not RequestStatus.RUNNING:
                continue
            n = self.tokens_now(request, budget)
            if n == 0:
                continue
            if self.allocate_or_preempt(request, n, out):
                out.add(request, n)
                budget -= n
        return budget


class PreemptsOldest(Right):
    def pick_victim(self):
        return self.running[0]


class KeepsBlocks(Right):
    def preempt(self, victim, out):
        self.running.remove(victim)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        self.waiting.push_front(victim)
        out.preempted.append(victim)


class KeepsProgress(Right):
    def preempt(self, victim, out):
        self.running.remove(victim)
        self.kv.free(victim.seq_id)
        victim.status = RequestStatus.WAITING
        self.waiting.push_front(victim)
        out.preempted.append(victim)


class BackOfTheQueue(Right):
    def preempt(self, victim, out):
        self.running.remove(victim)
        self.kv.free(victim.seq_id)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        self.waiting.push(victim)
        out.preempted.append(victim)


class NoRetry(Right):
    def allocate_or_preempt(self, request, n, out):
        try:
            self.allocate(request, n, out)
            return True
        except CacheFullError:
            self.preempt(self.pick_victim(), out)
            return False


class NotSkipped(Right):
    """Walks the running requests without skipping those it preempted a moment ago."""

    def schedule_running(self, out, budget):
        for request in list(self.running):
            n = self.tokens_now(request, budget)
            if n == 0:
                break
            if request.status is RequestStatus.RUNNING and not self.allocate_or_preempt(
                request, n, out
            ):
                continue
            out.add(request, n)
            budget -= n
        return budget


class NotAdmitted(Right):
    """Starts waiting requests but never lists them in out.admitted."""

    def admit_waiting(self, out, budget):
        super().admit_waiting(out, budget)
        out.admitted.clear()


class UncaughtFull(Right):
    def allocate_or_preempt(self, request, n, out):
        self.allocate(request, n, out)
        return True


class PreemptsTwo(Right):
    """Preempts two victims at a time where one is enough."""

    def allocate_or_preempt(self, request, n, out):
        while True:
            try:
                self.allocate(request, n, out)
                return True
            except CacheFullError:
                for _ in range(2):
                    victim = self.pick_victim()
                    self.preempt(victim, out)
                    if victim is request:
                        return False


class NotListed(Right):
    """Preempts the right victim but never lists it in out.preempted."""

    def preempt(self, victim, out):
        self.running.remove(victim)
        self.kv.free(victim.seq_id)
        victim.num_computed_tokens = 0
        victim.status = RequestStatus.WAITING
        self.waiting.push_front(victim)


class NeverPreempts(Right):
    """Leaves a request that finds no block out of the step instead of preempting."""

    def allocate_or_preempt(self, request, n, out):
        try:
            self.allocate(request, n, out)
            return True
        except CacheFullError:
            return False


class NotRunning(Right):
    """Starts waiting requests without setting their status to RUNNING."""

    def admit_waiting(self, out, budget):
        super().admit_waiting(out, budget)
        for request in out.admitted:
            request.status = RequestStatus.WAITING


class AdvancesComputed(Right):
    """Counts the planned tokens as computed, in both methods (the engine does that)."""

    def schedule_running(self, out, budget):
        left = super().schedule_running(out, budget)
        for request, n in zip(out.requests, out.num_new_tokens, strict=True):
            request.num_computed_tokens += n
        return left

    def admit_waiting(self, out, budget):
        planned = len(out.requests)
        super().admit_waiting(out, budget)
        for request, n in zip(out.requests[planned:], out.num_new_tokens[planned:], strict=True):
            request.num_computed_tokens += n


class AdvancesRunning(Right):
    """Counts a running request's planned tokens as computed (the engine does that)."""

    def schedule_running(self, out, budget):
        left = super().schedule_running(out, budget)
        for request, n in zip(out.requests, out.num_new_tokens, strict=True):
            request.num_computed_tokens += n
        return left


# (planted defect, the criterion that must catch it, the misconception it must name)
PLANTED = [
    (OverBudget, "token_budget", "budget"),
    (NoSeatLimit, "max_num_seqs", "seats"),
    (NoChunk, "chunked_prefill", "chunk"),
    (WholePrompt, "chunked_prefill", "chunk"),
    (SkipsAhead, "fcfs_admission", "fcfs"),
    (DecodesSkipped, "running_first", "skipped"),
    (PreemptsOldest, "preemption", "victim"),
    (KeepsBlocks, "preemption", "free"),
    (KeepsProgress, "preemption", "recompute"),
    (BackOfTheQueue, "preemption", "head"),
    (NoRetry, "preemption", "retry"),
    (PreemptsTwo, "preemption", "retry"),
    (UncaughtFull, "preemption", "uncaught"),
    (NeverPreempts, "preemption", "no_victim"),
    (NotSkipped, "preemption", "skip"),
    (NotListed, "preemption", "listed"),
    (NotAdmitted, "fcfs_admission", "admitted"),
    (NotRunning, "fcfs_admission", "status"),
    (AdvancesComputed, "fcfs_admission", "advanced"),
    (AdvancesRunning, "running_first", "advanced"),
]


def test_the_stub_scores_nothing():
    report = check_scheduler(StepScheduler)
    assert report.score == 0 and len(report.verdicts) == 1
    assert "schedule_running() is not written yet" in report.verdicts[0].detail
    assert not check_scheduler(object).passed


class HalfWritten(Right):
    """Methods still as the lab's cell has them: ``raise NotImplementedError``."""

    def preempt(self, victim, out):
        raise NotImplementedError

    def admit_waiting(self, out, budget):
        raise NotImplementedError


def test_a_method_that_still_raises_is_not_written():
    verdict = check_scheduler(HalfWritten).verdicts[0]
    assert not verdict.passed and verdict.detail == "preempt() is not written yet"


@pytest.mark.parametrize(
    ("planted", "criterion", "misconception"), PLANTED, ids=[p.__name__ for p, *_ in PLANTED]
)
def test_each_planted_defect_fails_its_criterion_named(planted, criterion, misconception):
    report = check_scheduler(planted, num_traces=200)
    failed = report.verdicts[-1]
    assert not failed.passed and failed.criterion == criterion, report
    assert "shortest case: r0" in failed.detail, report
    assert failed.misconception == MISCONCEPTIONS[misconception], report
    assert all(v.passed for v in report.verdicts[:-1])


def test_a_right_scheduler_passes_every_rule(monkeypatch):
    monkeypatch.setattr(
        "kvlab.exercises.build_scheduler.check_generation",
        lambda *args: __import__("kvlab").exercises.grading.Verdict("generation", True),
    )
    report = check_scheduler(Right, num_traces=300)
    assert report.passed, report


def test_what_the_failing_step_saw_is_named():
    """The messages say what the learner's own step did, not only what kvlab did."""
    listed = first_difference(NotListed, [(0, 8, 6), (0, 5, 5), (3, 13, 1)])
    assert listed[1].endswith(
        "yours nobody in out.preempted, though your step took [r2] off self.running"
    ), listed
    status = first_difference(NotRunning, [(0, 1, 1)])
    assert status[1] == "at t=0: r0 was started (it is in self.running) with status WAITING"
    advanced = first_difference(AdvancesRunning, [(0, 9, 1)])
    assert advanced[1] == (
        "at t=1: schedule_running changed r0's num_computed_tokens from 8 to 9"
    ), advanced


def test_the_shortest_case_is_small():
    report = check_scheduler(PreemptsOldest)
    case = report.verdicts[-1].detail.split("shortest case: ")[1]
    assert case.count(";") <= 2, case  # at most three requests show it


def test_a_right_scheduler_serves_real_requests_chunked_and_preempted(tiny):
    prompts = random_prompts(tiny.config.vocab_size, [30, 22, 41, 17])
    verdict = check_generation(Right, tiny, prompts)
    assert verdict.passed, verdict
    assert int(re.search(r"(\d+) preemptions?", verdict.detail)[1]) > 0


def test_a_scheduler_that_keeps_blocks_stops_the_engine(tiny):
    prompts = random_prompts(tiny.config.vocab_size, [30, 22, 41, 17])
    verdict = check_generation(KeepsBlocks, tiny, prompts)
    assert not verdict.passed and "the engine stopped" in verdict.detail, verdict


def test_the_grader_compares_against_kvlab_not_itself():
    assert first_difference(Right, [(0, 9, 3), (0, 12, 6), (1, 20, 8)]) is None
    failure = first_difference(PreemptsOldest, [(0, 9, 3), (0, 12, 6), (1, 20, 8)])
    assert failure is not None and failure[0] == "preemption"


def test_a_step_scheduler_refuses_other_settings():
    kv = bookkeeping_cache(num_blocks=4, block_size=4).manager
    with pytest.raises(ValueError, match="preemption_mode='swap' is not allowed"):
        Right(SchedulerConfig(preemption_mode="swap"), kv, None)
    with pytest.raises(ValueError, match="scheduling='static' is not allowed"):
        Right(SchedulerConfig(scheduling="static"), kv)


def test_help_comes_in_steps():
    assert [hint_scheduler(level)[:4] for level in (1, 2, 3)] == ["Two ", "Pree", "sche"]
    # The last hint is numbered steps, shown as lines in a notebook (not a quoted string).
    steps = hint_scheduler(3)
    assert repr(steps) == str(steps) and "\n  6. out.add(request, n); budget -= n\n" in steps
    with pytest.raises(ValueError, match="level=4 is not allowed"):
        hint_scheduler(4)
    assert "def _schedule_running" in reveal_scheduler()
    assert list(CRITERIA)[0] == "written" and list(CRITERIA)[-1] == "generation"
