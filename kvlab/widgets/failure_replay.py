"""A failing case of lab 03's build-it, replayed on the page map, call by call.

``check_block_manager`` prints the shortest sequence of calls that breaks a criterion;
``replay_failure(MyBlockManager)`` draws it. It finds that case the same way, runs it on a
fresh copy of the learner's manager, and takes a snapshot of the learner's own state
(``block_tables``, ``num_tokens``) after every call, up to the call that
broke the invariant: a ``StepView`` whose slider walks through the calls and rests on the
broken one, with the grader's verdict above it.

    [calls that hold] ... [the call that breaks it]   <- the view rests here

Not handled: failures of the generation criterion (that one runs the engine), labs 02 and
06 (their arenas and pools have no block tables to draw).
"""

from __future__ import annotations

import html
from collections import Counter

import ipywidgets as widgets

from kvlab.cache.base import BlockInfo, CacheUsage
from kvlab.exercises import block_manager_grader as grader
from kvlab.exercises.build_block_manager import CRITERIA, check_written
from kvlab.exercises.grading import show_ops, shrunk_failures
from kvlab.widgets.step_view import PoolSnapshot, StepView
from kvlab.widgets.svg import with_static_copy

SLOT_BYTES = 1  # the grader's pool has no tensors: the gauge counts slots


def replay_failure(manager_class, num_sequences: int = 300, seed: int = 0) -> FailureReplay:
    """The shortest failing case of ``manager_class`` on the page map, or a line saying
    there is none to draw (every property holds, or a method is not written yet)."""
    written = check_written(manager_class)
    if not written.passed:
        return FailureReplay([f"Nothing to replay yet: {written.detail}."])
    failures, cases = _failures(manager_class, num_sequences, seed)
    broken = next((c for c in CRITERIA if c in failures), None)
    if broken is None:
        return FailureReplay(
            ["Nothing to replay: every property holds (check_block_manager runs the engine)."]
        )
    detail, misconception = failures[broken]
    ops = cases[broken]
    snapshots, labels = _snapshots(manager_class, ops)
    view = StepView(snapshots, title="your block manager", step=len(snapshots) - 1)
    lines = [
        f"{CRITERIA[broken]}: broken at step {len(snapshots) - 1}",
        detail,
        f"likely: {misconception}",
        *(f"  step {i}: {label}" for i, label in enumerate(labels)),
    ]
    return FailureReplay(lines, view)


class FailureReplay(widgets.VBox):
    """The verdict and the calls, in words, above a ``StepView`` of the learner's pool; its
    static copy (GitHub, nbviewer) is the same words and the map at the broken step.
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
        return with_static_copy(super()._repr_mimebundle_(**kwargs), repr(self), self.view.to_svg())


def _failures(manager_class, num_sequences: int, seed: int) -> tuple[dict, dict]:
    """The check's search (same seed, same cases): each broken criterion's verdict text and
    its shrunk case."""
    cases: dict[str, list] = {}

    def shrink(make, ops, broken):
        cases[broken] = grader.shrink(make, ops, broken)
        return cases[broken]

    failures = shrunk_failures(
        manager_class,
        grader.first_difference,
        shrink,
        lambda rng: grader.valid_ops(grader.random_ops(rng, rng.randint(2, 20))),
        show_ops(grader.show_op),
        num_sequences,
        seed,
    )
    return failures, cases


def _snapshots(manager_class, ops: list) -> tuple[list[PoolSnapshot], list[str]]:
    """A snapshot of the learner's state before the case and after each of its calls,
    stopping at the first call the grader finds wrong."""
    manager = manager_class(grader.NUM_BLOCKS, grader.BLOCK_SIZE)
    snapshots, labels = [_snapshot(manager, 0)], ["an empty pool"]
    for step, op in enumerate(ops, start=1):
        try:
            _run(manager, op)
        except Exception as error:  # noqa: BLE001 - the learner's method, shown as it failed
            labels.append(f"{grader.show_op(op)}: raised {type(error).__name__}")
            snapshots.append(_snapshot(manager, step))
            break
        labels.append(grader.show_op(op))
        snapshots.append(_snapshot(manager, step))
        if grader.first_difference(manager_class, ops[:step]) is not None:
            break
    return snapshots, labels


def _run(manager, op) -> None:
    if op[0] == "allocate_slots":
        manager.allocate_slots(op[1], op[2])
    elif op[0] == "fork":
        manager.fork(op[1], op[2])
    else:
        manager.free(op[1])


def _snapshot(manager, step: int) -> PoolSnapshot:
    """The learner's block tables as the page map draws a pool: who holds each block, how
    full. A block is drawn with as many holders as tables hold it; where the learner's
    ``ref_cnt`` says otherwise, the grader's verdict above the map names the block."""
    size = grader.BLOCK_SIZE
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
        for block in range(grader.NUM_BLOCKS)
    )
    usage = CacheUsage(grader.NUM_BLOCKS * size, len(holders) * size, sum(filled.values()))
    return PoolSnapshot(infos, usage, size, step)
