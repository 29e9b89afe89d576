"""The grading engine of lab 02's build-it arena: a sequence of reserves and frees on the
learner's arena and on kvlab's ``ContiguousArena`` side by side.

``first_difference``, ``random_ops``, ``candidates`` and ``show_op`` are the build-it's
``Search`` (``kvlab.exercises.build_arena``); ``ArenaRun``, ``run`` and ``view`` its
``Replay``. Not handled: other arenas than first-fit.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from kvlab.cache.base import CacheUsage
from kvlab.cache.contiguous_arena import ContiguousArena
from kvlab.cache.manager import CacheFullError
from kvlab.exercises.grading import block_infos
from kvlab.exercises.learner_pool import LearnerError, call_learner

NUM_SLOTS = 64
Op = tuple  # ("reserve", seq_id, num_slots) or ("free", seq_id)
MISCONCEPTIONS = {
    "returns_none": "reserve must return the start of the range it placed",
    "not_a_slot": "reserve returns the start of the range: one slot number",
    "overlaps": "the range was placed on slots another request holds",
    "exact_fit": "a hole that is exactly num_slots long fits (>=, not >)",
    "raise_full": "a reserve that finds no room raises CacheFullError (imported in cell 1)",
    "earlier_refusal": "an earlier refused reserve changed your arena: a refusal must change "
    "nothing",
    "check_first": "check the room first, then record the range",
}


@dataclass
class _Seen:
    """What the operations before the failing one showed, for naming the misconception."""

    refused_before: bool = False  # kvlab's arena refused a reserve earlier in the case
    last_end: int | None = None  # where the last range placed ends (a next-fit cursor)
    wrong_holes: tuple | None = None  # the first holes() difference, kept while reserves run on


def _holes(arena) -> list[tuple[int, int]]:
    try:
        return [tuple(hole) for hole in arena.holes()]
    except Exception as error:  # noqa: BLE001 - any error of the learner's code is a verdict
        raise LearnerError("holes", f"holes() raised {type(error).__name__}: {error}") from error


def first_difference(make_arena: Callable, ops: list[Op]) -> tuple[str, str, str] | None:
    """(criterion, what happened, misconception) of the first difference, or None; the
    misconception is "" when nothing the failing operation saw points at one.

    A wrong ``holes()`` changes nothing, so the reserves after it are still compared: one
    that then places or refuses wrongly is a bug of ``reserve`` (its criteria come first),
    unless it did just what first-fit over the learner's own ``holes()`` does. So a bug in
    ``reserve`` gets one verdict whether or not ``holes()`` went wrong before it showed.
    """
    mine, ref = make_arena(NUM_SLOTS), ContiguousArena(NUM_SLOTS)
    seen = _Seen()
    for index, op in enumerate(ops):
        where = f"operation {index + 1}, {show_op(op)}"
        try:
            failure = _one_op(make_arena, mine, ref, op, where, seen)
            if failure is None and seen.wrong_holes is None:  # the first holes() difference
                got, expected = _holes(mine), ref.holes()
                if got != expected:
                    detail = f"after {where}: holes() = {got}, expected {expected}"
                    seen.wrong_holes = "holes", detail, _wrong_holes(got, expected, op)
        except LearnerError as error:
            return _raised(error, op, ref, where)
        if failure is not None:
            return failure
        if op[0] == "reserve" and op[1] in ref:
            placed = ref.range_of(op[1])
            seen.last_end = placed.start + placed.num_slots
        seen.refused_before |= op[0] == "reserve" and op[1] not in ref
    return seen.wrong_holes


def _raised(error: LearnerError, op: Op, ref, where: str) -> tuple[str, str, str]:
    """The verdict on a learner's method that raised: a reserve that should have been
    refused names the error to raise; any other error is a bug the message shows."""
    if error.method != "reserve":
        return "holes", f"{where}: {error}", ""
    why = MISCONCEPTIONS["raise_full"] if op[1] not in ref else ""  # kvlab's refused it too
    return "refuses", f"{where}: {error}", why


def _one_op(make_arena, mine, ref, op: Op, where: str, seen: _Seen):
    """Run ``op`` on both arenas; the difference in placement or refusal it shows, or None."""
    if op[0] == "free":
        ref.free(op[1])
        try:
            mine.free(op[1])
        except Exception as error:  # noqa: BLE001 - even a CacheFullError is a bug of free
            raise LearnerError("free", f"free() raised {type(error).__name__}: {error}") from error
        return None
    _, seq_id, num_slots = op
    before, kvlab_before = _holes(mine), ref.holes()
    expected = call_learner("reserve", ref.reserve, seq_id, num_slots)
    got = call_learner("reserve", mine.reserve, seq_id, num_slots)
    if got is None:
        return "first_fit", f"{where}: reserve returned None", MISCONCEPTIONS["returns_none"]
    refused = isinstance(got, CacheFullError)
    differs = refused != isinstance(expected, CacheFullError) or (not refused and got != expected)
    if differs and seen.wrong_holes is not None and _follows(before, num_slots, got):
        return seen.wrong_holes  # reserve did what the learner's wrong holes() said
    if refused != isinstance(expected, CacheFullError):
        if not refused:
            why = _found_room(kvlab_before, num_slots, got)
            return "refuses", f"{where}: returned {got}, but no hole fits", why
        why = _missed_room(make_arena, kvlab_before, before, num_slots, expected)
        if not why and seen.refused_before:  # a change that holes() does not show
            why = MISCONCEPTIONS["earlier_refusal"]
        return "refuses", f"{where}: refused, but slot {expected} starts a hole that fits", why
    if refused and _holes(mine) != before:
        detail = f"{where}: holes went from {before} to {_holes(mine)}"
        return "refusal_changes_nothing", detail, MISCONCEPTIONS["check_first"]
    if differs:
        why = _wrong_start(make_arena, kvlab_before, before, num_slots, got, expected, seen)
        return "first_fit", f"{where}: placed at slot {got}, first-fit says {expected}", why
    return None


def _follows(holes: list, num_slots: int, got) -> bool:
    """Whether ``got`` (a start, or a refusal) is what first-fit over ``holes``, in the
    order listed, gives: a reserve that follows the learner's own ``holes()``."""
    if any(len(hole) != 2 for hole in holes):
        return False
    starts = [start for start, n in holes if n >= num_slots]
    if isinstance(got, CacheFullError):
        return not starts
    return bool(starts) and got == starts[0]


