"""Lab 04's figures: who ran when, who waited, knob sweeps, what a step costs, the budget.

    timeline_figure    per request: waiting / prefill / decode / swapped, one row per request,
                       with a mark where a request was preempted and where it recomputed
    queue_figure       requests running and waiting against the seats, one row per run
    comparison_figure  TTFT p99, E2E p50/p99, tokens/s and mean batch size per policy
    sweep_figure       summary numbers against a knob (batch_timeout, watermark), one line
                       per sweep
    step_cost_figure   what a step costs against the tokens it computes, the ridge marked
    budget_figure      the token budget's trade-off: decodes' longest gap against TTFT
    panel_figure       the batching panel's view of one replay (timeline and load)
    time_axis_px       where a moment of a panel figure's time axis falls in its PNG
    PreemptionRecording  the KV pool at the steps where requests were preempted and
                       resumed, each labelled with what happened, for a ``StepView``

Every figure is a plotly ``go.Figure`` built from ``kvlab.measure.replay.ReplayResult``s
(``step_cost_figure`` from cost models, ``kvlab.engine.step_cost``). Requests are named
``r0``, ``r1``, ... in the order of the workload, as ``ReplayResult.step_log`` names them.
Not handled: live updates (the panel redraws a new figure for each replay).
"""

from __future__ import annotations

from dataclasses import replace

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from kvlab.engine.step_cost import StepWork
from kvlab.measure.replay import STATES, ReplayResult
from kvlab.widgets.static_figures import SIZE
from kvlab.widgets.step_view import PoolSnapshot, StepView

STATE_COLORS = {
    "waiting": "#c9c9c9",
    "prefill": "#f0a73a",
    "decode": "#2e9e5b",
    "swapped": "#a77fc2",
}
POLICY_COLORS = {"static": "#5b6b8c", "dynamic": "#f0a73a", "continuous": "#2e9e5b"}
PREEMPTED_COLOR = "#c0392b"
SEATS_COLOR = "#111111"
SWEEP_COLORS = ("#2b5d8c", "#8c564b", "#9ecae1", "#111111")  # no orange: it means prefill
PANEL_MARGIN = (60, 20)  # panel_figure's left and right margins, px
PANEL_ROW_PX = 8  # panel_figure: the most px of one request's timeline row
PANEL_TIMELINE_PX = 128  # panel_figure: the timeline's height, once rows are that small
PANEL_LOAD_PX = 36  # panel_figure: each load plot's height


def _request_labels(result: ReplayResult) -> list[str]:
    return [f"r{i}" for i in range(len(result.outputs))]


def add_timeline(
    fig: go.Figure, result: ReplayResult, row: int = 1, in_legend: set[str] | None = None
) -> None:
    """Draw who runs when into ``fig``'s ``row``: one bar row per request, colored by state.

    ``in_legend`` names the states already in the legend (from the rows drawn before): each
    state gets one legend entry, in the first row where it appears. It is updated here.
    """
    in_legend = set() if in_legend is None else in_legend
    labels = _request_labels(result)
    segments = result.timeline()
    for state in STATES:
        chosen = [s for s in segments if s.state == state]
        if not chosen:
            continue
        fig.add_trace(
            go.Bar(
                orientation="h",
                y=[labels[s.request] for s in chosen],
                x=[s.end - s.start for s in chosen],
                base=[s.start for s in chosen],
                marker_color=STATE_COLORS[state],
                name=state,
                legendgroup=state,
                showlegend=state not in in_legend,
                hovertemplate=f"%{{y}} {state}: %{{base:.3f}} s + %{{x:.3f}} s<extra></extra>",
            ),
            row=row,
            col=1,
        )
        in_legend.add(state)
    ends = [o.metrics.arrival_time + o.metrics.e2e for o in result.outputs]
    fig.add_trace(
        go.Scatter(
            x=ends,
            y=labels,
            mode="markers",
            marker=dict(symbol="line-ns-open", size=10, color="#111111"),
            name="finished",
            legendgroup="finished",
            showlegend="finished" not in in_legend,
            hovertemplate="%{y} finished at %{x:.3f} s<extra></extra>",
        ),
        row=row,
        col=1,
    )
    in_legend.add("finished")
    fig.update_yaxes(
        categoryorder="array",
        categoryarray=labels,
        tickmode="array",
        tickvals=labels,
        autorange="reversed",
        row=row,
        col=1,
    )


