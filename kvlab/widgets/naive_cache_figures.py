"""Lab 01's figures: what a KV cache saves, what it rewrites, and what a padded batch wastes.

    step_time_figure         time per generated token against the context, with and
                             without a cache, and the line fitted through the no-cache steps
    work_and_time_figure     one whole run as work (token positions) and as time, side by side
    cache_writes_animation   a DynamicCache's run step by step: every step writes a new
                             tensor holding all the tokens so far (an animated PNG)
    padding_animation        a padded batch step by step: rows grow, finished rows fill with
                             padding (an animated PNG)
    memory_figure            weights, KV cache and activations for a few loads

Each picture is drawn from finished measurements of ``kvlab.measure.naive_hf`` and
``kvlab.measure.padded_batch``; none measures anything. The plotly figures are
``go.Figure``s; the two animations are SVG frames played as an animated PNG
(``kvlab.widgets.animation``), so they move on GitHub and in an HTML export too.
Colours, one meaning each in the lab: green is the KV cache (what a cached run keeps, real
tokens held), orange the run without a cache, greys padding, blue a prompt, slate the
weights, purple activations; green, orange, slate and purple as in the memory gauge.
Not handled: live updates (each picture is drawn once), steps beyond ``MAX_FRAMES`` frames
(the animations pick evenly spread steps).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from html import escape

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.measure.naive_hf import DecodeTrace, MemoryBreakdown, NoCacheStep, fit_no_cache_steps
from kvlab.measure.padded_batch import FINISHED_PAD, SLOT_KIND_NAMES, PaddedBatch
from kvlab.memory import MIB
from kvlab.widgets.animation import MAX_FRAMES, Animation, pick_frames
from kvlab.widgets.memory_gauge import COLORS, format_bytes
from kvlab.widgets.svg import svg_document, svg_text

WITH_CACHE = COLORS["KV used"]
WITHOUT_CACHE = COLORS["KV reserved, unused"]
NEW_TOKEN = "#145c32"  # the token a step adds, darker than the copied ones
# One per slot kind, in SLOT_KIND_NAMES' order: padding in two greys (light before the
# prompt, dark after EOS), the prompt blue, generated tokens the KV cache's green.
SLOT_KIND_COLORS = ("#d4d4d4", "#4c78a8", WITH_CACHE, "#7a7a7a")
# Every legend sits above the plot, under the title, where it covers no data.
_LEGEND = dict(orientation="h", x=0, xanchor="left", y=1.0, yanchor="bottom")
_LAYOUT = dict(height=360, margin=dict(t=90, b=50), legend=_LEGEND)
_SVG_WIDTH, _LEFT, _RIGHT = 640, 70, 20  # px: the picture, and the plot's side margins


def step_time_figure(trace: DecodeTrace, no_cache: Sequence[NoCacheStep]) -> go.Figure:
    """Time per generated token against the tokens of context, with and without a cache.

    The cached run's decode steps (its prefill, step 0, is left out) against the timed
    no-cache steps, each of which ran its whole context through the model, and the
    straight line fitted through all of those (``naive_hf.fit_no_cache_steps``).
    """
    fit = fit_no_cache_steps(no_cache)
    lens = [step.context_len for step in no_cache]
    ends = [min(lens), max(lens)]
    fig = go.Figure()
    fig.add_scatter(
        x=trace.cache_lens[1:],
        y=[1000 * s for s in trace.step_seconds[1:]],
        mode="lines",
        line_color=WITH_CACHE,
        name="with a cache: one new token per step",
    )
    fig.add_scatter(
        x=lens,
        y=[1000 * step.seconds for step in no_cache],
        mode="markers",
        marker=dict(color=WITHOUT_CACHE, size=8),
        name="without a cache: the whole context per step",
    )
    fig.add_scatter(
        x=ends,
        y=[1000 * fit.seconds_at(n) for n in ends],
        mode="lines",
        line=dict(color=WITHOUT_CACHE, dash="dot"),
        name=f"line through the {fit.num_points} points: "
        f"{1000 * fit.seconds_per_token:.1f} ms per token",
    )
    fig.update_layout(
        title="Per token: flat with a cache; without one, a few ms more per token of context",
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
    ``seconds_*`` the time of each step, summed here. The no-cache times are estimates
    (``naive_hf.no_cache_seconds``), and its total says so.
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
    panels = [
        (positions_with, positions_without, "{:,}", "{:,}"),
        (time_with, time_without, "{:.1f} s", "{:.1f} s (estimated)"),
    ]
    for col, (with_cache, without_cache, unit_with, unit_without) in enumerate(panels, start=1):
        for values, color, name, unit in [
            (with_cache, WITH_CACHE, "with a cache", unit_with),
            (without_cache, WITHOUT_CACHE, "without a cache", unit_without),
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
        **{**_LAYOUT, "legend": {**_LEGEND, "y": 1.08}, "margin": dict(t=110, b=50)},
    )
    return fig


def cache_writes_frames(trace: DecodeTrace, max_frames: int = 32) -> list[str]:
    """The SVG frames of ``cache_writes_animation``: one per picked step, then the last.

    Each step of a ``DynamicCache`` run is one row: the new tensor ``torch.cat`` wrote,
    as long as the tokens the cache held after it (the copied ones green, the new token
    dark). Rows pile up as the run goes: their total length is what the run wrote, the
    last row alone is the cache's final size.
    """
    bytes_per_token = trace.cache_bytes[-1] // trace.cache_lens[-1]
    written = list(itertools.accumulate(trace.cache_bytes))
    final = trace.cache_bytes[-1]
    title = (
        f"Every step rewrites the whole cache: {written[-1] / MIB:.0f} MiB written "
        f"for a {final / MIB:.1f} MiB cache ({written[-1] / final:.0f}x)"
    )
    num_steps, longest = len(trace.cache_lens), trace.cache_lens[-1]
    top, row_px = 104, max(1.0, min(4.0, 260 / num_steps))
    px = (_SVG_WIDTH - _LEFT - _RIGHT) / longest  # per token
    height = round(top + num_steps * row_px + 56)
    x_ticks = _ticks(longest)
    frames = []
    for step in pick_frames(num_steps, limit=max_frames):
        body = [
            _svg_title(title),
            svg_text(
                10,
                44,
                f"step {step}: torch.cat wrote a new tensor of {trace.cache_lens[step]} tokens; "
                f"written so far {written[step] / MIB:.0f} MiB = "
                f"{written[step] / trace.cache_bytes[step]:.1f}x the cache now",
            ),
            *_svg_legend(
                [
                    ("copied from the old tensor", WITH_CACHE),
                    ("new at this step", NEW_TOKEN),
                    ("one row per step, the first at the top", None),
                ],
                y=70,
            ),
        ]
        for k in range(step + 1):
            y, tokens = top + k * row_px, trace.cache_lens[k]
            new = 1 if k else tokens  # the prefill wrote the whole prompt afresh
            body.append(_rect(_LEFT, y, (tokens - new) * px, row_px, WITH_CACHE))
            body.append(_rect(_LEFT + (tokens - new) * px, y, new * px, row_px, NEW_TOKEN))
        bottom = top + num_steps * row_px
        body += _x_axis(
            x_ticks, px, bottom, f"tokens written at this step ({bytes_per_token:,} bytes each)"
        )
        body += [
            svg_text(_LEFT - 8, top + 9, "step 0", ' text-anchor="end"'),
            svg_text(_LEFT - 8, bottom, f"step {num_steps - 1}", ' text-anchor="end"'),
        ]
        frames.append(svg_document(_SVG_WIDTH, height, body, title))
    return frames


def cache_writes_animation(trace: DecodeTrace, seconds: float = 0.35) -> Animation:
    """``cache_writes_frames`` as an animated PNG, dwelling on the last frame."""
    frames = cache_writes_frames(trace)
    text = f"animation: a DynamicCache's writes over {len(trace.cache_lens)} steps"
    return Animation.of_svgs(frames, seconds=seconds, hold={len(frames) - 1: 3.0}, text=text)


def padding_frames(batch: PaddedBatch, labels: Sequence[str] | None = None) -> list[str]:
    """The SVG frames of ``padding_animation``: the batch's cache after every step.

    One row per request, one cell per position, coloured by what it holds. After the
    prefill every row holds its prompt, padded on the left to the longest; every decode
    step adds one position to every row: a generated token, or padding once the request
    has produced its EOS.

    Args:
        labels: a short name for each request (default "request 0", "request 1", ...).
    """
    labels = (
        list(labels) if labels is not None else [f"request {i}" for i in range(len(batch.outputs))]
    )
    if len(labels) != len(batch.outputs):
        raise ValueError(f"{len(labels)} labels for {len(batch.outputs)} requests")
    if batch.num_steps > MAX_FRAMES:
        raise ValueError(f"{batch.num_steps} steps: padding_frames draws at most {MAX_FRAMES}")
    title = f"Padding fills {batch.waste:.0%} of the batch's cache, before prompts and after EOS"
    seq_len, width = batch.cache_shape[2], max(batch.prompt_lens)
    px = (_SVG_WIDTH - _LEFT - _RIGHT) / seq_len
    top, row_px = 96, 24
    bottom = top + len(labels) * (row_px + 6)
    legend = _svg_legend(list(zip(SLOT_KIND_NAMES, SLOT_KIND_COLORS, strict=True)), y=70)
    frames = []
    for step in range(batch.num_steps):
        kinds = batch.slot_kinds(after_step=step)
        finished = [label for label, row in zip(labels, kinds, strict=True) if FINISHED_PAD in row]
        caption = (
            f"after the prefill: every prompt padded on the left to {width} positions"
            if step == 0
            else f"after decode step {step}: {width + step} positions per row"
            + (f"; fed padding: {', '.join(finished)}" if finished else "")
        )
        body = [_svg_title(title), svg_text(10, 44, caption), *legend]
        for i, (label, row) in enumerate(zip(labels, kinds, strict=True)):
            y = top + i * (row_px + 6)
            body.append(svg_text(_LEFT - 8, y + 16, label, ' text-anchor="end"'))
            body.append(
                f'<rect x="{_LEFT}" y="{y}" width="{seq_len * px:.1f}" height="{row_px}" '
                'fill="none" stroke="#bbbbbb" stroke-dasharray="3 2"/>'
            )
            for start, run in itertools.groupby(enumerate(row), key=lambda cell: cell[1]):
                cells = list(run)
                x = _LEFT + cells[0][0] * px
                body.append(_rect(x, y, len(cells) * px, row_px, SLOT_KIND_COLORS[start]))
        body += _x_axis(_ticks(seq_len), px, bottom, "position in the cache (tokens)")
        frames.append(svg_document(_SVG_WIDTH, bottom + 50, body, title))
    return frames


def padding_animation(
    batch: PaddedBatch, labels: Sequence[str] | None = None, seconds: float = 0.4
) -> Animation:
    """``padding_frames`` as an animated PNG, dwelling on the prefill and on the end."""
    frames = padding_frames(batch, labels)
    hold = {0: 1.5, len(frames) - 1: 3.0}
    text = f"animation: a padded batch of {len(batch.outputs)} requests over {len(frames)} steps"
    return Animation.of_svgs(frames, seconds=seconds, hold=hold, text=text)


def memory_figure(rows: Sequence[MemoryBreakdown]) -> go.Figure:
    """Weights, KV cache and one decode step's activations for each load, side by side.

    A log scale: the activations are a thousand times smaller than the rest, and the KV
    cache spans three orders of magnitude over the loads; each bar carries its value.
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
        fig.add_bar(
            x=labels,
            y=[v / MIB for v in values],
            name=name,
            marker_color=color,
            text=[format_bytes(v) for v in values],
            textposition="outside",
            textfont_size=10,
            cliponaxis=False,
        )
    fig.update_layout(
        barmode="group",
        title="Serving more: the weights stay put, the KV cache grows with requests x tokens",
        xaxis_title="load (requests x tokens each)",
        yaxis=dict(title="memory (MiB, log scale)", type="log"),
        **_LAYOUT,
    )
    return fig


