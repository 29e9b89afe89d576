"""A recorded run of a KV pool, stepped through after the fact: a slider, a page map, a gauge.

A live page map flashes through a run in seconds and then shows the empty pool at the end.
Recording a snapshot of the pool after every step lets a learner go back to any step (the
one where a request was refused, the fullest one), and lets the notebook rest on a step
that means something, which is also what its static picture (the SVG) shows.

    snapshots = []
    ... on every step: snapshots.append(PoolSnapshot.of(cache, step))
    StepView(snapshots, title="paged", weight_bytes=w)     # rests on the fullest step

    view = StepView([], title="...")   # a run still to come: draw it live with show_live,
    view.load(snapshots)               # then hand over the recording

Not handled: recording itself (``kvlab.labs.Recording`` does it for ``serve``; the batching
panel records its own replays), diffs between steps.
"""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as widgets

from kvlab.cache.base import CacheUsage
from kvlab.widgets.animation import SECONDS, Animation, pick_frames
from kvlab.widgets.memory_gauge import MemoryGauge
from kvlab.widgets.page_map import PageMap
from kvlab.widgets.svg import stack_svgs, with_static_copy


@dataclass(frozen=True)
class PoolSnapshot:
    """The KV pool after one step, in the form the page map and the gauge read.

    Attributes:
        infos: ``BlockInfo`` of every block.
        cache_usage: the pool's bytes.
        block_size: tokens per block (None for a contiguous arena).
        step: the step it was taken after.
        time: the clock's time then, if there is a clock.
        label: what happened, for a recording of single operations rather than engine
            steps ("fork(0, 1)"); shown in place of "after step N".
    """

    infos: tuple
    cache_usage: CacheUsage
    block_size: int | None
    step: int
    time: float | None = None
    label: str | None = None

    @classmethod
    def of(
        cls, cache, step: int, time: float | None = None, label: str | None = None
    ) -> PoolSnapshot:
        """A snapshot of ``cache`` (anything with ``block_infos()`` and ``usage()``) now."""
        block_size = getattr(cache, "block_size", None)
        return cls(tuple(cache.block_infos()), cache.usage(), block_size, step, time, label)

    def block_infos(self) -> list:
        return list(self.infos)

    def usage(self) -> CacheUsage:
        return self.cache_usage


def fullest_step(snapshots: list[PoolSnapshot]) -> int:
    """The index of the snapshot with the most KV bytes holding tokens (the first of ties)."""
    used = [s.cache_usage.used_bytes for s in snapshots]
    return used.index(max(used))