def add_preemptions(
    fig: go.Figure, result: ReplayResult, row: int = 1, in_legend: set[str] | None = None
) -> None:
    """Mark in ``fig``'s ``row`` where each request was preempted (a cross, when the step
    that took its blocks began) and where it computed its tokens again (a diamond on each
    prefill after a preemption: a recompute).

    On a clock where every step lasts the same, a recompute is one step long: a sliver of
    a bar, which a mark makes visible. Nothing is drawn for a run without preemptions.
    """
    in_legend = set() if in_legend is None else in_legend
    labels = _request_labels(result)
    preemptions = _preemptions(result)
    crosses = [(t, labels[i]) for t, i in preemptions]
    diamonds = [
        (s.start, labels[s.request])
        for s in result.timeline()
        if s.state == "prefill" and any(i == s.request and t <= s.start for t, i in preemptions)
    ]
    marks = (
        ("preempted", crosses, dict(symbol="x", size=9, color=PREEMPTED_COLOR)),
        (
            "recomputed",
            diamonds,
            dict(symbol="diamond", size=9, color=STATE_COLORS["prefill"], line_width=1),
        ),
    )
    for name, points, marker in marks:
        if not points:
            continue
        fig.add_trace(
            go.Scatter(
                x=[t for t, _ in points],
                y=[label for _, label in points],
                mode="markers",
                marker=marker,
                name=name,
                legendgroup=name,
                showlegend=name not in in_legend,
                hovertemplate=f"%{{y}} {name} at %{{x:.3f}} s<extra></extra>",
            ),
            row=row,
            col=1,
        )
        in_legend.add(name)


def _preemptions(result: ReplayResult) -> list[tuple[float, int]]:
    """``(time, request index)`` of every preemption: when the step that took its blocks
    began."""
    index = {o.request_id: i for i, o in enumerate(result.outputs)}
    return [
        (start, index[r])
        for step, start in zip(result.metrics.steps, result.step_starts(), strict=True)
        for r in step.preempted
        if r in index
    ]


def timeline_figure(results: dict[str, ReplayResult], title: str = "") -> go.Figure:
    """One timeline per run, stacked, on one time axis; preemptions and recomputes marked."""
    num_requests = max(len(r.outputs) for r in results.values())
    fig = make_subplots(
        rows=len(results),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.06,
        subplot_titles=list(results),
    )
    in_legend: set[str] = set()
    for row, result in enumerate(results.values(), start=1):
        add_timeline(fig, result, row=row, in_legend=in_legend)
        add_preemptions(fig, result, row=row, in_legend=in_legend)
    fig.update_layout(
        barmode="overlay",
        title=title or "Who runs when (simulated clock)",
        height=150 + len(results) * (40 + 16 * num_requests),
        margin=dict(t=60, b=90, l=60, r=20),
        # Under the time axis: above the plots it ran into the first subplot's title.
        legend=dict(orientation="h", y=0.01, yanchor="bottom", yref="container", x=0),
    )
    fig.update_xaxes(title_text="time (s)", row=len(results), col=1)
    return fig


def counts_over_time(result: ReplayResult) -> tuple[list[float], list[int], list[int]]:
    """``(times, running, waiting)``: from each time on, how many requests were computed
    (prefill or decode) and how many had arrived but were not (waiting or swapped).

    Counted from ``ReplayResult.timeline()``, not from the steps, so the time before a
    batch starts, when no step runs (dynamic batching's wait), is counted too.
    """
    segments = result.timeline()
    times = sorted({s.start for s in segments} | {s.end for s in segments})
    running, waiting = [], []
    for start, end in zip(times, times[1:], strict=False):
        middle = (start + end) / 2
        states = [s.state for s in segments if s.start <= middle < s.end]
        running.append(sum(state in ("prefill", "decode") for state in states))
        waiting.append(sum(state in ("waiting", "swapped") for state in states))
    return times, running + [0], waiting + [0]


