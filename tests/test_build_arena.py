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


class HolesOutOfOrder(Right):
    """Keeps merged free runs in a list and reserves from them in address order, but
    holes() lists them as they were appended (a freed run goes to the end)."""

    def __init__(self, num_slots):
        super().__init__(num_slots)
        self.free_runs = [(0, num_slots)]

    def holes(self):
        return list(self.free_runs)

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
        start, length = self.ranges.pop(seq_id)
        end = start + length
        for run in list(self.free_runs):
            if sum(run) == start:
                self.free_runs.remove(run)
                start, length = run[0], length + run[1]
            elif run[0] == end:
                self.free_runs.remove(run)
                length += run[1]
        self.free_runs.append((start, length))


class HolesAsStartEnd(Right):
    """holes() lists (start, end) pairs; reserve reads them as such, so it places right."""

    def holes(self):
        return [(start, start + length) for start, length in super().holes()]

    def reserve(self, seq_id, num_slots):
        for start, end in self.holes():
            if end - start >= num_slots:
                self.ranges[seq_id] = (start, num_slots)
                return start
        raise CacheFullError("full")


class NextFit(Right):
    """Next-fit, already with >=: the search goes on from where the last range ended."""

    def __init__(self, num_slots):
        super().__init__(num_slots)
        self.cursor = 0

    def reserve(self, seq_id, num_slots):
        holes = self.holes()
        later = [h for h in holes if h[0] >= self.cursor] + [h for h in holes if h[0] < self.cursor]
        for start, length in later:
            if length >= num_slots:
                self.ranges[seq_id] = (start, num_slots)
                self.cursor = start + num_slots
                return start
        raise CacheFullError("full")


class FromTheTop(Right):
    """Places a range at the end of the first hole that fits, not at its start: nothing in
    what the check sees says why, so it names no misconception."""

    def reserve(self, seq_id, num_slots):
        for start, length in self.holes():
            if length >= num_slots:
                self.ranges[seq_id] = (start + length - num_slots, num_slots)
                return start + length - num_slots
        raise CacheFullError("full")


class StrictlyLongerTailTwice(StrictlyLonger):
    """StrictlyLonger's reserve over the right holes, and a holes() that lists the tail
    twice: it places exactly as StrictlyLonger does."""

    def holes(self):
        holes = super().holes()
        return holes + holes[-1:]

    def reserve(self, seq_id, num_slots):
        for start, length in Right.holes(self):
            if length > num_slots:
                self.ranges[seq_id] = (start, num_slots)
                return start
        raise CacheFullError("full")


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


PLANTED = [
    (
        BestFit,
        "first_fit",
        "this is best-fit (the smallest hole that fits); first-fit takes the first one",
    ),
    (StrictlyLonger, "first_fit", "a hole that is exactly num_slots long fits (>=, not >)"),
    (  # not ">=, not >": it already uses >=
        NextFit,
        "first_fit",
        "this is next-fit (the search goes on from where the last range ended); "
        "first-fit starts at slot 0 every time",
    ),
    (ReturnsEnd, "first_fit", "reserve returns the start of the range, not its end"),
    (NoReturn, "first_fit", "reserve must return the start of the range it placed"),
    (FromTheTop, "first_fit", ""),
    (
        WrongError,
        "refuses",
        "a reserve that finds no room raises CacheFullError (imported in cell 1)",
    ),
    (
        RecordsBeforeChecking,
        "refusal_changes_nothing",
        "check the room first, then record the range",
    ),
    # These reserves place as their own holes() says: the bug is in holes().
    (
        NoMerge,
        "holes",
        "two free runs side by side are one hole: merge a freed range with its neighbours",
    ),
    (NoTail, "holes", "the tail after the last range is a hole too"),
    (
        Overlapping,
        "holes",
        "the range reserve placed is no longer free: record it, and holes() leaves it out",
    ),
    (HolesOutOfOrder, "holes", "holes() must be in address order"),
    (HolesAsStartEnd, "holes", "a hole is (start, length), not (start, end)"),
]


@pytest.mark.parametrize(
    ("arena_class", "criterion", "misconception"), PLANTED, ids=[p[0].__name__ for p in PLANTED]
)
def test_each_planted_defect_fails_its_criterion_and_names_its_misconception(
    tiny_model, arena_class, criterion, misconception
):
    report = grade(arena_class, tiny_model)
    failed = [v for v in report.verdicts if not v.passed]
    assert [v.criterion for v in failed] == [criterion], repr(report)
    assert failed[0].misconception == misconception, repr(report)
    assert "shortest case:" in failed[0].detail
    assert not report.passed


def test_the_same_reserve_gets_the_same_verdict_whatever_holes_returns(tiny_model):
    # Both place with ">" (a hole of exactly num_slots is refused); one also lists the tail
    # twice in holes(). That wrong holes() must not hide the reserve's bug behind a tick.
    for arena_class in (StrictlyLonger, StrictlyLongerTailTwice):
        report = grade(arena_class, tiny_model)
        verdicts = {v.criterion: v.passed for v in report.verdicts}
        assert verdicts["first_fit"] is False, repr(report)


def test_a_criterion_after_the_first_failure_is_not_ticked(tiny_model):
    report = grade(StrictlyLonger, tiny_model)  # its reserve breaks "refuses" too
    assert [v.criterion for v in report.verdicts] == ["written", "first_fit"]
    assert "refuses" not in {v.criterion for v in report.verdicts if v.passed}


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
    assert "cursor" in hint_arena(2) and "cursor" not in hint_arena(1)
    steps = hint_arena(3).splitlines()[1:]
    assert [line[:2] for line in steps if line[0].isdigit()] == ["1.", "2.", "3.", "4.", "5."]
    assert "length >= num_slots" in hint_arena(3) and "length >= num_slots" not in hint_arena(2)
    with pytest.raises(ValueError, match="level=4 is not allowed"):
        hint_arena(4)
    assert "def reserve" in reveal_arena() and "def holes" in reveal_arena()
