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

Where no kernel runs it (GitHub, nbviewer), its output shows a PNG of the timeline.

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

import base64
import html
import math
from dataclasses import dataclass, fields, replace

import ipywidgets as widgets
import plotly.graph_objects as go

from kvlab.engine.llm import LLM
from kvlab.engine.metrics import ManualClock
from kvlab.engine.scheduler_config import SCHEDULING_MODES, SchedulerConfig
from kvlab.engine.step_cost import StepCostClock
from kvlab.measure.replay import ReplayResult, TraceRequests, on_time_grid, replay
from kvlab.model.loading import load_model
from kvlab.sim.trace import LENGTH_PROFILES, make_trace
from kvlab.widgets.batching_figures import comparison_figure, panel_figure, show_figure
from kvlab.widgets.static_figures import figure_png
from kvlab.widgets.step_view import PoolSnapshot, StepView
from kvlab.widgets.svg import with_static_copy

BLOCK_SIZES = (1, 2, 4, 8, 16, 32, 64)

# ---- the knobs -------------------------------------------------------------------------------


@dataclass(frozen=True)
class PanelSettings:
    """The values of the panel's controls, each checked against its slider's range.

    Attributes:
        scheduling: ``"static"``, ``"dynamic"`` or ``"continuous"`` (the timeline's policy).
        max_num_seqs: sequences that run at once (the seed article's max_batch_size), 1-16.
        batch_timeout: dynamic only: seconds a batch waits to fill, 0-2.
        block_size: tokens per KV block, a power of two from 1 to 64.
        num_blocks: KV blocks in the pool, 4-512.
        max_num_batched_tokens: the token budget of one continuous step, 16-512.
        arrival_rate: mean requests per second of the trace, 0.5-50.
    """

    scheduling: str = "continuous"
    max_num_seqs: int = 4
    batch_timeout: float = 0.1
    block_size: int = 8
    num_blocks: int = 64
    max_num_batched_tokens: int = 32
    arrival_rate: float = 8.0

    def __post_init__(self) -> None:
        if self.scheduling not in SCHEDULING_MODES:
            _refuse("scheduling", self.scheduling, f"one of {SCHEDULING_MODES}")
        _check_number("max_num_seqs", self.max_num_seqs, 1, 16, integer=True)
        _check_number("batch_timeout", self.batch_timeout, 0, 2)
        if self.block_size not in BLOCK_SIZES or isinstance(self.block_size, bool):
            _refuse("block_size", self.block_size, f"one of {BLOCK_SIZES}")
        _check_number("num_blocks", self.num_blocks, 4, 512, integer=True)
        _check_number("max_num_batched_tokens", self.max_num_batched_tokens, 16, 512, integer=True)
        _check_number("arrival_rate", self.arrival_rate, 0.5, 50)

    def describe(self) -> str:
        return (
            f"max_num_seqs={self.max_num_seqs}, batch_timeout={self.batch_timeout:.2f} s, "
            f"block_size={self.block_size}, num_blocks={self.num_blocks}, "
            f"max_num_batched_tokens={self.max_num_batched_tokens}, "
            f"{self.arrival_rate:g} requests/s"
        )


def _refuse(name: str, value, allowed: str):
    raise ValueError(f"{name}={value!r} is not allowed: use {allowed}")


def _check_number(name: str, value, low, high, integer: bool = False) -> None:
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        _refuse(name, value, f"{'an int' if integer else 'a number'} from {low} to {high}")


def _sliders(settings: PanelSettings) -> dict[str, widgets.Widget]:
    """One slider per knob, at the values of ``settings``; none replays while dragged."""
    # Two columns of 415 px fit JupyterLab's output area beside its file browser (about
    # 850 px); a narrower area wraps them, so that no column hides the other's readouts.
    style = {"description_width": "185px"}
    layout = widgets.Layout(width="415px")
    common = dict(continuous_update=False, style=style, layout=layout)
    return {
        "max_num_seqs": widgets.IntSlider(
            value=settings.max_num_seqs, min=1, max=16, description="max_num_seqs", **common
        ),
        "batch_timeout": widgets.FloatSlider(
            value=settings.batch_timeout,
            min=0,
            max=2,
            step=0.05,
            readout_format=".2f",
            description="batch_timeout (s)",
            **common,
        ),
        "block_size": widgets.SelectionSlider(
            value=settings.block_size, options=BLOCK_SIZES, description="block_size", **common
        ),
        "num_blocks": widgets.IntSlider(
            value=settings.num_blocks, min=4, max=512, step=4, description="num_blocks", **common
        ),
        "max_num_batched_tokens": widgets.IntSlider(
            value=settings.max_num_batched_tokens,
            min=16,
            max=512,
            step=16,
            description="max_num_batched_tokens",
            **common,
        ),
        "arrival_rate": widgets.FloatSlider(
            value=settings.arrival_rate,
            min=0.5,
            max=50,
            step=0.5,
            readout_format=".1f",
            description="arrival_rate (req/s)",
            **common,
        ),
    }


