"""Lab 01's figures: what a KV cache saves, what it holds, and what a padded batch wastes.

    step_time_figure      time per generated token against the context, with and without a cache
    work_and_time_figure  one whole run as work (token positions) and as time, side by side
    cache_growth_figure   a DynamicCache's bytes after every step, beside the formula
    padding_figure        what each position of a padded batch's cache holds
    memory_figure         weights, KV cache and activations for a few loads

Every figure is a plotly ``go.Figure`` drawn from finished measurements of
``kvlab.measure.naive_hf`` and ``kvlab.measure.padded_batch``; none measures anything.
Colours follow the memory gauge: the KV cache green, the weights slate, activations purple.
Not handled: live updates (each figure is drawn once).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.measure.naive_hf import DecodeTrace, MemoryBreakdown, NoCacheStep
from kvlab.measure.padded_batch import SLOT_KIND_NAMES, PaddedBatch
from kvlab.memory import MIB
from kvlab.widgets.memory_gauge import COLORS

WITH_CACHE = COLORS["KV used"]
WITHOUT_CACHE = COLORS["KV reserved, unused"]
# One per slot kind, in SLOT_KIND_NAMES' order: padding is grey (left) and orange (after
# EOS, held but unused, as the gauge's "reserved, unused"); real tokens blue and green.
SLOT_KIND_COLORS = ("#c9c9c9", "#4c78a8", COLORS["KV used"], COLORS["KV reserved, unused"])
_LAYOUT = dict(height=340, margin=dict(t=50, b=50), legend=dict(x=0.01, y=0.99))


def step_time_figure(trace: DecodeTrace, no_cache: Sequence[NoCacheStep]) -> go.Figure:
    """Time per generated token against the tokens of context, with and without a cache.

    The cached run's decode steps (its prefill, step 0, is left out) against the timed
    no-cache steps, each of which ran its whole context through the model.
    """
    fig = go.Figure()
    fig.add_scatter(
        x=trace.cache_lens[1:],
        y=[1000 * s for s in trace.step_seconds[1:]],
        mode="lines",
        line_color=WITH_CACHE,
        name="with a cache: one new token per step",
    )
    fig.add_scatter(
        x=[step.context_len for step in no_cache],
        y=[1000 * step.seconds for step in no_cache],
        mode="lines+markers",
        line_color=WITHOUT_CACHE,
        name="without a cache: the whole context per step",
    )
    fig.update_layout(
        title="Per token: flat with a cache, climbing with the context without one",
        xaxis_title="context length (tokens)",
        yaxis=dict(title="time per token (ms)", rangemode="tozero"),
        **_LAYOUT,
    )
    return fig


def work_and_time_figure(
    positions_with: Sequence[int],
    positions_without: Sequence[int],
    seconds_with: Sequence[float],
    seconds_without: Sequence[float],
) -> go.Figure:
    """One run as work (left) and as time (right), totals after every generated token.

    ``positions_*`` are running totals of token positions (``naive_hf.positions_computed``);
    ``seconds_*`` the time of each step, summed here.
    """
    lists = (positions_with, positions_without, seconds_with, seconds_without)
    if len({len(values) for values in lists}) != 1:
        raise ValueError("work_and_time_figure needs one value per generated token in each list")
    generated = list(range(1, len(positions_with) + 1))
    time_with = list(itertools.accumulate(seconds_with))
    time_without = list(itertools.accumulate(seconds_without))
    work_ratio = positions_without[-1] / positions_with[-1]
    time_ratio = time_without[-1] / time_with[-1]
    fig = make_subplots(rows=1, cols=2, horizontal_spacing=0.12, subplot_titles=("work", "time"))
    for col, (with_cache, without_cache, unit) in enumerate(
        [(positions_with, positions_without, "{:,}"), (time_with, time_without, "{:.1f} s")],
        start=1,
    ):
        for values, color, name in [
            (with_cache, WITH_CACHE, "with a cache"),
            (without_cache, WITHOUT_CACHE, "without a cache"),
        ]:
            fig.add_scatter(
                x=generated,
                y=values,
                mode="lines",
                line_color=color,
                name=name,
                legendgroup=name,
                showlegend=col == 1,
                row=1,
                col=col,
            )
            fig.add_annotation(
                x=generated[-1],
                y=values[-1],
                text=unit.format(values[-1]),
                xanchor="right",
                yanchor="bottom",
                showarrow=False,
                row=1,
                col=col,
            )
    fig.update_xaxes(title_text="tokens generated")
    fig.update_yaxes(title_text="token positions computed (total)", row=1, col=1)
    fig.update_yaxes(title_text="seconds (total)", row=1, col=2)
    fig.update_layout(
        title=f"Without a cache: {work_ratio:.0f}x the work, only {time_ratio:.1f}x the time",
        **{**_LAYOUT, "margin": dict(t=80, b=50)},
    )
    return fig


def cache_growth_figure(trace: DecodeTrace, bytes_per_token: int) -> go.Figure:
    """The cache's measured bytes after every step, and the formula's straight line."""
    fig = go.Figure()
    fig.add_scatter(
        x=trace.cache_lens,
        y=[b / MIB for b in trace.cache_bytes],
        mode="markers",
        marker_color=WITH_CACHE,
        name="measured: the DynamicCache's tensors",
    )
    ends = [0, trace.cache_lens[-1]]
    fig.add_scatter(
        x=ends,
        y=[n * bytes_per_token / MIB for n in ends],
        mode="lines",
        line=dict(dash="dot", color="#111111"),
        name=f"formula: {bytes_per_token:,} bytes x tokens",
    )
    fig.update_layout(
        title=f"The cache grows by {bytes_per_token:,} bytes per token, exactly the formula",
        xaxis_title="tokens in the cache",
        yaxis_title="cache size (MiB)",
        **_LAYOUT,
    )
    return fig


def padding_figure(batch: PaddedBatch) -> go.Figure:
    """One row per request, one cell per cache position, coloured by what it holds."""
    kinds = len(SLOT_KIND_NAMES)
    fig = go.Figure(
        go.Heatmap(
            z=batch.slot_kinds(),
            zmin=-0.5,
            zmax=kinds - 0.5,
            xgap=1,
            ygap=2,
            # Each kind owns one equal band of the colour scale: a discrete legend.
            colorscale=[
                [(i + edge) / kinds, color]
                for i, color in enumerate(SLOT_KIND_COLORS)
                for edge in (0, 1)
            ],
            colorbar=dict(tickvals=list(range(kinds)), ticktext=list(SLOT_KIND_NAMES), len=0.9),
            hovertemplate="request %{y}, position %{x}<extra></extra>",
        )
    )
    fig.update_layout(
        title=f"{batch.waste:.0%} of the batch's cache holds padding (grey and orange)",
        xaxis_title="position in the cache (tokens)",
        yaxis=dict(title="request", autorange="reversed", dtick=1),
        height=280,
        margin=dict(t=50, b=50),
    )
    return fig


def memory_figure(rows: Sequence[MemoryBreakdown]) -> go.Figure:
    """Weights, KV cache and one decode step's activations for each load, side by side.

    A log scale: the activations are a thousand times smaller than the rest, and the KV
    cache spans three orders of magnitude over the loads.
    """
    labels = [f"{r.batch_size} x {r.seq_len:,}" for r in rows]
    fig = go.Figure()
    for name, color, values in [
        ("weights", COLORS["weights"], [r.weight_bytes for r in rows]),
        ("KV cache", COLORS["KV used"], [r.kv_bytes for r in rows]),
        (
            "activations (one decode step)",
            COLORS["other tensors"],
            [r.activation_bytes for r in rows],
        ),
    ]:
        fig.add_bar(x=labels, y=[v / MIB for v in values], name=name, marker_color=color)
    fig.update_layout(
        barmode="group",
        title="Serving more: the weights stay put, the KV cache grows with requests x tokens",
        xaxis_title="load (requests x tokens each)",
        yaxis=dict(title="memory (MiB, log scale)", type="log"),
        **_LAYOUT,
    )
    return fig