# ---- naming the misconception from what the failing operation saw ---------------------------
# ``holes`` are kvlab's holes before the failing reserve, ``mine`` the learner's ``holes()``
# then: they differ only when the learner's ``holes()`` went wrong earlier in the case.


def _takes_an_exact_fit(make_arena) -> bool:
    """Whether a fresh arena of the learner's places a range exactly as long as itself: an
    arena that compares with ``>`` refuses it."""
    try:
        return make_arena(NUM_SLOTS).reserve(0, NUM_SLOTS) == 0
    except Exception:  # noqa: BLE001 - a refusal or any error: it does not take it
        return False


def _found_room(holes: list, num_slots: int, got) -> str:
    """A reserve placed a range where no hole is long enough."""
    if not isinstance(got, int):
        return MISCONCEPTIONS["not_a_slot"]
    length = dict(holes).get(got)
    if length is not None:
        return f"the hole at slot {got} is {length} long: a hole fits when length >= num_slots"
    if not any(start <= got < start + n for start, n in holes):
        return MISCONCEPTIONS["overlaps"]
    return ""


def _missed_room(make_arena, holes: list, mine: list, num_slots: int, expected: int) -> str:
    """A reserve refused, though kvlab's hole at ``expected`` fits."""
    if mine != holes:
        return _holes_mistake(mine, holes)
    if dict(holes)[expected] == num_slots and not _takes_an_exact_fit(make_arena):
        return MISCONCEPTIONS["exact_fit"]
    return ""


def _wrong_start(
    make_arena, holes: list, mine: list, num_slots: int, got, expected, seen: _Seen
) -> str:
    """A reserve placed its range at ``got``, not at first-fit's ``expected``."""
    if not isinstance(got, int):
        return MISCONCEPTIONS["not_a_slot"]
    if got == expected + num_slots:
        return "reserve returns the start of the range, not its end"
    inside = [(start, n) for start, n in holes if start <= got < start + n]
    if not inside or got + num_slots > sum(inside[0]):
        return MISCONCEPTIONS["overlaps"]
    if mine != holes:
        return _holes_mistake(mine, holes)
    if inside[0][0] != got:
        return ""  # inside a hole, not at its start: nothing names why
    fitting = [(start, n) for start, n in holes if n >= num_slots]
    longer = [start for start, n in holes if n > num_slots]
    exact_first = fitting[0][1] == num_slots and bool(longer) and got == longer[0]
    if exact_first and not _takes_an_exact_fit(make_arena):
        return MISCONCEPTIONS["exact_fit"]
    if got == min(fitting, key=lambda h: (h[1], h[0]))[0]:
        return "this is best-fit (the smallest hole that fits); first-fit takes the first one"
    if seen.last_end is not None:
        later = [start for start, _ in fitting if start >= seen.last_end]
        if got == (later or [fitting[0][0]])[0]:
            return (
                "this is next-fit (the search goes on from where the last range ended); "
                "first-fit starts at slot 0 every time"
            )
    return ""


