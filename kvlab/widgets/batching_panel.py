"""The batching panel: sliders for the scheduler's knobs, and what they do to one seeded trace.

    from kvlab.widgets import BatchingPanel
    panel = BatchingPanel()       # the tiny model, 16 requests, a simulated clock
    panel                         # move a slider: the trace is replayed and every plot redrawn

Every change replays ONE seeded trace (``kvlab.sim.trace.make_trace``: Poisson arrivals,
Alpaca-like lengths) through ``kvlab.LLM``, once per scheduling policy, on a simulated
clock, so the numbers are exact and repeatable and a replay of the tiny model takes about
a second on a CPU. The clock is a ``ManualClock`` (each step lasts ``step_seconds``) or,
with ``step_cost=`` (a ``Roofline`` or a calibration of lab 04), a ``StepCostClock``: a
step lasts what it computes, so a long prefill stalls the decodes beside it and the token
budget's slider trades those stalls against the long prompts' TTFT
(``BatchingPanel(lengths="sharegpt", step_cost=Roofline.of(preset("llama-2-7b"),
"a100-40gb"))``). What the panel shows:

    page map      the KV pool, live during the run, then at any step (the step slider)
    memory gauge  the KV memory at the same step
    timeline      the selected policy: each request waiting / prefill / decode / swapped
    load          running and waiting requests and KV usage over time (selected policy)
    comparison    TTFT p99, E2E p50/p99, tokens/s and mean batch size of all three policies

Laid out for a 1366x768 laptop (533 px tall in JupyterLab beside its file browser): the
buttons, the step slider and the knobs on top; under them the KV pool (the gauge over the
map, kept at most ``MAP_MAX_HEIGHT`` px tall, so that a large pool's map never pushes the
gauge down) beside the plots, which share one place in tabs (timeline and load; the three
policies). Quick slider moves cost one replay: in a kernel the replay waits ``DEBOUNCE_S``
after the last move, so the last value wins (``run`` and ``set`` replay at once). A
refused replay (a trace that cannot fit the pool) greys out the last results and names the
sliders that would let it fit.

Where no kernel runs it (GitHub, nbviewer), its output shows the replay animated: the
timeline, a marker that moves along its time axis, and the KV pool at that moment
(``to_animation``).

Its parts: ``kvlab.widgets.batching_knobs`` (the knobs' values, ranges and sliders),
``kvlab.widgets.batching_replays`` (the model, the trace and the ``LLM`` each replay
runs; no widgets) and ``kvlab.widgets.batching_figures`` (the plots).

Each slider has the CSS class ``kvlab-slider-<name>`` (``max_num_seqs``, ``batch_timeout``,
``block_size``, ``num_blocks``, ``max_num_batched_tokens``, ``arrival_rate``, and ``step``);
the panel's root has ``kvlab-batching-panel``. Plots are plotly ``go.Figure`` objects shown
in ``ipywidgets.Output`` areas: a ``go.FigureWidget`` would save a 5 MB JavaScript bundle
into every notebook that shows one.

On a shared CPU, call ``torch.set_num_threads(1)`` first, as the labs do: the tiny model
gains nothing from a second thread, and two threads competing with other work can make a
replay ten times slower.

Not handled: sampled requests (greedy only), ``n > 1``, real (wall-clock) timing: lab 04
measures that separately.
"""

from __future__ import annotations

import asyncio
import html
from dataclasses import replace

import ipywidgets as widgets
import plotly.graph_objects as go

from kvlab.engine.scheduler_config import SCHEDULING_MODES
from kvlab.measure.replay import ReplayResult, TraceRequests, replay
from kvlab.widgets.animation import Animation, svg_to_png
from kvlab.widgets.batching_figures import (
    comparison_figure,
    panel_figure,
    show_figure,
    time_axis_px,
)
from kvlab.widgets.batching_knobs import SLIDER_WIDTH, PanelSettings, sliders
from kvlab.widgets.batching_replays import BatchingReplays
from kvlab.widgets.static_figures import figure_png
from kvlab.widgets.step_view import PoolSnapshot, StepView
from kvlab.widgets.svg import with_static_copy

