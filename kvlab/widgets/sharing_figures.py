"""Lab 06's pictures of shared KV blocks: recordings that move, and the figures of its runs.

    PoolRecording(llm)                 an ``on_step`` callback for ``LLM.generate``: the
                                       pool after every step, labelled with what the step
                                       did to the block tables (seqs that arrived, adopted
                                       cached blocks, copied a shared block, finished);
                                       ``.view`` animates it
    replay_requests(requests, n, bs)   requests served one after another on a pool of ``n``
                                       blocks with prefix caching, by hand: the pool and
                                       its free queue when each has taken its blocks
                                       (naming those it adopted, took and evicted) and
                                       after it freed them; ``.view`` animates both
    AllToTheBackPool                   a ``BlockPool`` whose eviction policy puts every
                                       freed block to the back (kvlab's rule before
                                       vLLM's), to measure what putting plain blocks first
                                       buys
    QueueStepView                      a ``StepView`` with the free queue drawn under the
                                       page map, in order, each block numbered
    seconds_by_kind(metrics)           steps, tokens and wall seconds of a run's prefill steps
                                       and of its decode steps, to price each kind of token
    speedup_figure                     the best-case speed-up of one hit rate as answers grow
    preemption_figure                  tokens computed at each step of runs that preempt
    crossover_figure                   swap against recompute as the preempted sequence grows
    block_size_figure                  where swapping starts to win, by block size

The step views leave the memory gauge out: the page map and the free queue tell this lab's
story, and the gauge's orange ("KV reserved, unused") would be the prefill orange of the
figures. The figures are plotly ``go.Figure``s built from finished runs; prefill and
decode, and swap, keep lab 04's colours (``kvlab.widgets.batching_figures.STATE_COLORS``).

Not handled: live updates (each figure is drawn once); a replay's model work (it does the
bookkeeping only, the K/V stay as they are); preemption in a ``PoolRecording`` (a
preempted sequence reads as one that left).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import ipywidgets as widgets
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.cache.block_manager import BlockManager
from kvlab.cache.block_pool import AllToTheBack, BlockPool
from kvlab.cache.paged import PagedKVCache
from kvlab.engine.metrics import RunMetrics
from kvlab.engine.step_stats import StepStats
from kvlab.measure.step_cost import PreemptionCost
from kvlab.widgets.batching_figures import STATE_COLORS
from kvlab.widgets.step_view import PoolSnapshot, StepView
from kvlab.widgets.svg import CACHED, CACHED_HATCH, FREE, WIDTH, stack_svgs, svg_document, svg_text

SWAP_COLOR = STATE_COLORS["swapped"]
RECOMPUTE_COLOR = STATE_COLORS["prefill"]  # a recompute is a prefill run again


# ---- an engine run, step by step ----------------------------------------------------------


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
        self._tables: dict[int, tuple[int, ...]] = {}

    def __call__(self, stats: StepStats) -> None:
        cache = self.llm.engine.cache
        tables = {s: tuple(cache.block_table(s)) for s in cache.manager.seq_ids()}
        hashed = (
            {b.block_id for b in self.snapshots[-1].infos if b.cached} if self.snapshots else set()
        )
        label = step_label(stats.step, self._tables, tables, hashed, bool(stats.preempted))
        self.snapshots.append(PoolSnapshot.of(cache, stats.step, label=label))
        self._tables = tables

    def view(self, title: str, step: int | None = None) -> StepView:
        """A ``StepView`` of the run (an animation where no kernel runs), resting on
        ``step`` (default: the fullest); the page map alone, no gauge."""
        return StepView(self.snapshots, title=title, step=step, gauge=False)


def step_label(
    step: int,
    before: dict[int, tuple[int, ...]],
    after: dict[int, tuple[int, ...]],
    hashed: set[int] = frozenset(),
    preempted: bool = False,
) -> str:
    """What a step did to the block tables, in the page map's words (seqs and blocks):
    "step 1: block 6 copied to 7, 8, 9 (seqs 0, 1, 2)", or "step 1" when nothing changed.

    Args:
        before, after: ``seq_id -> block table`` before and after the step.
        hashed: the blocks that carried a ``block_hash`` before the step; an arriving seq
            whose table starts with them adopted them (a prefix-cache hit).
        preempted: the step preempted a sequence, so a seq gone may not have finished.
    """
    events = []
    arrivals: dict[tuple[int, ...], list[int]] = {}  # blocks adopted -> the seqs that did
    for seq_id in (s for s in after if s not in before):
        arrivals.setdefault(tuple(b for b in after[seq_id] if b in hashed), []).append(seq_id)
    for adopted, seqs in arrivals.items():
        who = f"seq {seqs[0]} arrives" if len(seqs) == 1 else f"seqs {_ids(seqs)} arrive"
        events.append(
            who + (f", adopt{'s' if len(seqs) == 1 else ''} {_blocks(adopted)}" if adopted else "")
        )
    copies: dict[int, list[tuple[int, int]]] = {}  # source block -> (copy, seq)
    for seq_id, table in after.items():
        for old, new in zip(before.get(seq_id, ()), table, strict=False):
            if old != new:
                copies.setdefault(old, []).append((new, seq_id))
    for src, made in copies.items():
        dsts, seqs = _ids(d for d, _ in made), _ids(s for _, s in made)
        events.append(f"block {src} copied to {dsts} (seq{'s' if len(made) > 1 else ''} {seqs})")
    gone = [s for s in before if s not in after]
    if gone:
        verb = (
            ("leave" if len(gone) > 1 else "leaves")
            if preempted
            else ("finish" if len(gone) > 1 else "finishes")
        )
        events.append(f"seq{'s' if len(gone) > 1 else ''} {_ids(gone)} {verb}")
    return f"step {step}" + (f": {'; '.join(events)}" if events else "")


# ---- the free queue, drawn -----------------------------------------------------------------

QUEUE_KINDS = {  # kind -> (legend words, fill, outline)
    "plain": ("plain: no block_hash, taken first", FREE, "#777777"),
    "never used": ("never used", "#ffffff", "#777777"),
    "cached": ("cached: keeps its block_hash, taken last", "url(#kvlab-queue-hatch)", CACHED_HATCH),
}
_CELL, _LABEL_PX = 26, 44  # a queue cell's size, and the "front" label's column


@dataclass(frozen=True)
class FreeQueue:
    """The free blocks in the order ``allocate`` takes them, each with its kind.

    Attributes:
        blocks: ``(block_id, kind)`` from the front; kind is "plain" (freed, no hash),
            "never used" or "cached" (freed, keeps its hash).
    """

    blocks: tuple[tuple[int, str], ...]

    @classmethod
    def of(cls, pool: BlockPool, ever_held: set[int]) -> FreeQueue:
        """The queue of ``pool`` now; ``ever_held``: the blocks any sequence ever held."""
        return cls(
            tuple(
                (
                    b,
                    "cached"
                    if pool.block_hash[b] is not None
                    else "plain"
                    if b in ever_held
                    else "never used",
                )
                for b in pool.free_block_ids()
            )
        )

    def kind_of(self, block_id: int) -> str | None:
        return dict(self.blocks).get(block_id)

    def describe(self) -> str:
        """One line: the queue from the front, run by run ("free queue, front first: ...")."""
        if not self.blocks:
            return "free queue: empty (every block is held)"
        runs: list[tuple[str, list[int]]] = []
        for block_id, kind in self.blocks:
            if runs and runs[-1][0] == kind:
                runs[-1][1].append(block_id)
            else:
                runs.append((kind, [block_id]))
        return "free queue, front first: " + "; ".join(
            f"{kind} {', '.join(map(str, ids))}" for kind, ids in runs
        )


def queue_svg(queue: FreeQueue, num_blocks: int, width: int = WIDTH) -> str:
    """The free queue as a row of numbered cells, front (taken next) on the left, with a
    legend of the three kinds; the same height for every queue of a pool."""
    body = [
        '<defs><pattern id="kvlab-queue-hatch" width="4" height="4" '
        'patternUnits="userSpaceOnUse" patternTransform="rotate(45)">'
        f'<rect width="4" height="4" fill="{CACHED}"/>'
        f'<line x1="0" y1="0" x2="0" y2="4" stroke="{CACHED_HATCH}" stroke-width="1.5"/>'
        "</pattern></defs>",
        svg_text(0, 14, queue.describe(), ' font-weight="bold"'),
    ]
    y = 24
    cell = min(_CELL, (width - 2 * _LABEL_PX) // max(1, num_blocks))
    body.append(svg_text(0, y + cell / 2 + 4, "front"))
    x = _LABEL_PX
    for block_id, kind in queue.blocks:
        _, fill, stroke = QUEUE_KINDS[kind]
        body.append(
            f'<rect x="{x}" y="{y}" width="{cell - 3}" height="{cell - 3}" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1"/>'
        )
        body.append(
            f'<text x="{x + (cell - 3) / 2:g}" y="{y + cell / 2 + 2:g}" font-family="sans-serif" '
            f'font-size="12" font-weight="bold" text-anchor="middle" stroke="#ffffff" '
            f'stroke-width="3" paint-order="stroke">{block_id}</text>'
        )
        x += cell
    body.append(svg_text(x + 4, y + cell / 2 + 4, "back" if queue.blocks else "(empty)"))
    y += cell + 14
    lx = 0.0
    for words, fill, stroke in QUEUE_KINDS.values():
        item = 17 + 6.2 * len(words) + 14  # swatch, words (6.2 px a character), gap
        if lx and lx + item > width:
            lx, y = 0.0, y + 18
        body.append(
            f'<rect x="{lx:g}" y="{y - 10}" width="12" height="12" fill="{fill}" '
            f'stroke="{stroke}" stroke-width="1"/>'
        )
        body.append(svg_text(lx + 17, y, words))
        lx += item
    return svg_document(width, y + 12, body, queue.describe())


class QueueStepView(StepView):
    """A ``StepView`` of a prefix-caching pool that also draws its free queue, in order.

    Under the page map (which draws blocks by id), a strip shows the free blocks in the
    order ``allocate`` takes them, each numbered: plain blocks, then never-used ones, then
    cached ones, least recently used first. The strip is in the live view, in every frame
    of the animation and in the text. No memory gauge.

    Args:
        snapshots: one ``PoolSnapshot`` per step (labelled or not).
        queues: one ``FreeQueue`` per snapshot.
        title, step: as for ``StepView``.
    """

    def __init__(
        self,
        snapshots: list[PoolSnapshot],
        queues: list[FreeQueue],
        title: str = "",
        step: int | None = None,
    ) -> None:
        if len(queues) != len(snapshots):
            raise ValueError(f"{len(queues)} queues for {len(snapshots)} snapshots: give one each")
        self.queues = {s.step: q for s, q in zip(snapshots, queues, strict=True)}
        self.num_blocks = len(snapshots[0].infos) if snapshots else 1
        self.queue_now = FreeQueue(())
        self.queue_view = widgets.HTML()
        super().__init__(snapshots, title=title, step=step, gauge=False)
        controls, page_map = self.children
        self.children = (controls, page_map, self.queue_view)

    def show_live(self, snapshot: PoolSnapshot, title: str) -> None:
        """Draw a snapshot, and the free queue after it."""
        self.queue_now = self.queues.get(snapshot.step, FreeQueue(()))
        self.queue_view.value = self.queue_svg()
        super().show_live(snapshot, title)

    def queue_svg(self) -> str:
        return queue_svg(self.queue_now, self.num_blocks)

    def to_text(self) -> str:
        return f"{super().to_text()}\n{self.queue_now.describe()}"

    def to_svg(self, kv_only: bool = False) -> str:
        """The map and the free queue at the step shown."""
        return stack_svgs([self.page_map.to_svg(), self.queue_svg()])


# ---- requests one after another, by hand ---------------------------------------------------


class AllToTheBackPool(BlockPool):
    """A ``BlockPool`` whose eviction policy is ``AllToTheBack``."""

    def __init__(self, num_blocks: int) -> None:
        super().__init__(num_blocks, eviction_policy=AllToTheBack)


@dataclass(frozen=True)
class Replay:
    """Requests served one after another by hand (``replay_requests``).

    Attributes:
        snapshots: two labelled snapshots per request: after it took its blocks, after
            it freed them.
        queues: the free queue at each snapshot.
        cached_tokens: the prompt tokens each request found in the cache.
        prompt_tokens: the prompt tokens each request brought.
    """

    snapshots: tuple[PoolSnapshot, ...]
    queues: tuple[FreeQueue, ...]
    cached_tokens: tuple[int, ...]
    prompt_tokens: tuple[int, ...]

    @property
    def hit_rate(self) -> float:
        """Prompt tokens served from the cache / prompt tokens, as the engine counts it."""
        return sum(self.cached_tokens) / sum(self.prompt_tokens)

    def view(self, title: str, step: int | None = None) -> QueueStepView:
        """The pool and its free queue, request by request, resting on ``step``."""
        return QueueStepView(list(self.snapshots), list(self.queues), title=title, step=step)


def replay_requests(
    requests: Sequence[tuple[int, str, Sequence[int]]],
    num_blocks: int,
    block_size: int,
    pool_class: type[BlockPool] = BlockPool,
) -> Replay:
    """Serve ``requests`` one after another on a pool of ``num_blocks`` with prefix caching.

    Each request looks up its prompt's cached prefix (``add_request``), takes blocks for
    the rest of its prompt (``allocate_slots``), then frees them all, last block first, as
    a request of one output token does in the engine. Bookkeeping only: the cache's
    tensors are one number per slot and nothing is computed.

    Args:
        requests: ``(seq_id, name, prompt_token_ids)`` in order; a ``seq_id`` may come back
            once its earlier request is done (then its colour in the page map does too).
        pool_class: the ``BlockPool`` (sub)class the blocks come from.
    """
    manager = BlockManager(num_blocks, block_size, True, pool=pool_class(num_blocks))
    cache = PagedKVCache(1, 1, 1, num_blocks, block_size, device="cpu", manager=manager)
    pool, ever_held = manager.pool, set()
    snapshots, queues, cached_tokens = [], [], []

    def record(label: str) -> None:
        queues.append(FreeQueue.of(pool, ever_held))
        snapshots.append(PoolSnapshot.of(cache, len(snapshots), label=label))

    for seq_id, name, prompt in requests:
        before = FreeQueue.of(pool, ever_held)
        num_cached = cache.add_request(seq_id, prompt)
        cache.allocate_slots(seq_id, len(prompt) - num_cached, token_ids=prompt[num_cached:])
        cached_tokens.append(num_cached)
        table = cache.block_table(seq_id)
        ever_held.update(table)
        adopted = table[: num_cached // block_size]
        record(f"{name} asks: {_taken(adopted, table[len(adopted) :], before)}")
        cache.free(seq_id)
        kept = sum(1 for b in table if pool.block_hash[b] is not None)
        record(f"{name} done: {_blocks(table[::-1])} freed, last first; {kept} of them cached")
    return Replay(
        tuple(snapshots),
        tuple(queues),
        tuple(cached_tokens),
        tuple(map(len, (r[2] for r in requests))),
    )


def _taken(adopted: Sequence[int], new: Sequence[int], queue: FreeQueue) -> str:
    """ "adopts blocks 2, 3, takes plain block 5, evicts block 6": a request's blocks in
    its table's order, each new one named by the kind it had in ``queue``."""
    runs: list[tuple[str, list[int]]] = []
    for block_id in new:
        kind = queue.kind_of(block_id)
        if runs and runs[-1][0] == kind:
            runs[-1][1].append(block_id)
        else:
            runs.append((kind, [block_id]))
    words = [f"adopts {_blocks(adopted)}"] if adopted else []
    for kind, ids in runs:
        words.append(
            f"evicts {_blocks(ids)}"
            if kind == "cached"
            else f"takes {kind.replace(' ', '-')} {_blocks(ids)}"
        )
    return ", ".join(words)


