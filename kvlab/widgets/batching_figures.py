"""Lab 04's figures of a replay: who ran when, the load over time, the policies compared.

    timeline_figure    per request: waiting / prefill / decode / swapped, one row per request
    load_figure        running and waiting requests, and KV usage, over time
    comparison_figure  TTFT p99, E2E p50/p99, tokens/s and mean batch size per policy
    panel_figure       the batching panel's view of one replay (timeline and load)
    time_axis_px       where a moment of a panel figure's time axis falls in its PNG

Every figure is a plotly ``go.Figure`` built from ``kvlab.measure.replay.ReplayResult``s.
Not handled: live updates (the panel redraws a new figure for each replay).
"""

from __future__ import annotations

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from kvlab.measure.replay import STATES, ReplayResult
from kvlab.widgets.static_figures import SIZE

STATE_COLORS = {
    "waiting": "#c9c9c9",
    "prefill": "#f0a73a",
    "decode": "#2e9e5b",
    "swapped": "#a77fc2",
}
POLICY_COLORS = {"static": "#5b6b8c", "dynamic": "#f0a73a", "continuous": "#2e9e5b"}
PANEL_MARGIN = (60, 20)  # panel_figure's left and right margins, px


def _request_labels(result: ReplayResult) -> list[str]:
    return [f"req {i}" for i in range(len(result.outputs))]


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


def timeline_figure(results: dict[str, ReplayResult], title: str = "") -> go.Figure:
    """One timeline per run, stacked, on one time axis."""
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


def load_figure(results: dict[str, ReplayResult], title: str = "") -> go.Figure:
    """Running and waiting requests and KV usage after every step, one line per run."""
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        vertical_spacing=0.07,
        subplot_titles=("requests running", "requests waiting", "KV usage (% of blocks held)"),
    )
    for name, result in results.items():
        steps = result.metrics.steps
        times = [s.time for s in steps]
        color = POLICY_COLORS.get(name)
        rows = (
            [s.num_running for s in steps],
            [s.num_waiting for s in steps],
            [100 * s.kv_usage for s in steps],
        )
        for row, values in enumerate(rows, start=1):
            fig.add_scatter(
                x=times,
                y=values,
                mode="lines",
                line=dict(shape="hv", color=color),
                name=name,
                legendgroup=name,
                showlegend=row == 1,
                row=row,
                col=1,
            )
    fig.update_layout(
        title=title or "Queue depth and KV usage over time",
        height=520,
        margin=dict(t=70, b=40, l=60, r=20),
    )
    fig.update_xaxes(title_text="time (s)", row=3, col=1)
    return fig


def comparison_figure(results: dict[str, ReplayResult], title: str = "") -> go.Figure:
    """Latency percentiles, throughput and mean batch size of each run, side by side."""
    names = list(results)
    summaries = [results[n].summary for n in names]
    fig = make_subplots(
        rows=1,
        cols=3,
        column_widths=[0.5, 0.25, 0.25],
        subplot_titles=("latency (s)", "output tokens/s", "mean batch size"),
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
        margin=dict(t=100, b=40, l=50, r=20),
        legend=dict(orientation="h", y=-0.15),
    )
    return fig


def panel_figure(result: ReplayResult, title: str) -> go.Figure:
    """The panel's main plot: the timeline, and below it queue depth and KV usage."""
    fig = make_subplots(
        rows=3,
        cols=1,
        shared_xaxes=True,
        row_heights=[0.6, 0.2, 0.2],
        vertical_spacing=0.06,
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
    height = 330 + 22 * len(result.outputs)
    fig.update_layout(
        barmode="overlay",
        title=dict(text=title, y=1 - 28 / height, yanchor="top", yref="container"),
        height=height,
        margin=dict(t=130, b=40, l=PANEL_MARGIN[0], r=PANEL_MARGIN[1]),
        # Above the plots, under the title: a legend at the side would narrow the plots
        # by its own width, which time_axis_px could not know.
        legend=dict(orientation="h", y=1 - 70 / height, yanchor="top", yref="container", x=0),
    )
    # A fixed time range (not plotly's autorange), so that time_axis_px knows where a
    # moment is drawn.
    fig.update_xaxes(range=[0, 1.02 * max(ends + times + [0.001])])
    fig.update_xaxes(title_text="time (s, simulated)", row=3, col=1)
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