def _wrong_holes(mine: list, expected: list, op: Op) -> str:
    """``holes()`` differs from kvlab's after ``op``."""
    why = _holes_mistake(mine, expected)
    if why or any(len(hole) != 2 for hole in mine):
        return why
    free_mine, free_expected = sum(n for _, n in mine), sum(n for _, n in expected)
    if op[0] == "reserve" and free_mine == free_expected + op[2]:
        return "the range reserve placed is no longer free: record it, and holes() leaves it out"
    if op[0] == "free" and free_mine != free_expected:
        return "free gives back exactly the slots of the range, no more and no fewer"
    return ""


def _holes_mistake(mine: list, expected: list) -> str:
    """What the learner's holes, against kvlab's, show was done wrong in ``holes()``, or ""."""
    if any(len(hole) != 2 for hole in mine):
        return "each hole is a pair (start, length)"
    if sorted(mine) == expected:
        return "holes() must be in address order"
    if mine == [(start, start + n) for start, n in expected]:
        return "a hole is (start, length), not (start, end)"
    if expected and sum(expected[-1]) == NUM_SLOTS and mine == expected[:-1]:
        return "the tail after the last range is a hole too"
    if _merged(mine) == expected:
        return "two free runs side by side are one hole: merge a freed range with its neighbours"
    return ""


def _merged(holes: list) -> list:
    """The holes in address order, runs side by side joined into one."""
    merged: list[tuple[int, int]] = []
    for start, n in sorted(holes):
        if merged and sum(merged[-1]) == start:
            merged[-1] = (merged[-1][0], merged[-1][1] + n)
        else:
            merged.append((start, n))
    return merged


def show_op(op: Op) -> str:
    return f"reserve(seq {op[1]}, {op[2]} slots)" if op[0] == "reserve" else f"free(seq {op[1]})"


# ---- random operations, and shrinking a failure -------------------------------------------


def random_ops(rng: random.Random) -> list[Op]:
    """2 to 24 reserves and frees, each free of a sequence that holds a range."""
    ops, live, next_id = [], [], 0
    for _ in range(rng.randint(2, 24)):
        if live and rng.random() < 0.4:
            ops.append(("free", live.pop(rng.randrange(len(live)))))
        else:
            ops.append(("reserve", next_id, rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 70])))
            live.append(next_id)
            next_id += 1
    return valid_ops(ops)


def valid_ops(ops: list[Op]) -> list[Op]:
    """Drop frees of sequences that hold nothing (after shrinking removed their reserve)."""
    ref, kept = ContiguousArena(NUM_SLOTS), []
    for op in ops:
        if op[0] == "reserve":
            call_learner("reserve", ref.reserve, op[1], op[2])  # a refused one is kept too
        elif op[1] in ref:
            ref.free(op[1])
        else:
            continue
        kept.append(op)
    return kept


def candidates(ops: list[Op]):
    """Smaller cases: drop one operation, make a reservation smaller, or merge two in a row."""
    yield from (valid_ops(ops[:i] + ops[i + 1 :]) for i in range(len(ops)))
    for i, op in enumerate(ops):
        if op[0] == "reserve":
            yield from (
                ops[:i] + [("reserve", op[1], size)] + ops[i + 1 :] for size in range(1, op[2])
            )
    for i, (a, b) in enumerate(zip(ops, ops[1:], strict=False)):
        if a[0] == b[0] == "reserve":  # two reservations in a row as one
            yield valid_ops(ops[:i] + [("reserve", a[1], a[2] + b[2])] + ops[i + 2 :])


# ---- a case replayed on the learner's arena (``kvlab.widgets.failure_replay``) -------------


@dataclass
class ArenaRun:
    """The learner's arena, and the ranges its ``reserve`` returned."""

    arena: object
    ranges: dict[int, tuple[int, int]]  # seq_id -> (start, num_slots)

    @classmethod
    def of(cls, arena_class) -> ArenaRun:
        return cls(arena_class(NUM_SLOTS), {})


def run(state: ArenaRun, op: Op) -> None:
    if op[0] == "free":
        state.arena.free(op[1])
        state.ranges.pop(op[1], None)
        return
    _, seq_id, num_slots = op
    try:
        start = state.arena.reserve(seq_id, num_slots)
    except CacheFullError:
        return  # refused: nothing placed
    if isinstance(start, int):
        state.ranges[seq_id] = (start, num_slots)


def view(state: ArenaRun):
    """Each slot of the arena as a one-slot block, held by every range that covers it."""
    holders: list[list[tuple[int, int]]] = [[] for _ in range(NUM_SLOTS)]
    for seq_id, (start, length) in state.ranges.items():
        for slot in range(max(0, start), min(NUM_SLOTS, start + length)):
            holders[slot].append((seq_id, slot - start))
    used = {slot: 1 for slot, held in enumerate(holders) if held}
    infos = block_infos(dict(enumerate(holders)), used, NUM_SLOTS)
    return infos, CacheUsage(NUM_SLOTS, len(used), len(used)), None