def queue_figure(
    results: dict[str, ReplayResult], max_num_seqs: int | None = None, title: str = ""
) -> go.Figure:
    """Requests running (green) and waiting (grey, stacked on top) over time, one row per
    run, under a line at ``max_num_seqs``: grey below the line is a seat left empty while
    a request waits.

    The rows share one time axis and one requests axis, so their heights compare, and the
    seat line runs from the first arrival to the end of the longest run in every row.
    """
    fig = make_subplots(
        rows=len(results),
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.08,
        subplot_titles=list(results),
    )
    counts = {name: counts_over_time(result) for name, result in results.items()}
    start = min(times[0] for times, _, _ in counts.values())
    end = max(times[-1] for times, _, _ in counts.values())
    highest = max(
        max(r + w for r, w in zip(run, wait, strict=True)) for _, run, wait in counts.values()
    )
    top = 1.1 * max(highest, max_num_seqs or 0)
    for row, (times, running, waiting) in enumerate(counts.values(), start=1):
        total = [r + w for r, w in zip(running, waiting, strict=True)]
        stacks = (
            ("running", running, "tozeroy", STATE_COLORS["decode"], running),
            ("waiting", total, "tonexty", STATE_COLORS["waiting"], waiting),
        )
        for name, values, fill, color, shown in stacks:
            fig.add_scatter(
                x=times,
                y=values,
                customdata=shown,
                mode="lines",
                line=dict(shape="hv", color=color, width=1),
                fill=fill,
                fillcolor=color,
                name=name,
                legendgroup=name,
                showlegend=row == 1,
                hovertemplate=f"%{{customdata}} {name} from %{{x:.3f}} s<extra></extra>",
                row=row,
                col=1,
            )
        if max_num_seqs is not None:
            fig.add_scatter(
                x=[start, end],
                y=[max_num_seqs] * 2,
                mode="lines",
                line=dict(color=SEATS_COLOR, dash="dash", width=1.5),
                name=f"seats (max_num_seqs = {max_num_seqs})",
                legendgroup="seats",
                showlegend=row == 1,
                hoverinfo="skip",
                row=row,
                col=1,
            )
        fig.update_yaxes(title_text="requests", range=[0, top], row=row, col=1)
    fig.update_layout(
        title=title or "Requests running and waiting over time",
        height=120 + 150 * len(results),
        margin=dict(t=70, b=90, l=60, r=20),
        legend=dict(orientation="h", y=0.01, yanchor="bottom", yref="container", x=0),
    )
    fig.update_xaxes(range=[start, end])
    fig.update_xaxes(title_text="time (s)", row=len(results), col=1)
    return fig


def comparison_figure(results: dict[str, ReplayResult], title: str = "") -> go.Figure:
    """Latency percentiles, throughput and mean batch size of each run, side by side."""
    names = list(results)
    summaries = [results[n].summary for n in names]
    fig = make_subplots(
        rows=1,
        cols=3,
        column_widths=[0.44, 0.28, 0.28],
        horizontal_spacing=0.1,
        subplot_titles=("latency (s)", "tokens/s", "mean batch"),
    )
    metrics = (("TTFT p99", "ttft_p99", "#a77fc2"), ("E2E p50", "e2e_p50", "#8fb3d9"))
    metrics += (("E2E p99", "e2e_p99", "#2b5d8c"),)
    for label, key, color in metrics:
        fig.add_bar(x=names, y=[s[key] for s in summaries], name=label, marker_color=color)
    colors = [POLICY_COLORS.get(n, "#5b6b8c") for n in names]
    for col, key in ((2, "output_tokens_per_s"), (3, "mean_batch_size")):
        fig.add_bar(
            x=names,
            y=[s[key] for s in summaries],
            marker_color=colors,
            showlegend=False,
            row=1,
            col=col,
        )
    fig.update_layout(
        barmode="group",
        title=title or "Policies compared on the same trace",
        height=360,
        margin=dict(t=70, b=40, l=50, r=20),
        legend=dict(orientation="h", y=-0.15),
    )
    return fig


