"""The grading engine of lab 02's build-it arena: one sequence of operations on the
learner's arena and on kvlab's side by side, random sequences, and shrinking a failure.

    first_difference(make_arena, ops)   the first criterion a sequence breaks, what
                                        happened, and the misconception it suggests
    random_ops(rng, n)                  a seeded sequence of reserves and frees
    shrink(make_arena, ops, criterion)  the fewest, smallest operations still breaking it

``kvlab.exercises.build_arena`` turns these into a report. Not handled: other arenas than
first-fit (the reference is kvlab's ``ContiguousArena``).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from kvlab.cache.contiguous_arena import ContiguousArena
from kvlab.cache.manager import CacheFullError
from kvlab.exercises.grading import shrink_loop

NUM_SLOTS = 64
Op = tuple  # ("reserve", seq_id, num_slots) or ("free", seq_id)


class _LearnerError(Exception):
    """The learner's method raised something other than CacheFullError."""


def _holes(arena) -> list[tuple[int, int]]:
    try:
        return [tuple(hole) for hole in arena.holes()]
    except Exception as error:  # noqa: BLE001 - any error of the learner's code is a verdict
        raise _LearnerError(f"holes() raised {type(error).__name__}: {error}") from error


def first_difference(make_arena: Callable, ops: list[Op]) -> tuple[str, str, str] | None:
    """(criterion, what happened, misconception) of the first difference, or None."""
    mine, ref = make_arena(NUM_SLOTS), ContiguousArena(NUM_SLOTS)
    refused_before = False
    for index, op in enumerate(ops):
        where = f"operation {index + 1}, {show_op(op)}"
        try:
            failure = _one_op(mine, ref, op, where, refused_before)
        except _LearnerError as error:
            criterion = "refuses" if op[0] == "reserve" else "holes"
            return (
                criterion,
                f"{where}: {error}",
                (
                    "a reserve that finds no room raises CacheFullError (imported in cell 1); "
                    "any other error is a bug in the method it names"
                ),
            )
        if failure is not None:
            return failure
        refused_before |= op[0] == "reserve" and op[1] not in ref
    return None


def _one_op(mine, ref, op: Op, where: str, refused_before: bool):
    """Run ``op`` on both arenas; the difference it shows, or None."""
    if op[0] == "free":
        ref.free(op[1])
        try:
            mine.free(op[1])
        except Exception as error:  # noqa: BLE001
            raise _LearnerError(f"free() raised {type(error).__name__}: {error}") from error
    else:
        _, seq_id, num_slots = op
        before = _holes(mine)
        expected = _try(ref.reserve, seq_id, num_slots)
        got = _try(mine.reserve, seq_id, num_slots)
        if got is None:
            return (
                "first_fit",
                f"{where}: reserve returned None",
                ("reserve must return the start of the range it placed"),
            )
        if isinstance(expected, CacheFullError) != isinstance(got, CacheFullError):
            if isinstance(expected, CacheFullError):
                return "refuses", f"{where}: returned {got}, but no hole fits", _found_room()
            why = (
                "a hole that is exactly num_slots long fits (>=, not >), and the tail after "
                "the last range is a hole too"
            )
            if refused_before:
                why = "an earlier refused reserve changed your arena: a refusal must change nothing"
            return "refuses", f"{where}: refused, but slot {expected} starts a hole that fits", why
        if isinstance(got, CacheFullError):
            if _holes(mine) != before:
                return (
                    "refusal_changes_nothing",
                    f"{where}: holes went from {before} to {_holes(mine)}",
                    "check the room first, then record the range",
                )
        elif got != expected:
            return (
                "first_fit",
                f"{where}: placed at slot {got}, first-fit says {expected}",
                _wrong_start(before, num_slots, got, expected),
            )
    if _holes(mine) != ref.holes():
        return (
            "holes",
            f"after {where}: holes() = {_holes(mine)}, expected {ref.holes()}",
            _wrong_holes(_holes(mine), ref.holes()),
        )
    return None


