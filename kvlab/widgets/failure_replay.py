"""A build-it's failing case, replayed on the page map, call by call (labs 02, 03, 06).

``check_arena``, ``check_block_manager`` and ``check_prefix_cache`` print the shortest
sequence of calls that breaks a criterion; ``replay_failure(MyArena)`` (or
``MyBlockManager``, ``MyBlockPool``) draws it. It finds that case the same way, runs it on
a fresh copy of the learner's class, and takes a snapshot of the learner's own state after
every call, up to the call that broke the property: a ``StepView`` whose slider walks
through the calls and rests on the broken one, with the grader's verdict above it.

    [calls that hold] ... [the call that breaks it]   <- the view rests here

What is drawn: lab 02, the ranges the learner's ``reserve`` returned, slot by slot (a
slot two ranges overlap shows both); lab 03, the learner's ``block_tables``; lab 06, the
learner's pool inside kvlab's block manager, its cached blocks marked.

Not handled: failures of the generation criterion (that one runs the engine), lab 04's
scheduler and lab 05's kernel (their failures are steps and rows, not a pool).
"""

from __future__ import annotations

import html
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import ipywidgets as widgets

from kvlab.cache.base import BlockInfo, CacheUsage
from kvlab.exercises import (
    arena_grader,
    block_manager_grader,
    build_arena,
    build_block_manager,
    build_prefix_cache,
    prefix_cache_grader,
)
from kvlab.exercises.grading import show_ops, shrunk_failures
from kvlab.widgets.step_view import PoolSnapshot, StepView
from kvlab.widgets.svg import with_static_copy

SLOT_BYTES = 1  # the graders' pools have no tensors: the gauge counts slots


@dataclass(frozen=True)
class _Exercise:
    """What replaying one build-it's failures needs."""

    title: str
    grader: object  # the grader module: first_difference, shrink, show_op, random and valid ops
    criteria: dict[str, str]
    check_written: Callable
    new_state: Callable  # learner class -> the state the calls run on
    run: Callable  # (state, op) -> None: one call on the learner's code
    snapshot: Callable  # (state, step) -> PoolSnapshot
    max_ops: int = 20


def replay_failure(learner_class, num_sequences: int = 300, seed: int = 0) -> FailureReplay:
    """The shortest failing case of a learner's arena (lab 02), block manager (lab 03) or
    block pool (lab 06) on the page map, or a line saying there is none to draw (every
    property holds, or a method is not written yet)."""
    exercise = _exercise_of(learner_class)
    written = exercise.check_written(learner_class)
    if not written.passed:
        return FailureReplay([f"Nothing to replay yet: {written.detail}."])
    failures, cases = _failures(exercise, learner_class, num_sequences, seed)
    broken = next((c for c in exercise.criteria if c in failures), None)
    if broken is None:
        return FailureReplay(
            [
                "Nothing to replay: every property holds (the check's last criterion runs the "
                "engine)."
            ]
        )
    detail, misconception = failures[broken]
    likely = [f"likely: {misconception}"] if misconception else []  # none when no guess fits
    if broken not in cases:  # found by a fixed probe, not by a sequence of calls
        return FailureReplay([f"{exercise.criteria[broken]}: broken", detail, *likely])
    snapshots, labels = _snapshots(exercise, learner_class, cases[broken], broken)
    view = StepView(snapshots, title=exercise.title, step=len(snapshots) - 1)
    lines = [
        f"{exercise.criteria[broken]}: broken at step {len(snapshots) - 1}",
        detail,
        *likely,
        *(f"  step {i}: {label}" for i, label in enumerate(labels)),
    ]
    return FailureReplay(lines, view)