def sweep_figure(
    sweeps: dict[str, dict[float, ReplayResult]],
    metrics: dict[str, str],
    x_title: str,
    references: dict[str, ReplayResult] | None = None,
    title: str = "",
) -> go.Figure:
    """Summary numbers against a knob: one panel per metric, one line per sweep.

    Args:
        sweeps: a sweep's name -> {the knob's value -> the replay at that value}.
        metrics: a ``ReplayResult.summary`` key -> its panel's title (with its unit).
        x_title: the knob, with its unit.
        references: a sweep's name -> a continuous-batching run (which has no such knob),
            drawn as a dotted level line in the sweep's colour, labelled "continuous, name".
        title: what the figure shows.
    """
    references = references or {}
    fig = make_subplots(rows=1, cols=len(metrics), subplot_titles=list(metrics.values()))
    for (name, runs), color in zip(sweeps.items(), SWEEP_COLORS, strict=False):
        knob = list(runs)
        for col, key in enumerate(metrics, start=1):
            fig.add_scatter(
                x=knob,
                y=[run.summary[key] for run in runs.values()],
                mode="lines+markers",
                line_color=color,
                name=name,
                legendgroup=name,
                showlegend=col == 1,
                row=1,
                col=col,
            )
            if name in references:
                fig.add_scatter(
                    x=[min(knob), max(knob)],
                    y=[references[name].summary[key]] * 2,
                    mode="lines",
                    line=dict(color=color, dash="dot"),
                    name=f"continuous, {name}",
                    legendgroup=f"reference {name}",
                    showlegend=col == 1,
                    row=1,
                    col=col,
                )
    fig.update_yaxes(rangemode="tozero")
    fig.update_xaxes(title_text=x_title)
    fig.update_layout(
        title=title,
        height=400,
        margin=dict(t=80, b=40, l=50, r=20),
        legend=dict(orientation="h", y=-0.25),
    )
    return fig


def step_work(num_tokens: int) -> StepWork:
    """One step that computes a prompt of ``num_tokens`` tokens from its start."""
    pairs = num_tokens * (num_tokens + 1) // 2
    return StepWork(
        num_prefill_tokens=num_tokens, num_context_tokens=num_tokens, num_attention_pairs=pairs
    )


def ridge_tokens(cost, max_tokens: int = 1024) -> int | None:
    """Where a step stops costing the same and starts growing with its tokens: the first
    token count whose next token costs more than half of what a token costs at
    ``max_tokens``; None when the cost grows from the first token (no flat part)."""

    def extra(n: int) -> float:
        return cost.seconds(step_work(n + 1)) - cost.seconds(step_work(n))

    steep = extra(max_tokens) / 2
    ridge = next((n for n in range(1, max_tokens + 1) if extra(n) > steep), None)
    return None if ridge is None or ridge <= 1 else ridge


def step_cost_figure(
    costs: dict[str, object], max_tokens: int = 1024, title: str = ""
) -> go.Figure:
    """What one step costs against the tokens it computes (one prompt, computed whole),
    one panel per cost model (``Roofline``, ``LinearCost``), the ridge marked where the
    step stops costing the same."""
    fig = make_subplots(rows=1, cols=len(costs), subplot_titles=list(costs))
    tokens = [1, *range(16, max_tokens + 1, 16)]
    for col, cost in enumerate(costs.values(), start=1):
        ms = [1e3 * cost.seconds(step_work(n)) for n in tokens]
        fig.add_scatter(
            x=tokens,
            y=ms,
            mode="lines",
            line=dict(color="#2b5d8c", width=2),
            name="step time",
            showlegend=False,
            hovertemplate="%{x} tokens: %{y:.2f} ms<extra></extra>",
            row=1,
            col=col,
        )
        ridge = ridge_tokens(cost, max_tokens)
        if ridge is not None:
            fig.add_vline(
                x=ridge, line=dict(color=SEATS_COLOR, dash="dash", width=1), row=1, col=col
            )
            fig.add_annotation(
                x=ridge,
                y=1e3 * cost.seconds(step_work(1)),
                text=f"ridge: {ridge} tokens",
                showarrow=False,
                xanchor="left",
                yanchor="bottom",
                xshift=4,
                row=1,
                col=col,
            )
        fig.update_yaxes(title_text="step time (ms)", rangemode="tozero", row=1, col=col)
        fig.update_xaxes(title_text="tokens computed in the step", row=1, col=col)
    fig.update_layout(
        title=title or "What a step costs against the tokens it computes",
        height=380,
        margin=dict(t=80, b=50, l=60, r=20),
        showlegend=False,
    )
    return fig