class StepView(widgets.VBox):
    """A step slider (with a play button) over recorded snapshots, a page map and a gauge.

    Args:
        snapshots: one ``PoolSnapshot`` per step, in order; may be empty when the run is
            still to come (``load`` it later, as the batching panel does).
        title: shown in the map's title, with the step.
        weight_bytes: the model's parameter bytes, for the gauge.
        step: the index to rest on; default the fullest step.
        gauge: False leaves the memory gauge out of the view, its picture and its text:
            for a few bookkeeping calls on a small pool, where only the map speaks.

    Attributes:
        page_map, gauge, slider, play: the parts.
        snapshots: the recording the slider moves through.
    """

    def __init__(
        self,
        snapshots: list[PoolSnapshot],
        title: str = "",
        weight_bytes: int = 0,
        step: int | None = None,
        gauge: bool = True,
    ) -> None:
        self.snapshots: list[PoolSnapshot] = []
        self.with_gauge = gauge
        self.base_title = title
        self._moving = False
        self.page_map = PageMap(title=title)
        self.gauge = MemoryGauge(weight_bytes=weight_bytes, title=title)
        self.slider = widgets.IntSlider(
            value=0,
            min=0,
            max=0,
            description="step",
            continuous_update=True,
            layout=widgets.Layout(width="440px"),
        )
        self.slider.add_class("kvlab-slider-step")
        self.play = widgets.Play(value=0, min=0, max=0, interval=300, description="play")
        widgets.jslink((self.play, "value"), (self.slider, "value"))
        self.slider.observe(self._on_slider, names="value")
        parts = [widgets.HBox([self.play, self.slider]), self.page_map]
        super().__init__(parts + ([self.gauge] if gauge else []))
        self.add_class("kvlab-step-view")
        if snapshots or step is not None:
            self.load(snapshots, step)

    def load(self, snapshots: list[PoolSnapshot], step: int | None = None, title=None) -> None:
        """Replace the recording with ``snapshots`` and rest on ``step`` (default: the
        fullest); ``title`` replaces the title when given."""
        if not snapshots:
            raise ValueError("StepView.load needs at least one snapshot, got none")
        last = len(snapshots) - 1
        rest = fullest_step(snapshots) if step is None else step
        if isinstance(rest, bool) or not isinstance(rest, int) or not 0 <= rest <= last:
            raise ValueError(f"step={step!r} is not allowed: use an index 0..{last} or None")
        self.snapshots = list(snapshots)
        if title is not None:
            self.base_title = self.gauge.title = title
        self._moving = True  # the slider's own observer must not draw a half-set range
        try:
            self.slider.max = self.play.max = last
            self.slider.value = rest
        finally:
            self._moving = False
        self.show(rest)

    def show_live(self, snapshot: PoolSnapshot, title: str) -> None:
        """Draw a snapshot that is not (yet) in the recording: a run in progress."""
        self.page_map.title = title
        self.page_map.update(snapshot)
        self.gauge.update(snapshot)

    def show(self, index: int) -> None:
        """Draw snapshot ``index`` (the slider calls this)."""
        snapshot = self.snapshots[index]
        self.show_live(snapshot, self._title(index))
        if self.slider.value != index:
            self.slider.value = index

    def _title(self, index: int) -> str:
        snapshot = self.snapshots[index]
        what = snapshot.label or f"after step {snapshot.step}"
        when = f", t = {snapshot.time:.3f} s" if snapshot.time is not None else ""
        rest = " (fullest)" if index == fullest_step(self.snapshots) else ""
        prefix = f"{self.base_title}: " if self.base_title else ""
        return f"{prefix}{what}{when}{rest}"

    def _on_slider(self, change) -> None:
        if not self._moving and self.snapshots:
            self.show(change["new"])

    def to_text(self) -> str:
        """The step shown, the map's and the gauge's numbers."""
        if not self.with_gauge:
            return self.page_map.to_text()
        return f"{self.page_map.to_text()}\n{self.gauge.summary}"

    def to_svg(self, kv_only: bool = False) -> str:
        """The map and the gauge at the step shown, as one static picture; ``kv_only``
        leaves out the gauge's bar of all memory."""
        if not self.with_gauge:
            return self.page_map.to_svg()
        return stack_svgs([self.page_map.to_svg(), self.gauge.to_svg(kv_only=kv_only)])

    def frame_svgs(self, indices: list[int]) -> list[str]:
        """The pictures of recorded steps ``indices``, each as the slider would show it
        (the gauge's KV bar only), for an animation."""
        svgs = []
        shown = self.slider.value
        # Each frame is drawn by this view's own map and gauge; the view then goes back to
        # the step it rested on.
        for index in indices:
            self.show_live(self.snapshots[index], self._title(index))
            svgs.append(self.to_svg(kv_only=True))
        self.show(shown)
        return svgs

    def animation_steps(self) -> tuple[list[int], dict[int, float]]:
        """The recorded steps an animation shows (at most ``MAX_FRAMES``, evenly spread,
        with the step the view rests on), and the frames it dwells on: that step, the last."""
        if not self.snapshots:
            raise ValueError("this StepView has no recording to animate: load() one first")
        indices = pick_frames(len(self.snapshots), keep=[self.slider.value])
        return indices, {len(indices) - 1: 1.5, indices.index(self.slider.value): 2.5}

    def to_animation(self, seconds: float = SECONDS) -> Animation:
        """The whole recording as an animated PNG (see ``animation_steps``)."""
        indices, hold = self.animation_steps()
        return Animation.of_svgs(self.frame_svgs(indices), seconds, hold, text=repr(self))

    def static_copy(self) -> dict:
        """The picture GitHub, nbviewer and HTML exports show: the recording animated when
        it has more than one step, else the step shown as an SVG."""
        if len(self.snapshots) > 1:
            return self.to_animation().static_copy()
        return {"image/svg+xml": self.to_svg()}

    def _repr_mimebundle_(self, **kwargs):
        # The live view for JupyterLab, a picture for GitHub, nbviewer and HTML exports.
        return with_static_copy(super()._repr_mimebundle_(**kwargs), repr(self), self.static_copy())

    def __repr__(self) -> str:
        return f"StepView({self.to_text()})"
