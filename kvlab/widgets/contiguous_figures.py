"""Lab 02's pictures of a contiguous pool: where its slots go, and who waits for a range.

A contiguous allocator gives each request one unbroken range. The page map shows the ranges
and the holes between them, but not the request that waits because no hole is long enough:
it holds no slot yet. ``ArenaStepView`` draws it under the map, beside the holes it cannot
use, and labels each recorded step with what happened (who ended, who was placed, who waits
and why).

    arena_step_view(recording, result, request_sizes, title, weight_bytes, step)
                                  a step view of a recorded run, each step labelled, with
                                  the waiting requests drawn beside the holes
    step_labels(recording, result, request_sizes)
                                  those labels ("step 8: request 4 waits: ..."), in the
                                  order of a step: placed, then ended, then who waits
    split_figure(splits, title)   the PagedAttention paper's four kinds of KV memory, and
                                  free, at one moment: one bar per policy
    slots_over_time_figure(history, waiting, title)
                                  the same split at every step of a run, stacked, the
                                  steps where a request waits shaded

Used, reserved-but-unused and free slots take the memory gauge's colours; the paper's
reservation, internal and external fragmentation keep lab 03's. Requests running at once
per policy is ``kvlab.widgets.memory_figures.concurrency_figure``, one chart for labs 02
and 03.

Not handled: paged caches (a paged request never waits for a hole), live updates of the
plotly figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import ipywidgets as widgets
import plotly.graph_objects as go

from kvlab.labs import Recording, waiting_at
from kvlab.measure.experiments import Fragmentation
from kvlab.measure.serve import ServeResult
from kvlab.widgets.memory_gauge import COLORS
from kvlab.widgets.page_map_state import seq_color
from kvlab.widgets.step_view import PoolSnapshot, StepView
from kvlab.widgets.svg import WIDTH, stack_svgs, svg_document, svg_text

PARTS = {  # Fragmentation attribute -> (legend name, colour)
    "used": ("used (token states)", COLORS["KV used"]),
    "reservation": ("reservation", "#56B4E9"),
    "internal": ("internal fragmentation", COLORS["KV reserved, unused"]),
    "external": ("external fragmentation", "#d6604d"),
    "free": ("free", COLORS["KV free"]),
}
HOLE_COLOR = "#9a9a9a"
WAITING_SHADE = "#777777"  # the steps where a request waits for a range
_LABEL_PX, _BAR_H, _ROW_H = 120, 14, 22  # the queue strip's label column, bar and row


# ---- who waits, step by step ------------------------------------------------------------------


@dataclass(frozen=True)
class Queue:
    """The requests waiting for a range after one step, and the holes they could not use.

    Attributes:
        waiting: ``(request, slots it needs)`` for each waiting request, in arrival order.
        holes: ``(start, length)`` of every free run, in address order.
    """

    waiting: tuple[tuple[int, int], ...]
    holes: tuple[tuple[int, int], ...]

    @property
    def largest_hole(self) -> int:
        return max((length for _, length in self.holes), default=0)

    @property
    def free(self) -> int:
        return sum(length for _, length in self.holes)

    def describe(self) -> str:
        """One line: who waits, and the holes (or that no request waits)."""
        if not self.waiting:
            return "no request waits for a range"
        who = ", ".join(f"request {r} ({n} slots)" for r, n in self.waiting)
        holes = " + ".join(str(length) for _, length in self.holes) or "none"
        return f"waiting for a range: {who}; free holes: {holes}"

    def verdict(self) -> str:
        """Why the first waiting request waits, or that a hole now fits it."""
        need = self.waiting[0][1]
        if self.largest_hole >= need:
            return "a hole fits"
        if self.free >= need:
            return "no hole fits: external fragmentation"
        return "too few free slots"


def queues(recording: Recording, result: ServeResult, request_sizes: Sequence[int]) -> list[Queue]:
    """The ``Queue`` after every recorded step of ``result``'s run (``Recording(arena=True)``)."""
    if not recording.record_arena:
        raise ValueError("queues() needs a Recording(arena=True): it reads the arena's holes")
    return [
        Queue(
            tuple((r, request_sizes[r]) for r in waiting_at(result, snapshot.step)),
            tuple(holes),
        )
        for snapshot, holes in zip(recording.snapshots, recording.holes, strict=True)
    ]