def budget_figure(
    runs: dict[int, ReplayResult],
    decoding,
    prompts,
    decode_step_s: float | None = None,
    title: str = "",
) -> go.Figure:
    """The token budget's trade-off, one point per budget: the long ``prompts``' mean time
    to first token (x) against the ``decoding`` requests' longest gap between two tokens
    (y); both are request indices. ``decode_step_s``, when given, is drawn as a dotted
    level: the gap when no prompt shares the decodes' step."""
    budgets = list(runs)
    ttft = [1e3 * runs[b].mean_ttft(prompts) for b in budgets]
    gap = [1e3 * runs[b].longest_token_gap(decoding) for b in budgets]
    fig = go.Figure()
    fig.add_scatter(
        x=ttft,
        y=gap,
        mode="lines+markers+text",
        text=[f"budget {b}" for b in budgets],
        textposition="top center",
        line=dict(color="#2b5d8c"),
        marker=dict(size=9),
        name="one point per token budget",
        hovertemplate="%{text}: TTFT %{x:.1f} ms, longest gap %{y:.1f} ms<extra></extra>",
    )
    if decode_step_s is not None:
        fig.add_scatter(
            x=[min(ttft), max(ttft)],
            y=[1e3 * decode_step_s] * 2,
            mode="lines",
            line=dict(color=SEATS_COLOR, dash="dot", width=1),
            name="a decode step with no prompt beside it",
            hoverinfo="skip",
        )
    # Room on the right for the last point's label.
    fig.update_xaxes(
        title_text="long prompts' time to first token, mean (ms)", range=[0, 1.12 * max(ttft)]
    )
    fig.update_yaxes(title_text="decodes' longest gap between tokens (ms)", rangemode="tozero")
    fig.update_layout(
        title=title or "The token budget trades the decodes' stall for the prompts' TTFT",
        height=420,
        margin=dict(t=70, b=50, l=60, r=20),
        legend=dict(orientation="h", y=-0.2),
    )
    return fig


