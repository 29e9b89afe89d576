"""Lab 07's figures: how many requests each method batched, and what a wider step costs.

    concurrency_figure  requests computed in each step, one line per method: a cache that
                        reserves less batches more requests and needs fewer steps
    step_cost_figure    wall time of each decode step against the sequences in it, beside
                        what lab 04's step-cost clock predicts: a wider step is not free
                        on a CPU, so batching twelve requests does not make them twelve
                        times faster

Each function returns a plotly ``go.Figure`` built from plain numbers (no engine objects),
so the lab calls it with what its measurements printed. Colours follow lab 03: contiguous
orange, paged green. Not handled: live updates, the A100-scale simulator's results (the
lab prints those beside the published figures as a table).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping, Sequence

import plotly.graph_objects as go

METHOD_COLORS = {
    "kvlab-contiguous": "#f0a73a",
    "kvlab-paged": "#2e9e5b",
    "hf-generate-batch": "#5b6b8c",
}
OTHER_COLOR = "#888888"
METHOD_DASH = {"hf-generate-batch": "dash"}  # drawn over paged's line where they agree


def concurrency_figure(runs: Mapping[str, Sequence[int]], title: str) -> go.Figure:
    """Requests computed in each step, one stepped line per method.

    Args:
        runs: method name -> how many requests each of its steps computed, in order.
        title: what the reader should see (the lab states its lesson here).
    """
    if not runs or any(len(sizes) == 0 for sizes in runs.values()):
        raise ValueError(f"runs needs at least one method with steps, got {dict(runs)!r}")
    fig = go.Figure()
    for name, sizes in runs.items():
        color = METHOD_COLORS.get(name, OTHER_COLOR)
        fig.add_scatter(
            x=list(range(1, len(sizes) + 1)),
            y=list(sizes),
            name=f"{name} ({len(sizes)} steps)",
            mode="lines",
            line=dict(shape="hv", color=color, width=3, dash=METHOD_DASH.get(name, "solid")),
            hovertemplate=f"{name}, step %{{x}}: %{{y}} requests<extra></extra>",
        )
    peak = max(max(sizes) for sizes in runs.values())
    fig.update_layout(
        title=title,
        xaxis_title="engine step",
        yaxis=dict(title="requests computed in the step", dtick=2, range=[0, peak + 4]),
        legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
        height=360,
        margin=dict(t=80, b=40),
    )
    return fig


def step_cost_figure(
    measured: Sequence[tuple[int, float]],
    clock_seconds: Callable[[int], float],
    title: str,
) -> go.Figure:
    """Each decode step's wall time against its width, and the clock's line through them.

    Args:
        measured: ``(sequences in the step, seconds)`` of every step timed (decode-only
            steps: ``EngineRun.decode_step_seconds``).
        clock_seconds: the step-cost clock's seconds for a step of ``n`` decoding sequences.
        title: what the reader should see.
    """
    if not measured:
        raise ValueError("measured needs at least one (sequences, seconds) step")
    widths = sorted({n for n, _ in measured})
    medians = [statistics.median(s for n, s in measured if n == width) for width in widths]
    line = list(range(1, max(widths) + 1))
    fig = go.Figure()
    fig.add_scatter(
        x=[n for n, _ in measured],
        y=[1000 * s for _, s in measured],
        name="one step, measured",
        mode="markers",
        marker=dict(color="#2e9e5b", opacity=0.35, size=6),
        hovertemplate="%{x} sequences: %{y:.0f} ms<extra></extra>",
    )
    fig.add_scatter(
        x=widths,
        y=[1000 * s for s in medians],
        name="median of the steps this wide",
        mode="markers",
        marker=dict(color="#1b6b3d", symbol="diamond", size=10),
        hovertemplate="%{x} sequences: median %{y:.0f} ms<extra></extra>",
    )
    fig.add_scatter(
        x=line,
        y=[1000 * clock_seconds(n) for n in line],
        name="step-cost clock (lab 04's fit)",
        mode="lines",
        line=dict(color="#444444", dash="dash"),
        hovertemplate="clock, %{x} sequences: %{y:.0f} ms<extra></extra>",
    )
    top = max([1000 * s for _, s in measured] + [1000 * clock_seconds(line[-1])])
    fig.update_layout(
        title=title,
        xaxis=dict(title="sequences decoded in the step", dtick=1),
        yaxis=dict(title="time of the step (ms)", range=[0, 1.25 * top]),
        legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
        height=360,
        margin=dict(t=80, b=40),
    )
    return fig