def _try(method, *args):
    try:
        return method(*args)
    except CacheFullError as error:
        return error
    except Exception as error:  # noqa: BLE001
        raise _LearnerError(f"reserve() raised {type(error).__name__}: {error}") from error


def _found_room() -> str:
    return "the hole lengths are off (a range's end is start + num_slots, not +1 or -1)"


def _wrong_start(holes: list, num_slots: int, got, expected) -> str:
    if got == expected + num_slots:
        return "reserve returns the start of the range, not its end"
    fitting = [(start, length) for start, length in holes if length >= num_slots]
    if fitting and fitting[0][1] == num_slots and (got is None or got > fitting[0][0]):
        return "a hole that is exactly num_slots long fits (>=, not >)"
    if fitting and got == min(fitting, key=lambda h: (h[1], h[0]))[0]:
        return "this is best-fit (the smallest hole that fits); first-fit takes the first one"
    if not any(start <= got < start + length for start, length in holes):
        return "the range was placed on slots another request holds"
    return "the holes are searched in the wrong order: first-fit goes by address"


def _wrong_holes(mine: list, expected: list) -> str:
    if expected and sum(expected[-1]) == NUM_SLOTS and not (mine and sum(mine[-1]) == NUM_SLOTS):
        return "the tail after the last range is a hole too"
    if sum(n for _, n in mine) == sum(n for _, n in expected):
        touching = any(a + n == b for (a, n), (b, _) in zip(mine, mine[1:], strict=False))
        if touching:
            return (
                "two free runs side by side are one hole: merge a freed range with its neighbours"
            )
        if sorted(mine) != mine:
            return "holes() must be in address order"
    return "free did not give back exactly the slots of the range"


def show_op(op: Op) -> str:
    return f"reserve(seq {op[1]}, {op[2]} slots)" if op[0] == "reserve" else f"free(seq {op[1]})"


# ---- random operations, and shrinking a failure -------------------------------------------


def random_ops(rng: random.Random, length: int) -> list[Op]:
    ops, live, next_id = [], [], 0
    for _ in range(length):
        if live and rng.random() < 0.4:
            seq_id = live.pop(rng.randrange(len(live)))
            ops.append(("free", seq_id))
        else:
            ops.append(("reserve", next_id, rng.choice([1, 2, 3, 5, 8, 13, 21, 34, 70])))
            live.append(next_id)
            next_id += 1
    return ops


def valid_ops(ops: list[Op]) -> list[Op]:
    """Drop frees of sequences that hold nothing (after shrinking removed their reserve)."""
    held, kept = set(), []
    ref = ContiguousArena(NUM_SLOTS)
    for op in ops:
        if op[0] == "free" and op[1] not in held:
            continue
        if op[0] == "reserve":
            if isinstance(_try(ref.reserve, op[1], op[2]), CacheFullError):
                kept.append(op)
                continue
            held.add(op[1])
        else:
            ref.free(op[1])
            held.discard(op[1])
        kept.append(op)
    return kept


def shrink(make_arena, ops: list[Op], criterion: str) -> list[Op]:
    """The fewest and smallest operations that still fail ``criterion``: drop one, make a
    reservation smaller, or merge two in a row, until no such change keeps the failure."""

    def still_fails(candidate: list[Op]) -> bool:
        failure = first_difference(make_arena, candidate)
        return failure is not None and failure[0] == criterion

    def candidates(ops: list[Op]):
        yield from (valid_ops(ops[:i] + ops[i + 1 :]) for i in range(len(ops)))
        for i, op in enumerate(ops):
            if op[0] == "reserve":
                yield from (
                    ops[:i] + [("reserve", op[1], size)] + ops[i + 1 :] for size in range(1, op[2])
                )
        for i, (a, b) in enumerate(zip(ops, ops[1:], strict=False)):
            if a[0] == b[0] == "reserve":  # two reservations in a row as one
                yield valid_ops(ops[:i] + [("reserve", a[1], a[2] + b[2])] + ops[i + 2 :])

    return shrink_loop(ops, still_fails, candidates)
