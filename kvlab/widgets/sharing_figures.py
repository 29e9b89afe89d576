"""Lab 06's pictures of shared KV blocks: recordings that move, and the figures of its runs.

    PoolRecording(llm)                 an ``on_step`` callback for ``LLM.generate``: the
                                       pool after every step, labelled with the requests
                                       that arrived or finished (``.view`` animates it)
    replay_requests(cache, requests)   requests served one after another on a
                                       prefix-caching pool, by hand: the pool when each has
                                       taken its blocks (naming those it adopted and those
                                       it evicted), and after it freed them
    seconds_by_kind(metrics)           steps, tokens and wall seconds of a run's prefill steps
                                       and of its decode steps, to price each kind of token
    speedup_figure                     the best-case speed-up of one hit rate as answers grow
    preemption_figure                  tokens computed at each step of runs that preempt
    crossover_figure                   swap against recompute as the preempted sequence grows
    block_size_figure                  where swapping starts to win, by block size

The figures are plotly ``go.Figure``s built from finished runs; prefill and decode, and
swap, keep lab 04's colours (``kvlab.widgets.batching_figures.STATE_COLORS``).

Not handled: live updates (each figure is drawn once); a replay's model work (it does the
bookkeeping only, the K/V stay as they are).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.engine.metrics import RunMetrics, StepStats
from kvlab.measure.step_cost import PreemptionCost
from kvlab.widgets.batching_figures import STATE_COLORS
from kvlab.widgets.step_view import PoolSnapshot, StepView

SWAP_COLOR = STATE_COLORS["swapped"]
RECOMPUTE_COLOR = STATE_COLORS["prefill"]  # a recompute is a prefill run again


class PoolRecording:
    """An ``on_step`` callback for ``LLM.generate`` that records the KV pool after each step.

    Args:
        llm: the ``kvlab.LLM`` whose ``generate`` calls back.

    Attributes:
        snapshots: one ``PoolSnapshot`` per step, labelled by ``step_label``.
    """

    def __init__(self, llm) -> None:
        self.llm = llm
        self.snapshots: list[PoolSnapshot] = []

    def __call__(self, stats: StepStats) -> None:
        cache = self.llm.engine.cache
        self.snapshots.append(PoolSnapshot.of(cache, stats.step, label=step_label(stats)))

    def view(self, title: str, weight_bytes: int = 0, step: int | None = None) -> StepView:
        """A ``StepView`` of the run (an animation where no kernel runs), resting on
        ``step`` (default: the fullest)."""
        return StepView(self.snapshots, title=title, weight_bytes=weight_bytes, step=step)


def step_label(stats: StepStats) -> str:
    """ "step 6: request 3 arrives; request 0 finishes", or "step 6" when neither happened."""
    events = []
    for ids, one, many in (
        (stats.admitted, "arrives", "arrive"),
        (stats.finished, "finishes", "finish"),
    ):
        requests = list(dict.fromkeys(ids))  # the samples of one request share its id
        if len(requests) == 1:
            events.append(f"request {requests[0]} {one}")
        elif requests:
            events.append(f"requests {', '.join(requests)} {many}")
    return f"step {stats.step}" + (f": {'; '.join(events)}" if events else "")


def replay_requests(cache, requests: Sequence[tuple[int, str, Sequence[int]]]):
    """Serve ``requests`` one after another on ``cache``, a prefix-caching ``PagedKVCache``.

    Each request looks up its prompt's cached prefix (``add_request``), takes blocks for
    the rest of its prompt (``allocate_slots``), then frees them all, as a request of one
    token does in the engine. Bookkeeping only: no K/V is computed.

    Args:
        requests: ``(seq_id, name, prompt_token_ids)`` in order; a ``seq_id`` may come back
            once its earlier request is done (then its colour in the page map does too).

    Returns:
        ``(snapshots, cached_tokens)``: two labelled snapshots per request, and the prompt
        tokens each request found in the cache.
    """
    snapshots, cached_tokens = [], []
    for seq_id, name, prompt in requests:
        cached_before = {b.block_id for b in cache.block_infos() if b.cached and not b.ref_cnt}
        num_cached = cache.add_request(seq_id, prompt)
        cache.allocate_slots(seq_id, len(prompt) - num_cached, token_ids=prompt[num_cached:])
        cached_tokens.append(num_cached)
        table = cache.block_table(seq_id)
        adopted = table[: num_cached // cache.block_size]
        evicted = [b for b in table[len(adopted) :] if b in cached_before]
        label = f"{name} asks: adopts {_blocks(adopted) or 'nothing'}"
        if evicted:
            label += f", evicts {_blocks(evicted)}"
        snapshots.append(PoolSnapshot.of(cache, len(snapshots), label=label))
        cache.free(seq_id)
        kept = sum(1 for b in cache.block_infos() if b.cached and b.block_id in table)
        label = f"{name} done: {_blocks(table)} freed, {kept} of them cached"
        snapshots.append(PoolSnapshot.of(cache, len(snapshots), label=label))
    return snapshots, cached_tokens


def _blocks(block_ids: Sequence[int]) -> str:
    if not block_ids:
        return ""
    noun = "block" if len(block_ids) == 1 else "blocks"
    return f"{noun} {', '.join(map(str, block_ids))}"


def seconds_by_kind(metrics: RunMetrics) -> dict[str, tuple[int, int, float]]:
    """``{"prefill": (steps, tokens, seconds), "decode": (...)}`` of a finished run, each
    step timed from the end of the one before (the first from the run's start).

    Raises:
        ValueError: a step computed both kinds of token, so its time cannot be split.
    """
    ends = [metrics.start_time] + [step.time for step in metrics.steps]
    totals = {"prefill": [0, 0, 0.0], "decode": [0, 0, 0.0]}
    for step, begin, end in zip(metrics.steps, ends, ends[1:], strict=False):
        if step.num_prefill_tokens and step.num_decode_tokens:
            raise ValueError(
                f"step {step.step} computed prefill and decode tokens: its time cannot be split"
            )
        kind = "prefill" if step.num_prefill_tokens else "decode"
        totals[kind][0] += 1
        totals[kind][1] += step.num_prefill_tokens + step.num_decode_tokens
        totals[kind][2] += end - begin
    return {kind: tuple(values) for kind, values in totals.items()}


def speedup_figure(
    output_lengths: Sequence[int], speedups: Sequence[float], hit_rate: float
) -> go.Figure:
    """The best-case speed-up of prefix caching, one line against the output length.

    Args:
        output_lengths: output tokens per request, one per point.
        speedups: tokens computed without the cache / with it, at each length.
        hit_rate: the prefix-cache hit rate every point shares (0..1), for the title.
    """
    fig = go.Figure(
        go.Scatter(
            x=list(output_lengths),
            y=list(speedups),
            mode="lines+markers",
            marker_color=STATE_COLORS["decode"],
            name="best-case speed-up",
            hovertemplate="%{x} output tokens: %{y:.2f}x<extra></extra>",
        )
    )
    fig.add_hline(
        y=1,
        line_dash="dot",
        line_color="#777777",
        annotation_text="1x: no gain",
        annotation_position="bottom right",
    )
    fig.update_layout(
        title=f"The same {hit_rate:.0%} hit rate buys less and less as answers grow",
        xaxis=dict(title="output tokens per request (log scale)", type="log"),
        yaxis=dict(title="best-case speed-up (x)", rangemode="tozero"),
        showlegend=False,
        height=340,
        margin=dict(t=50, b=50),
    )
    return fig


def preemption_figure(runs: dict[str, RunMetrics]) -> go.Figure:
    """One row per run: the prefill and decode tokens of each step (log scale), with arrows
    at the steps where a request was preempted and where it came back."""
    fig = make_subplots(
        rows=len(runs), cols=1, shared_xaxes=True, vertical_spacing=0.1, subplot_titles=list(runs)
    )
    for row, metrics in enumerate(runs.values(), start=1):
        for kind in ("prefill", "decode"):
            fig.add_bar(
                x=[s.step for s in metrics.steps],
                y=[getattr(s, f"num_{kind}_tokens") for s in metrics.steps],
                name=f"{kind} tokens",
                marker_color=STATE_COLORS[kind],
                legendgroup=kind,
                showlegend=row == 1,
                row=row,
                col=1,
            )
        for step in metrics.steps:
            _mark_memory_events(fig, step, row)
    fig.update_yaxes(type="log", range=[-0.4, 2.6], dtick=1, title_text="tokens")  # 1 shows
    fig.update_xaxes(title_text="engine step", row=len(runs), col=1)
    fig.update_layout(
        barmode="stack",
        title="Tokens computed at each step: recompute pays the preempted request's tokens again",
        height=540,
        margin=dict(t=80, b=40),
        legend=dict(orientation="h", x=1, xanchor="right", y=1.1),
    )
    return fig


def _mark_memory_events(fig: go.Figure, step: StepStats, row: int) -> None:
    """Arrows to a step's bar: preemptions from the left, comebacks from the right."""
    total = step.num_prefill_tokens + step.num_decode_tokens
    height = math.log10(max(1, total))  # the y axis is logarithmic: annotations take log10
    gone = [
        f"req {r} preempted" + (", swapped out" if r in step.swapped_out else "")
        for r in step.preempted
    ]
    back = [f"req {r} swapped in" for r in step.swapped_in]
    if step.step > 0 and step.num_prefill_tokens:
        back.append(f"resumed: a {step.num_prefill_tokens}-token prefill")
    for text, ax in [(t, -90) for t in gone] + [(t, 40) for t in back]:
        fig.add_annotation(
            x=step.step, y=height, text=text, ax=ax, ay=-40, arrowhead=2, row=row, col=1
        )


def first_swap_win(rows: Sequence[PreemptionCost]) -> int | None:
    """The shortest ``context_len`` at which swapping is cheaper, or None."""
    return next((r.context_len for r in rows if r.cheaper == "swap"), None)


def crossover_figure(tables: dict[str, Sequence[PreemptionCost]]) -> go.Figure:
    """Swap against recompute, in ms, as the preempted sequence grows: one panel per GPU,
    a dotted line where swapping becomes the cheaper way back.

    Args:
        tables: panel title (a GPU) -> ``preemption_costs`` rows, in growing length.
    """
    fig = make_subplots(
        rows=1,
        cols=len(tables),
        shared_yaxes=True,
        subplot_titles=list(tables),
        horizontal_spacing=0.06,
    )
    where = []
    for col, (gpu, rows) in enumerate(tables.items(), start=1):
        lengths = [r.context_len for r in rows]
        for name, color, values in (
            ("recompute", RECOMPUTE_COLOR, [1e3 * r.recompute_s for r in rows]),
            ("swap out and back in", SWAP_COLOR, [1e3 * r.swap_s for r in rows]),
        ):
            fig.add_scatter(
                x=lengths,
                y=values,
                mode="lines",
                name=name,
                line_color=color,
                legendgroup=name,
                showlegend=col == 1,
                row=1,
                col=col,
                hovertemplate=f"{name}, %{{x:,}} tokens: %{{y:.1f}} ms<extra></extra>",
            )
        fig.update_xaxes(range=[0, lengths[-1]], row=1, col=col)
        cross = first_swap_win(rows)
        short_name = gpu.split()[0]
        if cross is None:
            where.append(f"{short_name}: recompute up to {lengths[-1]:,}")
            continue
        where.append(f"{short_name}: swap from {cross:,} tokens")
        fig.add_vline(x=cross, line_dash="dot", line_color="#555555", row=1, col=col)
        fig.add_annotation(
            x=cross,
            y=0.98,
            yref=f"y{col if col > 1 else ''} domain",
            text=f" swap cheaper from {cross:,} tokens",
            xanchor="left",
            showarrow=False,
            row=1,
            col=col,
        )
    fig.update_xaxes(title_text="tokens the preempted sequence holds")
    fig.update_yaxes(title_text="extra time of the step (ms)", col=1)
    fig.update_layout(
        title="Recompute is cheaper while the preempted sequence is short; swap can win once "
        f"it is long<br><sup>{'; '.join(where)}</sup>",
        height=400,
        margin=dict(t=90, b=50),
        legend=dict(orientation="h", x=0, y=-0.28),
    )
    return fig


def block_size_figure(crossovers: dict[str, dict[int, int | None]], limit: int) -> go.Figure:
    """Per block size, the shortest preempted sequence for which swapping is cheaper, one
    bar group per block size; a bar that reaches ``limit`` hatched means "never, up to
    ``limit`` tokens".

    Args:
        crossovers: series name (a transfer cost) -> block size -> the crossover, or None.
        limit: the longest sequence tried.
    """
    fig = go.Figure()
    shades = ("#d4c1e2", SWAP_COLOR, "#6b4a86")
    for (name, by_size), color in zip(crossovers.items(), shades, strict=False):
        sizes = list(by_size)
        values = list(by_size.values())
        fig.add_bar(
            x=[str(s) for s in sizes],
            y=[limit if v is None else v for v in values],
            name=name,
            marker=dict(
                color=color,
                pattern_shape=["/" if v is None else "" for v in values],
            ),
            text=[f"never to {limit:,}" if v is None else f"{v:,}" for v in values],
            textposition="outside",
            cliponaxis=False,
        )
    fig.update_layout(uniformtext=dict(minsize=10, mode="show"))
    fig.update_layout(
        title="A fixed cost per transfer hurts small blocks: they keep recompute cheaper longer",
        xaxis_title="block size (tokens)",
        yaxis=dict(title="swap cheaper from (tokens held)", range=[0, 1.15 * limit]),
        barmode="group",
        height=360,
        margin=dict(t=50, b=50),
        legend=dict(orientation="h", x=0, y=1.0, yanchor="bottom"),
    )
    return fig