# ---- the panel -------------------------------------------------------------------------------


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
        compare: also replay the two other policies for the comparison plot.
        live: redraw the page map at every step of a replay; False draws it once, at the
            end (for sweeps: each redraw is a message to the browser).
        run: replay once now (else call ``run()``).
        **settings: starting values of the controls (``PanelSettings`` fields).

    Attributes:
        settings: the values of the last replay.
        results: policy -> ``ReplayResult`` of the last replay.
        figure, comparison: the plotly figures shown (``go.Figure``).
        pool: the KV pool's ``StepView``, live during a replay, then its recording;
            ``page_map``, ``gauge`` and ``step_slider`` are its parts.
        sliders: name -> slider; ``scheduling``, ``step_slider``, ``run_button``, ``status``.
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
        compare: bool = True,
        live: bool = True,
        run: bool = True,
        **settings,
    ) -> None:
        _check_number("num_requests", num_requests, 1, 256, integer=True)
        _check_number("max_output_len", max_output_len, 1, 4096, integer=True)
        if lengths not in LENGTH_PROFILES:
            _refuse("lengths", lengths, f"one of {sorted(LENGTH_PROFILES)}")
        if isinstance(step_seconds, bool) or not isinstance(step_seconds, int | float):
            _refuse("step_seconds", step_seconds, "seconds > 0")
        if not 0 < step_seconds < math.inf:
            _refuse("step_seconds", step_seconds, "seconds > 0")
        unknown = set(settings) - {f.name for f in fields(PanelSettings)}
        if unknown:
            raise TypeError(f"BatchingPanel got unknown settings {sorted(unknown)}")
        self.settings = PanelSettings(**settings)
        self._options = dict(preemption_mode=preemption_mode, watermark=watermark)
        SchedulerConfig(**self._options)  # checks both now, not at the first replay
        self.model, self.tokenizer = _model_of(model)
        self._trace_args = dict(num_requests=num_requests, lengths=lengths, seed=seed)
        self._max_output_len = max_output_len
        self._step_seconds = step_seconds
        if step_cost is not None:
            StepCostClock(step_cost)  # checks it now, not at the first replay
        self._step_cost = step_cost
        self._compare = compare
        self.live = live
        self._weight_bytes = sum(p.numel() * p.element_size() for p in self.model.parameters())
        self.results: dict[str, ReplayResult] = {}
        self.figure: go.Figure | None = None
        self.comparison: go.Figure | None = None
        self.error: str | None = None
        self.num_replays = 0
        self._snapshots: list[PoolSnapshot] = []
        self._quiet = False
        super().__init__(children=self._build())
        self.add_class("kvlab-batching-panel")
        if run:
            self.run()

    # ---- layout ------------------------------------------------------------------------

    def _build(self) -> list[widgets.Widget]:
        self.scheduling = widgets.ToggleButtons(
            options=SCHEDULING_MODES, value=self.settings.scheduling, description="scheduling"
        )
        self.scheduling.add_class("kvlab-toggle-scheduling")
        self.sliders = _sliders(self.settings)
        for name, slider in self.sliders.items():
            slider.add_class(f"kvlab-slider-{name}")
            slider.observe(self._on_knob, names="value")
        self.scheduling.observe(self._on_knob, names="value")
        self.run_button = widgets.Button(description="replay", icon="play")
        self.run_button.add_class("kvlab-run-button")
        self.run_button.on_click(lambda _: self.run())
        self.status = widgets.HTML("not run yet")
        self.status.add_class("kvlab-batching-status")
        self.plot = widgets.Output()
        self.plot.add_class("kvlab-batching-plot")
        self.comparison_plot = widgets.Output()
        self.comparison_plot.add_class("kvlab-batching-comparison")
        # The KV pool: drawn live during a replay, then a recording to step through.
        self.pool = StepView([], weight_bytes=self._weight_bytes)
        self.pool.page_map.add_class("kvlab-batching-page-map")
        self.page_map, self.gauge = self.pool.page_map, self.pool.gauge
        self.step_slider = self.pool.slider
        names = list(self.sliders)
        controls = widgets.HBox(
            [
                widgets.VBox([self.sliders[n] for n in names[:3]]),
                widgets.VBox([self.sliders[n] for n in names[3:]]),
            ],
            layout=widgets.Layout(flex_flow="row wrap"),
        )
        # The pool right under the sliders: both fit a 1,000 px window, so a learner sees
        # the map change as a slider moves; the tall timeline comes after.
        return [
            self.scheduling,
            controls,
            widgets.HBox([self.run_button, self.status]),
            self.pool,
            self.plot,
            self.comparison_plot,
        ]

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
        """Replay the trace with the controls' values; show the outcome or why it failed."""
        try:
            settings = self._read_controls()
            requests = self._requests(settings.arrival_rate)
            self._set_status("replaying ...")
            selected = settings.scheduling
            results = {selected: self._replay(settings, selected, requests, live=True)}
            others = [p for p in SCHEDULING_MODES if p != selected] if self._compare else []
            for policy in others:
                results[policy] = self._replay(settings, policy, requests, live=False)
        except ValueError as error:
            self.error = str(error)
            self._set_status(f"<b>Not replayed:</b> {html.escape(self.error)}")
            return
        self.error = None
        self.settings = settings
        self.results = {p: results[p] for p in SCHEDULING_MODES if p in results}
        self._draw()

    def _read_controls(self) -> PanelSettings:
        values = {name: slider.value for name, slider in self.sliders.items()}
        return PanelSettings(scheduling=self.scheduling.value, **values)

    def _requests(self, arrival_rate: float) -> TraceRequests:
        trace = make_trace(
            arrival_rate=arrival_rate,
            max_model_len=self.model.config.max_position_embeddings,
            **self._trace_args,
        )
        vocab_size = self.model.config.vocab_size
        seed = self._trace_args["seed"]
        return TraceRequests.from_trace(trace, vocab_size, self._max_output_len, seed)

    def _replay(
        self, settings: PanelSettings, policy: str, requests: TraceRequests, live: bool
    ) -> ReplayResult:
        llm = LLM(
            self.model,
            tokenizer=self.tokenizer,
            scheduling=policy,
            max_num_seqs=settings.max_num_seqs,
            batch_timeout=on_time_grid(settings.batch_timeout),
            block_size=settings.block_size,
            num_blocks=settings.num_blocks,
            max_num_batched_tokens=settings.max_num_batched_tokens,
            clock=self._clock(),
            **self._options,
        )
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

    def _clock(self):
        if self._step_cost is None:
            return ManualClock(self._step_seconds)
        return StepCostClock(self._step_cost)

    # ---- drawing -----------------------------------------------------------------------

    def _draw(self) -> None:
        settings = self.settings
        result = self.results[settings.scheduling]
        title = f"{settings.scheduling} batching<br><sub>{settings.describe()}</sub>"
        self.figure = panel_figure(result, title)
        show_figure(self.plot, self.figure)
        if len(self.results) > 1:
            title = f"The three policies on the same trace<br><sub>{settings.describe()}</sub>"
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
            self.run()

    def _repr_mimebundle_(self, **kwargs):
        # For GitHub, nbviewer and HTML exports: a PNG of the timeline where a browser can
        # draw one, else the pool's SVG at the step shown.
        data, metadata = with_static_copy(
            super()._repr_mimebundle_(**kwargs), repr(self), self.pool.to_svg()
        )
        png = figure_png(self.figure) if self.figure is not None else None
        if png is not None:
            del data["image/svg+xml"]
            data["image/png"] = base64.b64encode(png).decode("ascii")
        return data, metadata

    def __repr__(self) -> str:
        if self.error:
            return f"BatchingPanel(not replayed: {self.error})"
        return f"BatchingPanel({self.summary_text()})"


def _model_of(model):
    """(model, tokenizer) from a name, or a loaded model (no tokenizer needed)."""
    if isinstance(model, str):
        return load_model(model, device="cpu")
    if hasattr(model, "config") and hasattr(model, "parameters"):
        return model, None
    raise ValueError(
        f"model={model!r} is not allowed: use 'tiny', 'smollm2-135m' or a loaded model"
    )