def _rect(x: float, y: float, width: float, height: float, fill: str) -> str:
    return (
        f'<rect x="{x:.1f}" y="{y:.1f}" width="{width:.1f}" height="{height:.1f}" fill="{fill}"/>'
    )


def _svg_title(text: str) -> str:
    return (
        f'<text x="10" y="22" font-family="sans-serif" font-size="14" font-weight="bold">'
        f"{escape(text)}</text>"
    )


def _svg_legend(items: Sequence[tuple[str, str | None]], y: float) -> list[str]:
    """(label, colour) pairs in one row, each behind a 12 px square (none for None)."""
    parts, x = [], 10.0
    for label, color in items:
        if color is not None:
            parts.append(_rect(x, y - 10, 12, 12, color))
            x += 17
        parts.append(svg_text(x, y, label))
        x += 6.2 * len(label) + 16
    return parts


def _ticks(longest: int) -> list[int]:
    step = 20 if longest <= 160 else 50
    return list(range(0, longest + 1, step))


def _x_axis(ticks: Sequence[int], px: float, y: float, title: str) -> list[str]:
    right = _SVG_WIDTH - _RIGHT
    parts = [f'<line x1="{_LEFT}" y1="{y + 4:.1f}" x2="{right}" y2="{y + 4:.1f}" stroke="#888"/>']
    for tick in ticks:
        x = _LEFT + tick * px
        parts.append(
            f'<line x1="{x:.1f}" y1="{y + 4:.1f}" x2="{x:.1f}" y2="{y + 8:.1f}" stroke="#888888"/>'
        )
        parts.append(svg_text(x, y + 21, str(tick), ' text-anchor="middle"'))
    mid = (_LEFT + _SVG_WIDTH - _RIGHT) / 2
    parts.append(svg_text(mid, y + 40, title, ' text-anchor="middle"'))
    return parts