class FailureReplay(widgets.VBox):
    """The verdict and the calls, in words, above a ``StepView`` of the learner's pool; its
    static copy (GitHub, nbviewer) is the same words and the calls animated, one by one, up
    to the broken one.
    Without a view (nothing to replay) it is just its words."""

    def __init__(self, lines: list[str], view: StepView | None = None) -> None:
        self.lines, self.view = lines, view
        header = widgets.HTML("<br>".join(html.escape(line) for line in lines))
        super().__init__([header] + ([view] if view is not None else []))

    def __repr__(self) -> str:
        return "\n".join(self.lines)

    def _repr_mimebundle_(self, **kwargs):
        if self.view is None:
            return {"text/plain": repr(self)}, {}
        picture = self.view.static_copy()
        return with_static_copy(super()._repr_mimebundle_(**kwargs), repr(self), picture)


def _exercise_of(learner_class) -> _Exercise:
    """The build-it a class answers, by the methods its exercise asks for."""
    if hasattr(learner_class, "reserve"):
        return ARENA
    if hasattr(learner_class, "match_prefix"):
        return PREFIX_CACHE
    if hasattr(learner_class, "allocate_slots"):
        return BLOCK_MANAGER
    raise TypeError(
        f"{learner_class!r} is none of the build-its replay_failure draws: an arena (lab 02, "
        "reserve), a block manager (lab 03, allocate_slots) or a block pool (lab 06, "
        "match_prefix)"
    )


def _failures(exercise: _Exercise, learner_class, num_sequences: int, seed: int):
    """The check's search (same seed, same cases): each broken criterion's verdict text and
    its shrunk case."""
    grader = exercise.grader
    cases: dict[str, list] = {}

    def shrink(make, ops, broken):
        cases[broken] = grader.shrink(make, ops, broken)
        return cases[broken]

    failures = shrunk_failures(
        learner_class,
        grader.first_difference,
        shrink,
        lambda rng: grader.valid_ops(grader.random_ops(rng, rng.randint(2, exercise.max_ops))),
        show_ops(grader.show_op),
        num_sequences,
        seed,
    )
    for probe in getattr(grader, "PROBES", ()):  # the fixed cases the check runs too
        failure = probe(learner_class)
        if failure is not None:
            failures.setdefault(failure[0], failure[1:])
    return failures, cases


def _snapshots(exercise: _Exercise, learner_class, ops: list, broken: str):
    """A snapshot of the learner's state before the case and after each of its calls,
    stopping at the first call that breaks the criterion ``broken`` (a call that breaks
    another one first, in a learner's code with two bugs, is drawn and passed)."""
    grader = exercise.grader
    state = exercise.new_state(learner_class)
    snapshots, labels = [exercise.snapshot(state, 0)], ["an empty pool"]
    for step, op in enumerate(ops, start=1):
        try:
            exercise.run(state, op)
        except Exception as error:  # noqa: BLE001 - the learner's method, shown as it failed
            labels.append(f"{grader.show_op(op)}: raised {type(error).__name__}")
            snapshots.append(exercise.snapshot(state, step))
            break
        labels.append(grader.show_op(op))
        snapshots.append(exercise.snapshot(state, step))
        failure = grader.first_difference(learner_class, ops[:step])
        if failure is not None and failure[0] == broken:
            break
    return snapshots, labels


# ---- lab 03: the learner's block tables ---------------------------------------------------


def _run_block_manager(manager, op) -> None:
    if op[0] == "allocate_slots":
        manager.allocate_slots(op[1], op[2])
    elif op[0] == "fork":
        manager.fork(op[1], op[2])
    else:
        manager.free(op[1])


def _block_manager_snapshot(manager, step: int) -> PoolSnapshot:
    """The learner's block tables as the page map draws a pool: who holds each block, how
    full. A block is drawn with as many holders as tables hold it; where the learner's
    ``ref_cnt`` says otherwise, the grader's verdict above the map names the block."""
    size = block_manager_grader.BLOCK_SIZE
    holders: dict[int, list[tuple[int, int]]] = {}
    for seq_id, table in manager.block_tables.items():
        for index, block in enumerate(table):
            holders.setdefault(block, []).append((seq_id, index))
    filled: Counter = Counter()
    for block, held_by in holders.items():
        seq_id, index = held_by[0]
        filled[block] = max(0, min(size, manager.num_tokens.get(seq_id, 0) - index * size))
    infos = tuple(
        BlockInfo(
            block_id=block,
            ref_cnt=len(holders.get(block, ())),
            seq_ids=tuple(s for s, _ in holders.get(block, [])),
            logical_index=holders[block][0][1] if block in holders else None,
            num_filled=filled[block],
            cached=False,
        )
        for block in range(block_manager_grader.NUM_BLOCKS)
    )
    num_blocks = block_manager_grader.NUM_BLOCKS
    usage = CacheUsage(num_blocks * size, len(holders) * size, sum(filled.values()))
    return PoolSnapshot(infos, usage, size, step)