def _blocks(block_ids: Sequence[int]) -> str:
    if not block_ids:
        return ""
    noun = "block" if len(block_ids) == 1 else "blocks"
    return f"{noun} {_ids(block_ids)}"


def _ids(ids) -> str:
    return ", ".join(map(str, ids))


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
        annotation_position="bottom left",
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
    bar group per block size. Where swapping never wins up to ``limit`` tokens the bar
    reaches ``limit``, hatched, in a trace of its own so that the legend says so.

    Args:
        crossovers: series name (a transfer cost) -> block size -> the crossover, or None.
        limit: the longest sequence tried.
    """
    fig = go.Figure()
    shades = ("#d4c1e2", SWAP_COLOR, "#6b4a86")
    for (name, by_size), color in zip(crossovers.items(), shades, strict=False):
        wins = {str(s): v for s, v in by_size.items() if v is not None}
        never = [str(s) for s, v in by_size.items() if v is None]
        fig.add_bar(
            x=list(wins),
            y=list(wins.values()),
            name=name,
            marker_color=color,
            offsetgroup=name,  # the hatched bars of this series stand in the same slot
            text=[f"{v:,}" for v in wins.values()],
            textposition="outside",
            cliponaxis=False,
        )
        if never:
            fig.add_bar(
                x=never,
                y=[limit] * len(never),
                name=f"{name}: never up to {limit:,} (hatched)",
                marker=dict(color=color, pattern_shape="/"),
                offsetgroup=name,
                text=[f"never to {limit:,}"] * len(never),
                textposition="outside",
                cliponaxis=False,
            )
    sizes = [str(s) for s in next(iter(crossovers.values()), {})]
    fig.update_layout(
        title="A fixed cost per transfer hurts small blocks: they keep recompute cheaper longer",
        xaxis=dict(title="block size (tokens)", categoryorder="array", categoryarray=sizes),
        yaxis=dict(title="swap cheaper from (tokens held)", range=[0, 1.15 * limit]),
        barmode="group",
        uniformtext=dict(minsize=10, mode="show"),
        height=380,
        margin=dict(t=50, b=90),
        legend=dict(orientation="h", x=0, y=-0.25, yanchor="top"),
    )
    return fig