def panel_figure(result: ReplayResult, title: str) -> go.Figure:
    """The panel's main plot: the timeline, and below it queue depth and KV usage.

    Compact, for the panel's column beside the KV pool on a laptop screen: each request's
    row is at most ``PANEL_ROW_PX`` px (fewer for long traces), each load plot
    ``PANEL_LOAD_PX``, and the legend sits in one band under the title.
    """
    n = len(result.outputs)
    row_px = max(3, min(PANEL_ROW_PX, PANEL_TIMELINE_PX // max(n, 1)))
    rows_px = [row_px * n, PANEL_LOAD_PX, PANEL_LOAD_PX]
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        row_heights=rows_px,
        vertical_spacing=0.07,
        subplot_titles=("who runs when", "requests running / waiting", "KV usage (%)"),
    )
    add_timeline(fig, result, row=1)
    steps = result.metrics.steps
    times = [s.time for s in steps]
    queues = (("# running", [s.num_running for s in steps], "#2e9e5b"),)
    queues += (("# waiting", [s.num_waiting for s in steps], "#8c8c8c"),)
    for name, values, color in queues:
        line = dict(shape="hv", color=color)
        fig.add_scatter(x=times, y=values, mode="lines", line=line, name=name, row=2, col=1)
    fig.add_scatter(
        x=times,
        y=[100 * s.kv_usage for s in steps],
        mode="lines",
        line=dict(shape="hv", color="#2b5d8c"),
        name="KV usage",
        row=3,
        col=1,
    )
    ends = [o.metrics.arrival_time + o.metrics.e2e for o in result.outputs]
    top, bottom = 84, 40
    height = top + bottom + round(sum(rows_px) / (1 - 2 * 0.07))
    fig.update_layout(
        barmode="overlay",
        title=dict(text=title, y=1 - 8 / height, yanchor="top", yref="container"),
        height=height,
        margin=dict(t=top, b=bottom, l=PANEL_MARGIN[0], r=PANEL_MARGIN[1]),
        # Under the title, above the plots: a legend at the side would narrow the plots
        # by its own width, which time_axis_px could not know.
        legend=dict(
            orientation="h",
            y=1 - 36 / height,
            yanchor="top",
            yref="container",
            x=0,
            font_size=11,
        ),
        font_size=11,
    )
    fig.update_annotations(font_size=12)  # the subplots' titles
    # Every other request named once rows are too thin for a label each.
    labels = _request_labels(result)[:: -(-10 // row_px)]
    fig.update_yaxes(tickvals=labels, tickfont_size=9, row=1, col=1)
    # The load plots are a few lines of text high: three ticks each, not one per unit.
    fig.update_yaxes(nticks=3, row=2, col=1)
    fig.update_yaxes(nticks=3, row=3, col=1)
    # A fixed time range (not plotly's autorange), so that time_axis_px knows where a
    # moment is drawn.
    fig.update_xaxes(range=[0, 1.02 * max(ends + times + [0.001])])
    fig.update_xaxes(title_text="time (s, simulated)", title_standoff=4, row=3, col=1)
    return fig


def time_axis_px(fig: go.Figure, time: float, width: int = SIZE[0]) -> float:
    """How far from the left of ``panel_figure``'s PNG (``width`` px wide) ``time`` is
    drawn on its time axis."""
    first, last = fig.layout.xaxis.range
    left, right = PANEL_MARGIN
    return left + (width - left - right) * (time - first) / (last - first)


def show_figure(output: widgets.Output, fig: go.Figure) -> None:
    """Replace what ``output`` shows with ``fig`` (plotly's JSON mimetype, no JavaScript)."""
    bundle = pio.renderers["plotly_mimetype"].to_mimebundle(fig.to_dict())
    output.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)


class PreemptionRecording:
    """One replay's KV pool at the steps where requests were preempted or resumed, each
    labelled with what happened, for a ``StepView`` that shows preemption and nothing else.

        recording = PreemptionRecording(llm)
        result = replay(llm, requests, on_step=recording.on_step)
        recording.view(result, title="...", weight_bytes=w)   # rests on the first preemption

    A preemption keeps two frames: the pool before the step (the victim still holds its
    blocks) and after it ("r5 (seq 5) preempted: 3 blocks freed"; with swap, "swapped out:
    3 blocks to CPU"). A resume keeps one ("r5 resumed"; "r5 swapped in"). A kept frame
    also names who finished in its step ("r1 done"). The page map colours a request by its
    ``seq_id``, hence the "(seq 5)".

    Not handled: more than one ``generate`` call on the recorded ``llm``, ``n > 1``.
    """

    def __init__(self, llm) -> None:
        self._llm = llm
        self._snapshots: list[PoolSnapshot] = []
        self._seq_ids: dict[str, int] = {}  # request_id -> seq_id, of every victim

    def on_step(self, stats) -> None:
        """Record the pool after a step (pass it to ``replay`` as ``on_step``)."""
        self._snapshots.append(PoolSnapshot.of(self._llm.engine.cache, stats.step, stats.time))
        for request_id in stats.preempted:
            self._seq_ids[request_id] = self._llm.engine.seq_id_of(request_id)

    def frames(self, result: ReplayResult) -> tuple[list[PoolSnapshot], int | None]:
        """The labelled snapshots around each preemption and resume, and the index of the
        first preemption among them (None when nobody was preempted).

        Args:
            result: what ``replay`` returned for the recorded run (its steps and names).
        """
        steps = result.metrics.steps
        if len(steps) != len(self._snapshots):
            raise ValueError(
                f"result has {len(steps)} steps but {len(self._snapshots)} were recorded: "
                "pass the result of the replay that called on_step"
            )
        name = {o.request_id: f"r{i}" for i, o in enumerate(result.outputs)}
        labels: dict[int, str] = {}  # snapshot index -> what happened in its step
        first = None
        victims: set[str] = set()
        for k, stats in enumerate(steps):
            events = [f"{name[r]} resumed" for r in stats.admitted if r in victims]
            events += [f"{name[r]} swapped in" for r in stats.swapped_in]
            for request_id in stats.preempted:
                events.append(self._preempted(k, request_id, name, request_id in stats.swapped_out))
                victims.add(request_id)
                if k > 0:
                    labels.setdefault(k - 1, f"before step {stats.step}")
                first = k if first is None else first
            if events:
                events += [f"{name[r]} done" for r in stats.finished]
                labels[k] = ", ".join(events)
        indices = sorted(labels)
        snapshots = [replace(self._snapshots[k], label=labels[k]) for k in indices]
        return snapshots, None if first is None else indices.index(first)

    def _preempted(self, k: int, request_id: str, name: dict, swapped: bool) -> str:
        """The label of a victim of step ``k``: who, and the blocks it held before it."""
        seq_id = self._seq_ids[request_id]
        before = self._snapshots[k - 1].infos if k > 0 else ()
        held = sum(seq_id in b.seq_ids for b in before)
        blocks = f"{held} block{'' if held == 1 else 's'}"
        if swapped:
            return f"{name[request_id]} (seq {seq_id}) swapped out: {blocks} to CPU"
        return f"{name[request_id]} (seq {seq_id}) preempted: {blocks} freed"

    def view(self, result: ReplayResult, title: str, weight_bytes: int = 0) -> StepView:
        """A ``StepView`` of ``frames``, resting on the first preemption."""
        snapshots, first = self.frames(result)
        if not snapshots:
            raise ValueError("nobody was preempted in this replay: there is nothing to show")
        return StepView(snapshots, title=title, weight_bytes=weight_bytes, step=first)