# ---- lab 02: the ranges the learner's reserve returned ------------------------------------


@dataclass
class _ArenaRun:
    arena: object  # the learner's arena
    ranges: dict[int, tuple[int, int]]  # seq_id -> (start its reserve returned, num_slots)


def _run_arena(run: _ArenaRun, op) -> None:
    if op[0] == "free":
        run.arena.free(op[1])
        run.ranges.pop(op[1], None)
        return
    _, seq_id, num_slots = op
    try:
        start = run.arena.reserve(seq_id, num_slots)
    except arena_grader.CacheFullError:
        return  # refused: nothing placed
    if isinstance(start, int):
        run.ranges[seq_id] = (start, num_slots)


def _arena_snapshot(run: _ArenaRun, step: int) -> PoolSnapshot:
    """Each slot of the arena as a one-slot block, held by every range that covers it."""
    num_slots = arena_grader.NUM_SLOTS
    holders: list[list[tuple[int, int]]] = [[] for _ in range(num_slots)]
    for seq_id, (start, length) in run.ranges.items():
        for slot in range(max(0, start), min(num_slots, start + length)):
            holders[slot].append((seq_id, slot - start))
    infos = tuple(
        BlockInfo(
            block_id=slot,
            ref_cnt=len(held),
            seq_ids=tuple(s for s, _ in held),
            logical_index=held[0][1] if held else None,
            num_filled=1 if held else 0,
            cached=False,
        )
        for slot, held in enumerate(holders)
    )
    used = sum(1 for held in holders if held)
    return PoolSnapshot(infos, CacheUsage(num_slots, used, used), None, step)


# ---- lab 06: the learner's pool inside kvlab's block manager ------------------------------


def _prefix_cache_snapshot(manager, step: int) -> PoolSnapshot:
    """The pool as a paged cache draws it: holders, fill, cached blocks (from the learner's
    ``ref_cnt`` and ``block_hash``)."""
    from kvlab.engine.model_free import bookkeeping_cache

    cache = bookkeeping_cache(
        num_blocks=prefix_cache_grader.NUM_BLOCKS,
        block_size=prefix_cache_grader.BLOCK_SIZE,
        manager=manager,
    )
    slots = manager.usage()  # in slots: the cache holds no tensors, its bytes are 0
    usage = CacheUsage(slots.num_slots, slots.num_reserved_slots, slots.num_used_slots)
    return PoolSnapshot(tuple(cache.block_infos()), usage, cache.block_size, step)


ARENA = _Exercise(
    "your arena, slot by slot",
    arena_grader,
    build_arena.CRITERIA,
    build_arena.check_written,
    lambda cls: _ArenaRun(cls(arena_grader.NUM_SLOTS), {}),
    _run_arena,
    _arena_snapshot,
    max_ops=24,
)
BLOCK_MANAGER = _Exercise(
    "your block manager",
    block_manager_grader,
    build_block_manager.CRITERIA,
    build_block_manager.check_written,
    lambda cls: cls(block_manager_grader.NUM_BLOCKS, block_manager_grader.BLOCK_SIZE),
    _run_block_manager,
    _block_manager_snapshot,
)
PREFIX_CACHE = _Exercise(
    "your block pool, in kvlab's block manager",
    prefix_cache_grader,
    build_prefix_cache.CRITERIA,
    build_prefix_cache.check_written,
    lambda cls: prefix_cache_grader.managers(cls)[0],
    prefix_cache_grader.apply_op,
    _prefix_cache_snapshot,
    max_ops=16,
)
