"""Lab 02's build-it exercise: the grader passes a right arena, gives an untouched stub
nothing, and catches each planted defect with the criterion meant for it.

The arenas below are what learners write: three methods over their own data. ``Right``
is a correct one written from scratch (not kvlab's code), so the check is shown to accept
an independent solution; each planted defect changes one thing in it.
"""

from __future__ import annotations

import pytest

import kvlab
from kvlab.cache.manager import CacheFullError
from kvlab.exercises.build_arena import (
    CRITERIA,
    check_arena,
    check_generation,
    hint_arena,
    reveal_arena,
)
from tests.solutions.lab02_arena import MyArena

pytestmark = pytest.mark.usefixtures("one_thread")


class Stub:
    """The lab's starting point: nothing written."""

    def __init__(self, num_slots):
        self.num_slots = num_slots

    def reserve(self, seq_id, num_slots):
        raise NotImplementedError

    def free(self, seq_id):
        raise NotImplementedError

    def holes(self):
        raise NotImplementedError


Right = MyArena  # the solution, as a learner writes it


class BestFit(Right):
    def reserve(self, seq_id, num_slots):
        fitting = [h for h in self.holes() if h[1] >= num_slots]
        if not fitting:
            raise CacheFullError("full")
        start = min(fitting, key=lambda h: (h[1], h[0]))[0]
        self.ranges[seq_id] = (start, num_slots)
        return start


class StrictlyLonger(Right):
    """Off by one: a hole of exactly num_slots is thought too short."""

    def reserve(self, seq_id, num_slots):
        for start, length in self.holes():
            if length > num_slots:
                self.ranges[seq_id] = (start, num_slots)
                return start
        raise CacheFullError("full")


class RecordsBeforeChecking(Right):
    """A refused reservation leaves its range behind."""

    def reserve(self, seq_id, num_slots):
        self.ranges[seq_id] = (self.num_slots, 0)  # a placeholder, before looking
        for start, length in self.holes():
            if length >= num_slots:
                self.ranges[seq_id] = (start, num_slots)
                return start
        self.ranges[("lost", seq_id)] = (self.num_slots - 1, 1)
        del self.ranges[seq_id]
        raise CacheFullError("full")


class NoMerge(Right):
    """Keeps a list of freed runs and never merges neighbours."""

    def __init__(self, num_slots):
        super().__init__(num_slots)
        self.free_runs = [(0, num_slots)]

    def holes(self):
        return sorted(self.free_runs)

    def reserve(self, seq_id, num_slots):
        for start, length in sorted(self.free_runs):
            if length >= num_slots:
                self.free_runs.remove((start, length))
                if length > num_slots:
                    self.free_runs.append((start + num_slots, length - num_slots))
                self.ranges[seq_id] = (start, num_slots)
                return start
        raise CacheFullError("full")

    def free(self, seq_id):
        self.free_runs.append(self.ranges.pop(seq_id))


class NoTail(Right):
    """Forgets the free run after the last range."""

    def holes(self):
        return [h for h in super().holes() if sum(h) != self.num_slots or not self.ranges]


class ReturnsEnd(Right):
    def reserve(self, seq_id, num_slots):
        return super().reserve(seq_id, num_slots) + num_slots


class NoReturn(Right):
    def reserve(self, seq_id, num_slots):
        super().reserve(seq_id, num_slots)


class WrongError(Right):
    def reserve(self, seq_id, num_slots):
        try:
            return super().reserve(seq_id, num_slots)
        except CacheFullError:
            raise ValueError("no room") from None


class HolesAsLists(Right):
    """Right, with lists for pairs: accepted."""

    def holes(self):
        return [list(h) for h in super().holes()]


class Overlapping(Right):
    """Forgets the ranges it handed out: every reservation starts at slot 0."""

    def reserve(self, seq_id, num_slots):
        if num_slots > self.num_slots:
            raise CacheFullError("full")
        return 0

    def holes(self):
        return [(0, self.num_slots)]

    def free(self, seq_id):
        pass


@pytest.fixture(scope="module")
def tiny_model():
    model, _ = kvlab.load_model("tiny", device="cpu")
    return model


PROMPTS = [[5, 6, 7, 8, 9] * 4, [11, 12, 13] * 5, [21, 22] * 9, [31, 32, 33, 34] * 3]


def grade(arena_class, model):
    return check_arena(arena_class, model=model, prompts=PROMPTS)


def test_a_right_arena_passes_every_criterion_including_real_generation(tiny_model):
    report = grade(Right, tiny_model)
    assert report.passed and report.score == len(CRITERIA), repr(report)
    assert "4 requests, the same tokens as with kvlab's arena" in repr(report)


def test_holes_as_lists_are_accepted(tiny_model):
    assert grade(HolesAsLists, tiny_model).passed


def test_the_untouched_stub_scores_zero_and_says_what_to_write(tiny_model):
    report = grade(Stub, tiny_model)
    assert report.score == 0
    text = repr(report)
    assert "holes() is not written yet" in text and "hint_arena(1)" in text


@pytest.mark.parametrize(
    "arena_class, criterion, words",
    [
        (BestFit, "first_fit", "best-fit"),
        (StrictlyLonger, "first_fit", "exactly num_slots long fits"),
        (RecordsBeforeChecking, "refusal_changes_nothing", "check the room first"),
        (NoMerge, "holes", "merge a freed range with its neighbours"),
        (Overlapping, "holes", ""),
        (NoTail, "holes", "the tail after the last range is a hole too"),
        (ReturnsEnd, "first_fit", "the start of the range, not its end"),
        (NoReturn, "first_fit", "must return the start"),
        (WrongError, "refuses", "raises CacheFullError"),
    ],
)
def test_each_planted_defect_is_caught_by_its_criterion(tiny_model, arena_class, criterion, words):
    report = grade(arena_class, tiny_model)
    failed = [v for v in report.verdicts if not v.passed]
    assert failed and failed[0].criterion == criterion, repr(report)
    assert words in failed[0].misconception
    assert "shortest case:" in failed[0].detail
    assert not report.passed


def test_a_failure_is_shrunk_to_a_few_operations(tiny_model):
    (verdict,) = [v for v in grade(BestFit, tiny_model).verdicts if not v.passed]
    steps = verdict.detail.split("shortest case: ")[1].count(";") + 1
    assert steps <= 5, verdict.detail  # reserve, reserve, free, reserve is the classic case


def test_the_generation_criterion_fails_when_ranges_overlap(tiny_model):
    # The property checks stop an overlapping arena first; run the last criterion on it
    # alone to show it is no formality: overlapping ranges corrupt the K/V of the others.
    verdict = check_generation(Overlapping, tiny_model, PROMPTS)
    assert not verdict.passed and "overwrote" in verdict.misconception
    assert check_generation(Right, tiny_model, PROMPTS).passed


def test_hints_come_in_steps_and_the_reference_is_kvlabs_own():
    assert "sorted" in hint_arena(1)
    assert "cursor" in hint_arena(2)
    assert "first with length >= num_slots" in hint_arena(3)
    with pytest.raises(ValueError, match="level=4 is not allowed"):
        hint_arena(4)
    assert "def reserve" in reveal_arena() and "def holes" in reveal_arena()
