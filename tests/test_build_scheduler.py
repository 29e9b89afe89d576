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


PLANTED = [
    (OverBudget, "token_budget"),
    (NoSeatLimit, "max_num_seqs"),
    (NoChunk, "chunked_prefill"),
    (WholePrompt, "chunked_prefill"),
    (SkipsAhead, "fcfs_admission"),
    (DecodesSkipped, "running_first"),
    (PreemptsOldest, "preemption"),
    (KeepsBlocks, "preemption"),
    (KeepsProgress, "preemption"),
    (BackOfTheQueue, "preemption"),
    (NoRetry, "preemption"),
    (UncaughtFull, "preemption"),
    (NotSkipped, "preemption"),
    (NotAdmitted, "fcfs_admission"),
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


@pytest.mark.parametrize(("planted", "criterion"), PLANTED, ids=[p.__name__ for p, _ in PLANTED])
def test_each_planted_defect_fails_its_criterion(planted, criterion):
    report = check_scheduler(planted, num_traces=200)
    failed = report.verdicts[-1]
    assert not failed.passed and failed.criterion == criterion, report
    assert "shortest case: r0" in failed.detail and failed.misconception
    assert all(v.passed for v in report.verdicts[:-1])


def test_a_right_scheduler_passes_every_rule(monkeypatch):
    monkeypatch.setattr(
        "kvlab.exercises.build_scheduler.check_generation",
        lambda *args: __import__("kvlab").exercises.grading.Verdict("generation", True),
    )
    report = check_scheduler(Right, num_traces=300)
    assert report.passed, report


def test_the_misconception_names_the_bug_not_a_neighbour():
    def misconception(planted):
        return check_scheduler(planted).verdicts[-1].misconception

    assert "skip it when the walk reaches it" in misconception(NotSkipped)
    assert "self.running[-1]" in misconception(PreemptsOldest)
    assert "out.admitted" in misconception(NotAdmitted)


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
    assert [hint_scheduler(level)[:4] for level in (1, 2, 3)] == ["Each", "Toke", "sche"]
    # The last hint is numbered steps, shown as lines in a notebook (not a quoted string).
    steps = hint_scheduler(3)
    assert repr(steps) == str(steps) and "  2. stop the loop if the budget is 0;" in steps
    with pytest.raises(ValueError, match="level=4 is not allowed"):
        hint_scheduler(4)
    assert "def _schedule_running" in reveal_scheduler()
    assert list(CRITERIA)[0] == "written" and list(CRITERIA)[-1] == "generation"