DEBOUNCE_S = 0.3  # a slider move waits this long for the next before it replays
MAP_MAX_HEIGHT = 112  # px, 480 wide: 64 blocks keep 28 px cells, 512 shrink to 10 px
POOL_WIDTH = "480px"  # the KV pool's column; the plots take the rest of the row
# The panel's own CSS, in a hidden HTML widget (ipywidgets' layouts have no opacity):
# stale results greyed out, a smaller status line, thin padding around the plots.
PANEL_CSS = """<style>
.kvlab-batching-panel .kvlab-stale { opacity: 0.35; filter: grayscale(1); }
.kvlab-batching-panel .kvlab-batching-status { font-size: 12px; line-height: 1.35; }
.kvlab-batching-panel .kvlab-batching-status .widget-html-content { line-height: 1.35; }
.kvlab-batching-panel .widget-tab-contents { padding: 4px !important; }
</style>"""


class BatchingPanel(widgets.VBox):
    """Sliders for max_num_seqs, batch_timeout, block_size, num_blocks, the token budget
    and the arrival rate; every change replays one seeded trace and redraws.

    Args:
        model: ``"tiny"`` (default: a replay takes about a second), ``"smollm2-135m"``
            (real, about 0.1-0.3 s per step on a CPU), or a loaded transformers model.
        num_requests, lengths, seed: the trace (``kvlab.sim.trace.make_trace``).
        max_output_len: outputs are cut to this many tokens, to keep a replay short.
        step_seconds: simulated length of one engine step (when ``step_cost`` is None).
        step_cost: a cost model (``kvlab.engine.step_cost.Roofline``, ``LinearCost``): each
            step lasts ``step_cost.seconds(work)`` instead of ``step_seconds``.
        preemption_mode, watermark: passed to ``kvlab.LLM``.
        enable_prefix_caching: passed to ``kvlab.LLM``; off by default, so that the pool
            shows batching alone (blocks kept for a prefix-cache hit are lab 06's subject).
        compare: also replay the two other policies for the comparison plot.
        live: redraw the page map at every step of a replay; False draws it once, at the
            end (for sweeps: each redraw is a message to the browser).
        run: replay once now (else call ``run()``).
        **settings: starting values of the controls (``PanelSettings`` fields).

    Attributes:
        settings: the values of the last replay.
        model, tokenizer: the model replayed (no tokenizer with a loaded model).
        results: policy -> ``ReplayResult`` of the last replay.
        figure, comparison: the plotly figures shown (``go.Figure``).
        pool: the KV pool's ``StepView``, live during a replay, then its recording;
            ``page_map``, ``gauge`` and ``step_slider`` are its parts.
        sliders: name -> slider; ``scheduling``, ``step_slider``, ``run_button``, ``status``.
        results_box: the pool and the plots (CSS class ``kvlab-stale`` while they show
            the last replay, not the controls' values).
        error: why the last replay did not run (a bad combination of values), else None.
        num_replays: replays done (a test hook).
    """

    def __init__(
        self,
        model="tiny",
        *,
        num_requests: int = 16,
        lengths: str = "alpaca",
        seed: int = 0,
        max_output_len: int = 24,
        step_seconds: float = 0.025,
        step_cost=None,
        preemption_mode: str = "recompute",
        watermark: float = 0.0,
        enable_prefix_caching: bool = False,
        compare: bool = True,
        live: bool = True,
        run: bool = True,
        **settings,
    ) -> None:
        self._replays = BatchingReplays(
            model,
            num_requests=num_requests,
            lengths=lengths,
            seed=seed,
            max_output_len=max_output_len,
            step_seconds=step_seconds,
            step_cost=step_cost,
            preemption_mode=preemption_mode,
            watermark=watermark,
            enable_prefix_caching=enable_prefix_caching,
            **settings,
        )  # checks every argument before the first replay
        self.settings = self._replays.settings
        self.model, self.tokenizer = self._replays.model, self._replays.tokenizer
        self._compare = compare
        self.live = live
        self.results: dict[str, ReplayResult] = {}
        self.figure: go.Figure | None = None
        self.comparison: go.Figure | None = None
        self.error: str | None = None
        self.num_replays = 0
        self._snapshots: list[PoolSnapshot] = []
        self._quiet = False
        self._pending: asyncio.TimerHandle | None = None
        super().__init__(children=self._build())
        self.add_class("kvlab-batching-panel")
        if run:
            self.run()

    # ---- layout ------------------------------------------------------------------------

    def _build(self) -> list[widgets.Widget]:
        self.scheduling = widgets.ToggleButtons(
            options=SCHEDULING_MODES,
            value=self.settings.scheduling,
            style={"button_width": "92px"},
            layout=widgets.Layout(width="auto"),
        )
        self.scheduling.add_class("kvlab-toggle-scheduling")
        self.sliders = sliders(self.settings)
        for name, slider in self.sliders.items():
            slider.add_class(f"kvlab-slider-{name}")
            slider.observe(self._on_knob, names="value")
        self.scheduling.observe(self._on_knob, names="value")
        self.run_button = widgets.Button(
            description="replay", icon="play", layout=widgets.Layout(width="100px")
        )
        self.run_button.add_class("kvlab-run-button")
        self.run_button.on_click(lambda _: self.run())
        self.status = widgets.HTML("not run yet")
        self.status.add_class("kvlab-batching-status")
        self.plot = widgets.Output()
        self.plot.add_class("kvlab-batching-plot")
        self.comparison_plot = widgets.Output()
        self.comparison_plot.add_class("kvlab-batching-comparison")
        self.plots = widgets.Tab(
            [self.plot, self.comparison_plot],
            titles=("timeline and load", "the three policies"),
            layout=widgets.Layout(flex="1 1 420px", min_width="0"),
        )
        # The KV pool: drawn live during a replay, then a recording to step through.
        self.pool = StepView([], weight_bytes=self._replays.weight_bytes)
        self.pool.page_map.add_class("kvlab-batching-page-map")
        self.pool.page_map.max_height = MAP_MAX_HEIGHT
        self.page_map, self.gauge = self.pool.page_map, self.pool.gauge
        self.step_slider = self.pool.slider
        step_row = self._compact_pool()
        controls = widgets.GridBox(
            list(self.sliders.values()),
            layout=widgets.Layout(grid_template_columns=f"repeat(auto-fill, {SLIDER_WIDTH})"),
        )
        self.results_box = widgets.HBox(
            [self.pool, self.plots],
            layout=widgets.Layout(flex_flow="row wrap", align_items="flex-start"),
        )
        css = widgets.HTML(PANEL_CSS, layout=widgets.Layout(display="none"))
        wrap = widgets.Layout(flex_flow="row wrap", align_items="center")
        return [
            widgets.HBox(
                [widgets.Label("scheduling"), self.scheduling, self.run_button, step_row, css],
                layout=wrap,
            ),
            controls,
            self.status,
            self.results_box,
        ]

    def _compact_pool(self) -> widgets.Widget:
        """The pool in a column beside the plots, the gauge above the map, so that a large
        pool's tall map never pushes the gauge off screen; its step slider goes up to the
        row of buttons (see ``_build``)."""
        step_row, page_map, gauge = self.pool.children
        self.pool.play.show_repeat = False
        self.step_slider.layout.width = "260px"
        self.step_slider.style.description_width = "40px"
        self.pool.children = (gauge, page_map)
        self.pool.layout.width = POOL_WIDTH
        self.pool.layout.margin = "0 12px 0 0"
        return step_row

    # ---- replays -----------------------------------------------------------------------

    def set(self, **settings) -> None:
        """Move several controls at once (as a learner would), then replay once."""
        new = replace(self.settings, **settings)  # checks every value first
        self._quiet = True
        try:
            self.scheduling.value = new.scheduling
            for name, slider in self.sliders.items():
                slider.value = getattr(new, name)
        finally:
            self._quiet = False
        self.run()

    def run(self) -> None:
        """Replay the trace with the controls' values now; show the outcome or why not."""
        self._cancel_pending()
        try:
            settings = self._read_controls()
            requests = self._replays.requests(settings.arrival_rate)
            self._set_status("replaying ...")
            selected = settings.scheduling
            results = {selected: self._replay(settings, selected, requests, live=True)}
            others = [p for p in SCHEDULING_MODES if p != selected] if self._compare else []
            for policy in others:
                results[policy] = self._replay(settings, policy, requests, live=False)
        except ValueError as error:
            self._refuse(str(error))
            return
        self.error = None
        self.results_box.remove_class("kvlab-stale")
        self.settings = settings
        self.results = {p: results[p] for p in SCHEDULING_MODES if p in results}
        self._draw()

    def _refuse(self, reason: str) -> None:
        """Say why the controls' values were not replayed, and grey out the last results
        (they belong to other values)."""
        self.error = reason
        shown = (
            f" Greyed out: the last replay ({html.escape(self.settings.describe())})."
            if self.results
            else ""
        )
        self._set_status(f"<b>Not replayed:</b> {html.escape(reason)}.{shown}")
        self.results_box.add_class("kvlab-stale")

    def _read_controls(self) -> PanelSettings:
        values = {name: slider.value for name, slider in self.sliders.items()}
        return PanelSettings(scheduling=self.scheduling.value, **values)

    def _replay(
        self, settings: PanelSettings, policy: str, requests: TraceRequests, live: bool
    ) -> ReplayResult:
        llm = self._replays.llm(settings, policy)
        refusal = self._replays.refusal(llm, requests)
        if refusal is not None:
            raise ValueError(refusal)
        self.num_replays += 1
        if not live:
            return replay(llm, requests)
        cache = llm.engine.cache
        self._snapshots = []

        def on_step(stats) -> None:
            snapshot = PoolSnapshot.of(cache, stats.step, stats.time)
            self._snapshots.append(snapshot)
            if self.live:  # the page map moves while the replay runs
                title = f"{policy}: after step {snapshot.step}, t = {snapshot.time:.3f} s"
                self.pool.show_live(snapshot, title)

        return replay(llm, requests, on_step=on_step)

    # ---- drawing -----------------------------------------------------------------------

    def _draw(self) -> None:
        settings = self.settings
        result = self.results[settings.scheduling]
        # Short titles: the plots share a row with the pool, and the sliders show the values.
        self.figure = panel_figure(result, f"{settings.scheduling} batching")
        show_figure(self.plot, self.figure)
        if len(self.results) > 1:
            title = "The three policies on the same trace"
            self.comparison = comparison_figure(self.results, title)
            show_figure(self.comparison_plot, self.comparison)
        self._set_status(html.escape(self.summary_text()))
        # Rest on the step where the pool was fullest (the end is all free).
        if self._snapshots:
            self.pool.load(self._snapshots, title=settings.scheduling)

    def _set_status(self, text: str) -> None:
        self.status.value = text

    def summary_text(self) -> str:
        """The selected policy's headline numbers (deterministic: a simulated clock)."""
        if not self.results:
            return "not run yet"
        s = self.results[self.settings.scheduling].summary
        return (
            f"{self.settings.scheduling}: {s['num_requests']:.0f} requests in "
            f"{s['num_steps']:.0f} steps; E2E p50 {s['e2e_p50']:.3f} s, p99 "
            f"{s['e2e_p99']:.3f} s; TTFT p99 {s['ttft_p99']:.3f} s; "
            f"longest token gap p99 {s['max_token_gap_p99']:.3f} s; "
            f"{s['output_tokens_per_s']:.0f} tokens/s; mean batch {s['mean_batch_size']:.2f}; "
            f"peak KV {s['kv_usage_peak']:.0%}; {s['num_preemptions']:.0f} preemptions"
        )

    # ---- events ------------------------------------------------------------------------

    def _on_knob(self, change) -> None:
        if not self._quiet:
            self._replay_soon()

    def _replay_soon(self) -> None:
        """Replay once for a burst of moves: in a kernel (a running event loop), DEBOUNCE_S
        after the last move, so each move cancels the replay the one before it planned;
        with no loop (a script, a test), at once."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.run()
            return
        self._cancel_pending()
        self._pending = loop.call_later(DEBOUNCE_S, self.run)

    def _cancel_pending(self) -> None:
        if self._pending is not None:
            self._pending.cancel()
            self._pending = None

    def to_animation(self) -> Animation | None:
        """The last replay as an animated PNG: the timeline, a marker under it that moves
        with the clock, and the KV pool at that moment; None where no browser can draw
        the timeline (``kvlab.widgets.static_figures``)."""
        timeline = figure_png(self.figure) if self.figure is not None else None
        if timeline is None or not self.pool.snapshots:
            return None
        indices, hold = self.pool.animation_steps()
        times = [self.pool.snapshots[i].time for i in indices]
        return Animation.under_a_still(
            timeline,
            [time_axis_px(self.figure, t) for t in times],
            [svg_to_png(svg) for svg in self.pool.frame_svgs(indices)],
            hold=hold,
            text=repr(self),
        )

    def _repr_mimebundle_(self, **kwargs):
        # For GitHub, nbviewer and HTML exports: the replay animated where a browser can
        # draw the timeline, else the pool's SVG at the step shown.
        animation = self.to_animation()
        picture = self.pool.to_svg() if animation is None else animation.static_copy()
        return with_static_copy(super()._repr_mimebundle_(**kwargs), repr(self), picture)

    def __repr__(self) -> str:
        if self.error:
            return f"BatchingPanel(not replayed: {self.error})"
        return f"BatchingPanel({self.summary_text()})"