def step_labels(
    recording: Recording, result: ServeResult, request_sizes: Sequence[int]
) -> list[str]:
    """What happened in each recorded step, as a ``PoolSnapshot`` label: "step 8" alone
    when requests only decoded, else "step 8: " and who was placed, ended or waits.

    In that order, as the engine does it: a step first places (schedules) the requests it
    admits, runs the model, then frees the ranges of the requests that finished. So a range
    freed in step 12 serves a waiting request only in step 13.

    Requests are named by their ``seq_id``, which ``serve`` numbers like the prompts when
    it refuses none. Requests wait first come first served, so the first in line says why
    it waits; the others only that they wait.

    Raises:
        ValueError: ``result`` refused a request (the numbers would no longer match).
    """
    if result.refused:
        raise ValueError(f"step_labels needs a run that refused no request: {result.refused}")
    labels = []
    before: dict[int, tuple[int, int]] = {}
    for index, queue in enumerate(queues(recording, result, request_sizes)):
        ranges = recording.ranges[index]
        events = []
        if index:  # at step 0 every first request is placed: the map says where
            events += [
                f"request {s} placed at {start}-{start + n - 1}"
                for s, (start, n) in ranges.items()
                if s not in before
            ]
        events += [f"request {s} ended" for s in sorted(set(before) - set(ranges))]
        events += _waits(queue)
        step = recording.snapshots[index].step
        labels.append(f"step {step}: " + "; ".join(events) if events else f"step {step}")
        before = ranges
    return labels


def _waits(queue: Queue) -> list[str]:
    """The label's words for the waiting requests (none: no words)."""
    if not queue.waiting:
        return []
    (first, need), others = queue.waiting[0], [r for r, _ in queue.waiting[1:]]
    if queue.largest_hole >= need:
        words = [f"request {first} fits, starts next step"]
        if others:
            words.append(f"request {', '.join(map(str, others))} waits")
        return words
    if others:
        who = ", ".join(map(str, [first, *others]))
        return [f"requests {who} wait: largest hole {queue.largest_hole}"]
    return [f"request {first} waits: needs {need} in one range, largest hole {queue.largest_hole}"]


def queue_svg(queue: Queue, scale_slots: int, rows: int = 2, width: int = WIDTH) -> str:
    """The waiting requests drawn as bars beside the holes, to one scale.

    Args:
        queue: who waits, and the holes.
        scale_slots: the slots the bars' full width stands for (the same for every frame
            of a view, so that bars keep their lengths from step to step).
        rows: the rows of bars to leave room for (the most any frame of the view draws),
            so that every frame has the same height and the gauge under it stays put.
    """
    px = (width - _LABEL_PX - 150) / max(1, scale_slots)
    body = [svg_text(0, 14, queue.describe(), ' font-weight="bold"')]
    bars = [(f"request {r} needs", [n], seq_color(r), f"{n} slots") for r, n in queue.waiting]
    if queue.waiting:
        lengths = [length for _, length in queue.holes]
        bars.append(("free holes", lengths, HOLE_COLOR, f"{queue.free} free, {queue.verdict()}"))
    y = 24
    for label, lengths, color, note in bars:
        body.append(svg_text(0, y + 11, label))
        x = _LABEL_PX
        for length in lengths:
            w = max(1.0, length * px)
            body.append(
                f'<rect x="{x:g}" y="{y}" width="{w:.1f}" height="{_BAR_H}" fill="{color}" '
                'stroke="#333333" stroke-width="1"/>'
            )
            x += w + 6  # a gap: two holes are two runs, never one
        body.append(svg_text(x + 4, y + 11, note))
        y += _ROW_H
    height = 24 + _ROW_H * max(rows, len(bars))
    return svg_document(width, height, body, queue.describe())


class ArenaStepView(StepView):
    """A ``StepView`` of a contiguous arena that also draws who waits for a range.

    Under the page map, a strip shows each waiting request as a bar of the slots it needs,
    and the arena's holes as bars to the same scale: a request waits while no hole is as
    long as its bar, however many slots are free in total. The strip is in the live view,
    in every frame of the animation and in the text.

    Args:
        snapshots: one ``PoolSnapshot`` per step (labelled or not).
        queues: one ``Queue`` per snapshot.
        title, weight_bytes, step: as for ``StepView``.
    """

    def __init__(
        self,
        snapshots: list[PoolSnapshot],
        queues: list[Queue],
        title: str = "",
        weight_bytes: int = 0,
        step: int | None = None,
    ) -> None:
        if len(queues) != len(snapshots):
            raise ValueError(f"{len(queues)} queues for {len(snapshots)} snapshots: give one each")
        self.queues = {
            snapshot.step: queue for snapshot, queue in zip(snapshots, queues, strict=True)
        }
        # One scale for every step: the longest row any step draws (all its holes, or one
        # request) fills the strip.
        self.scale_slots = max(
            (
                max(sum(n for _, n in q.holes), *(n for _, n in q.waiting))
                for q in queues
                if q.waiting
            ),
            default=1,
        )
        self.rows = max((len(q.waiting) + 1 for q in queues), default=2)
        self.queue_now = Queue((), ())
        self.queue_view = widgets.HTML()
        super().__init__(snapshots, title=title, weight_bytes=weight_bytes, step=step)
        controls, page_map, gauge = self.children
        self.children = (controls, page_map, self.queue_view, gauge)

    def show_live(self, snapshot: PoolSnapshot, title: str) -> None:
        """Draw a snapshot, and the requests waiting after its step."""
        self.queue_now = self.queues.get(snapshot.step, Queue((), ()))
        self.queue_view.value = self.queue_svg()
        super().show_live(snapshot, title)

    def queue_svg(self) -> str:
        return queue_svg(self.queue_now, self.scale_slots, self.rows)

    def to_text(self) -> str:
        return f"{super().to_text()}\n{self.queue_now.describe()}"

    def to_svg(self, kv_only: bool = False) -> str:
        """The map, the waiting requests and the gauge at the step shown."""
        return stack_svgs(
            [self.page_map.to_svg(), self.queue_svg(), self.gauge.to_svg(kv_only=kv_only)]
        )


