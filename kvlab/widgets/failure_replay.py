"""A build-it's failing case, replayed on the page map, call by call (labs 02, 03, 06).

``check_arena``, ``check_block_manager`` and ``check_prefix_cache`` print the shortest
sequence of calls that breaks a criterion; ``replay_failure(MyArena)`` (or
``MyBlockManager``, ``MyBlockPool``) finds it the same way, from the build-it's description
(``kvlab.exercises.grading.BuildIt``: its search and its ``Replay``), runs it on a fresh
copy of the learner's class, and shows the learner's own state after every call in a
``StepView`` that rests on the call that broke the property, the verdict above it.

Not handled: failures of the generation criterion (that one runs the engine), lab 04's
scheduler and lab 05's kernel (their failures are steps and rows, not a pool).
"""

from __future__ import annotations

import html

import ipywidgets as widgets

from kvlab.exercises.build_arena import ARENA
from kvlab.exercises.build_block_manager import BLOCK_MANAGER
from kvlab.exercises.build_prefix_cache import PREFIX_CACHE
from kvlab.exercises.grading import BuildIt
from kvlab.widgets.page_map_state import encode_blocks
from kvlab.widgets.step_view import PoolSnapshot, StepView
from kvlab.widgets.svg import with_static_copy


def replay_failure(learner_class, num_sequences: int = 300, seed: int = 0) -> FailureReplay:
    """The shortest failing case of a learner's arena (lab 02), block manager (lab 03) or
    block pool (lab 06) on the page map, or a line saying there is none to draw (every
    property holds, or a method is not written yet)."""
    build_it = _build_it_of(learner_class)
    written = build_it.written(learner_class)
    if not written.passed:
        return FailureReplay([f"Nothing to replay yet: {written.detail}."])
    # The check's search (same seed, same cases): each broken criterion and its case.
    failures, cases = build_it.search.failures(learner_class, num_sequences, seed)
    broken = next((c for c in build_it.criteria if c in failures), None)
    if broken is None:
        why = "the check's last criterion runs the engine"
        return FailureReplay([f"Nothing to replay: every property holds ({why})."])
    detail, misconception = failures[broken]
    likely = [f"likely: {misconception}"] if misconception else []  # none when no guess fits
    criterion = build_it.criteria[broken]
    if broken not in cases:  # found by a fixed probe, not by a sequence of calls
        return FailureReplay([f"{criterion}: broken", detail, *likely])
    snapshots, labels = _snapshots(build_it, learner_class, cases[broken], broken)
    view = StepView(snapshots, title=build_it.replay.title, step=len(snapshots) - 1)
    lines = [
        f"{criterion}: broken at step {len(labels) - 1}",
        detail,
        *likely,
        *(f"  step {i}: {label}" for i, label in enumerate(labels)),
    ]
    return FailureReplay(lines, view)


class FailureReplay(widgets.VBox):
    """The verdict and the calls, in words, above a ``StepView`` of the learner's pool (none
    when there is nothing to replay); its static copy (GitHub, nbviewer) is the same words
    and the calls animated, one by one, up to the broken one."""

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


def _build_it_of(learner_class) -> BuildIt:
    """The build-it a class answers, by the methods its exercise asks for."""
    for build_it in (ARENA, PREFIX_CACHE, BLOCK_MANAGER):
        if hasattr(learner_class, build_it.replay.asks):
            return build_it
    raise TypeError(
        f"{learner_class!r} is none of the build-its replay_failure draws: an arena (lab 02, "
        "reserve), a block manager (lab 03, allocate_slots) or a block pool (lab 06, "
        "match_prefix)"
    )


def _snapshots(build_it: BuildIt, learner_class, ops: list, broken: str):
    """A snapshot of the learner's state before the case and after each of its calls,
    stopping at the first call that breaks the criterion ``broken`` (a call that breaks
    another one first, in a learner's code with two bugs, is drawn and passed), and a label
    for each. A call after which the page map cannot draw the pool (a block's count and
    holders disagree) ends it with a label saying why, and no snapshot."""
    search, replay = build_it.search, build_it.replay
    state = replay.new_state(learner_class)
    snapshots, labels = [PoolSnapshot(*replay.pool(state), 0)], ["an empty pool"]
    for step, op in enumerate(ops, start=1):
        label, raised = search.show_op(op), False
        try:
            replay.run(state, op)
        except Exception as error:  # noqa: BLE001 - the learner's method, shown as it failed
            label, raised = f"{label}: raised {type(error).__name__}", True
        snapshot = PoolSnapshot(*replay.pool(state), step)
        try:  # the page map draws only a pool that agrees with itself
            encode_blocks(snapshot.infos, snapshot.block_size)
        except ValueError as contradiction:  # the learner's counts and holders disagree
            labels.append(f"{label}: not drawn, the pool contradicts itself: {contradiction}")
            break
        labels.append(label)
        snapshots.append(snapshot)
        if raised:
            break
        failure = search.first_difference(learner_class, ops[:step])
        if failure is not None and failure[0] == broken:
            break
    return snapshots, labels
