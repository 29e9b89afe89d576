"""Labs 02 and 03's figures of where KV memory goes: requests that fit, block sizes, the
paper's bars.

    concurrency_figure        requests running at once in one KV budget, per allocator:
                              contiguous policies in one colour, paged in another, the
                              clairvoyant policy hatched (the same chart in both labs)
    block_size_figure         empty slots against block-table entries, one curve per workload
    where_memory_goes_figure  the simulator's split of KV memory beside the PagedAttention
                              paper's Figure 2, one stacked bar per allocator and model

The plotly figures are ``go.Figure``s built from what ``kvlab.measure.experiments`` and
``kvlab.sim`` return; the memory parts keep lab 02's colours (token states green, internal
fragmentation orange), and no allocator's bar takes one of them. Not handled: live
updates, other allocators than the four of ``kvlab.sim.paper``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from kvlab.measure.experiments import BlockSizeCost
from kvlab.sim.metrics import SimResult
from kvlab.sim.paper import PUBLISHED_BREAKDOWN

# An allocator's bar: neither colour is one of the memory parts' below.
CONTIGUOUS_COLOR = "#2b5d8c"
PAGED_COLOR = "#7a4f9e"
# (legend, colour, hatching) of each kind of allocator in the concurrency chart
ALLOCATOR_KINDS = {
    "contiguous": (
        "contiguous: one range per request, sized before it starts",
        CONTIGUOUS_COLOR,
        "",
    ),
    "clairvoyant": (
        "hatched: clairvoyant, sized by each answer's true length (no server knows it)",
        CONTIGUOUS_COLOR,
        "/",
    ),
    "paged": ("paged: one block at a time, as a request grows", PAGED_COLOR, ""),
}

# The parts of KV memory, as the paper's Figure 2 splits it: (legend, SimResult attribute,
# colour). The colours are lab 02's and the memory gauge's (used, reserved, free).
MEMORY_PARTS = (
    ("token states", "token_states", "#2e9e5b"),
    ("reservation", "reserved_for_future", "#56B4E9"),
    ("internal fragmentation", "internal_fragmentation", "#f0a73a"),
    ("external fragmentation (paper: and other)", "external_fragmentation", "#d6604d"),
    ("free", "free", "#cfe9dc"),
)
NOT_BROKEN_DOWN = "not broken down in the paper"
PAPER = "paper"


def allocator_kind(name: str) -> str:
    """The kind of allocator ``name`` is: paged (it starts "paged"), clairvoyant (it
    names it) or contiguous (a reservation policy: ``max_model_len``, ``pow2``, ``exact``)."""
    if name.startswith("paged"):
        return "paged"
    return "clairvoyant" if "clairvoyant" in name else "contiguous"


def concurrency_figure(concurrency: Mapping[str, int], title: str) -> go.Figure:
    """Requests running at once, one bar per allocator, in the order given.

    Contiguous policies share one colour and paged allocators another; the clairvoyant
    policy (it knows every true output length, which no server does) is a contiguous bar,
    hatched. The legend names the kinds drawn, and the hatching.

    Args:
        concurrency: allocator name -> requests it ran at once (``max_concurrency``);
            ``allocator_kind`` reads each name.
        title: what to see.
    """
    if not concurrency:
        raise ValueError("concurrency is empty: give at least one allocator's count")
    names = list(concurrency)
    fig = go.Figure()
    for kind, (legend, color, hatch) in ALLOCATOR_KINDS.items():
        mine = [n for n in names if allocator_kind(n) == kind]
        if not mine:
            continue
        counts = [concurrency[n] for n in mine]
        fig.add_bar(
            x=mine,
            y=counts,
            text=counts,
            textposition="outside",
            name=legend,
            marker=dict(color=color, pattern=dict(shape=hatch, fillmode="overlay")),
        )
    fig.update_layout(
        title=title,
        barmode="overlay",  # one bar per name: each as wide as the slot
        xaxis=dict(title="allocator", categoryorder="array", categoryarray=names),
        yaxis=dict(title="requests running at once", range=[0, 1.18 * max(concurrency.values())]),
        height=380,
        margin=dict(t=50, b=40),
        legend=dict(orientation="h", yanchor="bottom", y=0, yref="container", x=0),
    )
    return fig


def block_size_figure(
    tradeoff: Mapping[str, Sequence[BlockSizeCost]],
    num_seqs: Mapping[str, int],
    title: str = "Each doubling of block_size halves the table and about doubles the empty slots",
) -> go.Figure:
    """Empty slots against block-table entries per sequence, one curve per workload.

    Each point is one block size, labelled with it (the legend says so); going left means
    bigger blocks. The x axis is logarithmic, labelled at powers of ten only: each halving
    of ``block_size`` doubles the entries.

    Args:
        tradeoff: workload name -> ``block_size_tradeoff`` of its sequences.
        num_seqs: workload name -> how many sequences it has (entries are per sequence).
        title: what to see.
    """
    if not tradeoff:
        raise ValueError("tradeoff is empty: give at least one workload")
    missing = set(tradeoff) - set(num_seqs)
    if missing:
        raise ValueError(f"num_seqs has no count for {sorted(missing)}")
    entries = [c.table_entries / num_seqs[n] for n, costs in tradeoff.items() for c in costs]
    most_waste = max(100 * c.waste for costs in tradeoff.values() for c in costs)
    fig = go.Figure()
    # Labels go below-left on one curve and above-right on the next, so that close points
    # of two curves never put their labels in one place.
    sides = ("bottom left", "top right")
    for index, (name, costs) in enumerate(tradeoff.items()):
        fig.add_scatter(
            x=[c.table_entries / num_seqs[name] for c in costs],
            y=[100 * c.waste for c in costs],
            text=[str(c.block_size) for c in costs],
            mode="lines+markers+text",
            textposition=sides[index % len(sides)],
            name=name,
            hovertemplate="block_size %{text}: %{x:.1f} entries, %{y:.1f}% empty<extra></extra>",
        )
    fig.update_layout(
        title=title,
        # Room around the points for their labels (the x range is in powers of ten).
        xaxis=dict(
            title="block-table entries per sequence (log scale)",
            type="log",
            range=[math.log10(min(entries)) - 0.2, math.log10(max(entries)) + 0.2],
            dtick=1,  # 1, 10, 100: no minor labels between them
        ),
        yaxis=dict(title="empty slots in held blocks (%)", range=[-8, 1.12 * most_waste + 2]),
        height=420,
        margin=dict(t=50, b=50),
        legend=dict(
            title_text="point labels: block_size (tokens per block)",
            x=0.99,
            xanchor="right",
            y=0.98,
            bgcolor="rgba(255,255,255,0.8)",
        ),
    )
    return fig


def _paper_parts(label: str, published: Mapping[str, tuple]) -> list[float]:
    """The paper's shares of ``label``'s bar in ``MEMORY_PARTS`` order, then the share it
    does not break down; an unnamed last part ("the rest") is what the others leave."""
    paper = list(published[label])
    if paper[3] is None and all(p is not None for p in paper[:3]):
        paper[3] = max(0.0, 1 - sum(paper[:3]))
    known = [p or 0.0 for p in paper]
    return [*known, 0.0, max(0.0, 1 - sum(known))]


def where_memory_goes_figure(
    runs: Mapping[str, Sequence[SimResult]],
    published: Mapping[str, tuple] = PUBLISHED_BREAKDOWN,
    title: str = "Paged keeps nearly all KV memory in token states; contiguous, half at best",
) -> go.Figure:
    """One stacked bar per allocator and model, the paper's own bar beside them.

    Bars are grouped by allocator (``contiguous/`` dropped from its label); within a group,
    one bar per entry of ``runs`` and then the paper's (where ``published`` has one).
    Token states sit at the bottom; everything above is memory that holds no token.

    Args:
        runs: model name -> ``reproduce_seed`` results, the same allocators in each.
        published: allocator label -> the paper's (token states, reservation, internal,
            external and other) shares, None where its figure gives no number.
        title: what to see.
    """
    if not runs:
        raise ValueError("runs is empty: give at least one model's results")
    labels = [r.label for r in next(iter(runs.values()))]
    for model, results in runs.items():
        if [r.label for r in results] != labels:
            raise ValueError(f"{model}'s allocators differ from the first model's: {labels}")
    groups, bars = [], []
    shares: dict[str, list[float]] = {name: [] for name, _, _ in MEMORY_PARTS}
    shares[NOT_BROKEN_DOWN] = []
    for index, label in enumerate(labels):
        # Ours break every part down: nothing in the "not broken down" part.
        columns = [
            (model, [getattr(results[index], attr) for _, attr, _ in MEMORY_PARTS] + [0.0])
            for model, results in runs.items()
        ]
        if label in published:
            columns.append((PAPER, _paper_parts(label, published)))
        for bar, parts in columns:
            groups.append(label.replace("contiguous/", ""))
            bars.append(bar)
            for name, part in zip(shares, parts, strict=True):
                shares[name].append(100 * part)
    fig = go.Figure()
    for name, _, color in MEMORY_PARTS:
        fig.add_bar(x=[groups, bars], y=shares[name], name=name, marker_color=color)
    fig.add_bar(
        x=[groups, bars],
        y=shares[NOT_BROKEN_DOWN],
        name=NOT_BROKEN_DOWN,
        marker=dict(color="#ffffff", line=dict(color="#888888", width=1), pattern_shape="/"),
    )
    fig.update_layout(
        barmode="stack",
        title=title,
        xaxis_title="allocator, and whose run",
        yaxis=dict(title="share of the KV memory (%)", range=[0, 100]),
        height=500,
        margin=dict(t=50, b=150),
        legend=dict(
            orientation="h", traceorder="normal", y=0.0, yanchor="bottom", yref="container", x=0
        ),
    )
    return fig