def arena_step_view(
    recording: Recording,
    result: ServeResult,
    request_sizes: Sequence[int],
    title: str,
    weight_bytes: int,
    step: int | None = None,
) -> ArenaStepView:
    """An ``ArenaStepView`` of a run that ``serve`` made and ``Recording(arena=True)`` kept,
    each step labelled by ``step_labels``, resting on ``step`` (default: the fullest).

    Args:
        request_sizes: the slots each request reserves, by request.
    """
    labels = step_labels(recording, result, request_sizes)
    snapshots = [
        replace(snapshot, label=label)
        for snapshot, label in zip(recording.snapshots, labels, strict=True)
    ]
    return ArenaStepView(
        snapshots, queues(recording, result, request_sizes), title, weight_bytes, step
    )


# ---- plotly figures -----------------------------------------------------------------------------


def split_figure(splits: dict[str, Fragmentation], title: str) -> go.Figure:
    """One horizontal bar per policy: its slots split into the paper's four kinds and free
    (only the parts some policy has, so that the legend names nothing undrawn).

    Args:
        splits: policy -> its ``Fragmentation`` at one moment (in hindsight, so that
            ``reservation`` is split off), all of one capacity.
        title: what to see.
    """
    if not splits:
        raise ValueError("splits is empty: give at least one policy's Fragmentation")
    names = list(splits)
    fig = go.Figure()
    for attr, (name, color) in PARTS.items():
        shares = [100 * getattr(f, attr) / f.capacity for f in splits.values()]
        if not any(shares):  # a part no policy has: no bar, no legend entry
            continue
        fig.add_bar(
            y=names,
            x=shares,
            name=name,
            orientation="h",
            marker_color=color,
            text=[f"{s:.0f}%" if s >= 5 else "" for s in shares],
            textposition="inside",
            insidetextanchor="middle",
        )
    fig.update_layout(
        barmode="stack",
        title=title,
        xaxis=dict(title="share of the KV pool's slots (%)", range=[0, 100]),
        yaxis=dict(title="policy", autorange="reversed"),
        height=190 + 45 * len(names),
        margin=dict(t=50, b=110, l=110, r=20),
        legend=dict(
            orientation="h", traceorder="normal", yanchor="bottom", y=0, yref="container", x=0
        ),
    )
    return fig


def slots_over_time_figure(
    history: Sequence[Fragmentation], waiting: Sequence[Sequence[int]], title: str
) -> go.Figure:
    """The slots of a run's pool at every step, stacked: used, reservation, internal,
    external, free; the steps where a request waits shaded.

    External fragmentation is measured against the request that waits, so where nobody
    waits its slots count as free.

    Args:
        history: one ``Fragmentation`` per step (``Recording.in_hindsight``).
        waiting: the requests waiting after each step (``kvlab.labs.waiting_at``).
        title: what to see.
    """
    if len(waiting) != len(history):
        raise ValueError(f"{len(waiting)} waiting lists for {len(history)} steps: give one each")
    frames = [f if w else replace(f, external=0) for f, w in zip(history, waiting, strict=True)]
    steps = list(range(len(frames)))
    fig = go.Figure()
    for attr, (name, color) in PARTS.items():
        fig.add_scatter(
            x=steps,
            y=[getattr(f, attr) for f in frames],
            name=name,
            stackgroup="slots",
            mode="lines",
            line=dict(width=0.5, color=color, shape="hv"),
            fillcolor=color,
        )
    for first, last, who in _waiting_runs(waiting):
        names = ", ".join(str(r) for r in who)
        fig.add_vrect(
            x0=first,
            x1=last + 1,
            fillcolor=WAITING_SHADE,
            opacity=0.18,
            layer="above",
            line_width=0,
            annotation_text=f"request {names} waits (shaded)",
            annotation_position="top left",
        )
    fig.update_layout(
        title=title,
        xaxis_title="step",
        yaxis=dict(title="slots", range=[0, history[0].capacity * 1.12]),
        height=360,
        margin=dict(t=50, b=40),
    )
    return fig


def _waiting_runs(waiting: Sequence[Sequence[int]]) -> list[tuple[int, int, tuple[int, ...]]]:
    """``(first step, last step, requests)`` of each run of steps with the same waiters."""
    runs: list[tuple[int, int, tuple[int, ...]]] = []
    for step, who in enumerate(waiting):
        who = tuple(who)
        if who and runs and runs[-1][2] == who and runs[-1][1] == step - 1:
            runs[-1] = (runs[-1][0], step, who)
        elif who:
            runs.append((step, step, who))
    return runs
