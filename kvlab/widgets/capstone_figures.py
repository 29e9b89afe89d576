"""Lab 07's figures: how many requests each method batched, what a wider step costs, and
how the seed's servers hold up as requests come faster.

    concurrency_figure  requests computed in each step, one line per method: a cache that
                        reserves less batches more requests and needs fewer steps
    step_cost_figure    wall time of each decode step against the sequences in it, one
                        colour per run, beside what lab 04's step-cost clock predicts: a
                        wider step is not free on a CPU
    latency_figure      the PagedAttention paper's Fig. 12 for the seed's servers at A100
                        scale: normalized latency against request rate, the latency limit
                        and each server's flat-out rate marked; a curve turns up where
                        requests come faster than its server finishes them

Each function returns a plotly ``go.Figure`` built from plain numbers (no engine objects),
so the lab calls it with what its measurements printed. Colours follow lab 03's
allocators (``kvlab.widgets.memory_figures``): contiguous blue, paged purple. Not handled:
live updates; the memory bars beside the paper's Fig. 2 are lab 03's
``where_memory_goes_figure``.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence

import plotly.graph_objects as go

from kvlab.widgets.memory_figures import CONTIGUOUS_COLOR, PAGED_COLOR

METHOD_COLORS = {
    "kvlab-contiguous": CONTIGUOUS_COLOR,
    "kvlab-paged": PAGED_COLOR,
    "hf-generate-batch": "#444444",
}
OTHER_COLOR = "#888888"
METHOD_DASH = {"hf-generate-batch": "dash"}  # drawn over paged's line where they agree
# The seed's servers (``kvlab.sim.servers``): (colour, dash). Both max-length servers
# reserve contiguously; static batching is the dashed one.
SERVER_STYLES = {
    "one at a time": (OTHER_COLOR, "solid"),
    "max-length, static": (CONTIGUOUS_COLOR, "dash"),
    "max-length, continuous": (CONTIGUOUS_COLOR, "solid"),
    "clairvoyant, continuous": (CONTIGUOUS_COLOR, "dot"),
    "paged, continuous": (PAGED_COLOR, "solid"),
}


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
    measured: Mapping[str, Sequence[tuple[int, float]]],
    clock_seconds: Callable[[int], float],
    title: str,
) -> go.Figure:
    """Each decode step's wall time against its width, one colour per run, the median of
    each width over all runs, and the clock's line through them.

    Args:
        measured: run name -> ``(sequences in the step, seconds)`` of every step timed
            (decode-only steps: ``EngineRun.decode_step_seconds``).
        clock_seconds: the step-cost clock's seconds for a step of ``n`` decoding sequences.
        title: what the reader should see.
    """
    steps = [step for run in measured.values() for step in run]
    if not steps:
        raise ValueError("measured needs at least one (sequences, seconds) step")
    widths = sorted({n for n, _ in steps})
    medians = [statistics.median(s for n, s in steps if n == width) for width in widths]
    line = list(range(1, max(widths) + 1))
    fig = go.Figure()
    for name, run in measured.items():
        fig.add_scatter(
            x=[n for n, _ in run],
            y=[1000 * s for _, s in run],
            name=f"{name}: one step",
            mode="markers",
            marker=dict(color=METHOD_COLORS.get(name, OTHER_COLOR), opacity=0.45, size=6),
            hovertemplate=f"{name}, %{{x}} sequences: %{{y:.0f}} ms<extra></extra>",
        )
    fig.add_scatter(
        x=widths,
        y=[1000 * s for s in medians],
        name="median of the steps this wide",
        mode="markers",
        marker=dict(color="#111111", symbol="diamond", size=9),
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
    top = max([1000 * s for _, s in steps] + [1000 * clock_seconds(line[-1])])
    fig.update_layout(
        title=title,
        xaxis=dict(title="sequences decoded in the step", dtick=1),
        yaxis=dict(title="time of the step (ms)", range=[0, 1.25 * top]),
        legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
        height=380,
        margin=dict(t=100, b=40),
    )
    return fig


def latency_figure(
    curves: Mapping[str, Sequence[tuple[float, float]]],
    limit: float,
    flat_out: Mapping[str, float],
    title: str,
) -> go.Figure:
    """Normalized latency against request rate, one line per server (the paper's Fig. 12).

    Both axes are logarithmic: the servers' rates span a hundredfold. The latency limit is
    a horizontal dashed line; each server's flat-out rate (every request at once) a dotted
    vertical line in its colour, where its curve should turn up.

    Args:
        curves: server name -> ``(requests per second, normalized latency in seconds per
            output token)`` at each rate replayed, rates increasing.
        limit: the latency limit, seconds per output token.
        flat_out: server name -> requests per second it finished flat out.
        title: what the reader should see.
    """
    if not curves or any(len(points) == 0 for points in curves.values()):
        raise ValueError(f"curves needs at least one server with points, got {dict(curves)!r}")
    if limit <= 0:
        raise ValueError(f"limit={limit!r} is not allowed: give seconds per token > 0")
    latencies = [y for points in curves.values() for _, y in points]
    low, high = min(latencies + [limit]) / 1.5, max(latencies + [limit]) * 1.5
    fig = go.Figure()
    for name, points in curves.items():
        color, dash = SERVER_STYLES.get(name, (OTHER_COLOR, "solid"))
        fig.add_scatter(
            x=[x for x, _ in points],
            y=[y for _, y in points],
            name=name,
            mode="lines+markers",
            line=dict(color=color, dash=dash, width=2.5),
            marker=dict(color=color, size=7),
            hovertemplate=f"{name}, %{{x}} requests/s: %{{y:.3f}} s per token<extra></extra>",
        )
    for name, rate in flat_out.items():
        color, _ = SERVER_STYLES.get(name, (OTHER_COLOR, "solid"))
        fig.add_scatter(
            x=[rate, rate],
            y=[low, high],
            mode="lines",
            line=dict(color=color, dash="dot", width=1.5),
            showlegend=False,
            hovertemplate=f"{name} flat out: {rate:.2f} requests/s<extra></extra>",
        )
    rates = [x for points in curves.values() for x, _ in points] + list(flat_out.values())
    fig.add_scatter(
        x=[min(rates) / 1.3, max(rates) * 1.3],
        y=[limit, limit],
        mode="lines",
        name=f"latency limit, {limit:g} s per token",
        line=dict(color="#c0392b", dash="dash", width=1.5),
        hoverinfo="skip",
    )
    fig.add_scatter(
        x=[None],
        y=[None],
        mode="lines",
        name="dotted: the server's rate flat out",
        line=dict(color="#666666", dash="dot", width=1.5),
    )
    fig.update_layout(
        title=title,
        xaxis=dict(title="request rate (requests per second, log scale)", type="log"),
        yaxis=dict(
            title="normalized latency (s per output token, log scale)",
            type="log",
            range=[math.log10(low), math.log10(high)],
        ),
        legend=dict(orientation="h", x=0, y=0, yanchor="bottom", yref="container"),
        height=520,
        margin=dict(t=60, b=170),
    )
    return fig
