"""Lab 05's pictures of the decode kernel's grid: which blocks each program reads, and when.

Each program of ``kvlab.kernels.paged_decode_attention`` walks its chunk of one sequence's
context, one block after the other, through the sequence's row of the block table
(``kvlab.measure.kernel_viz.decode_block_reads`` lists the blocks). Two pictures of that:

    block_reads_figure(reads, num_blocks)       programs (rows) against physical blocks
                                                (columns), a cell filled where one reads
    read_walk_animation({"1 split": r1,         the programs walking their blocks step by
                         "3 splits": r3}, n)    step, several grids one above the other:
                                                split-K's programs finish in fewer steps
    read_walk_frames(...)                       the animation's frames, as plotly figures

A sequence keeps its colour from the page maps of labs 02-04 and 06 (``seq_color``).
Not handled: the prefill kernel's grid, and time on a real GPU (a step here is one block
read by every program at once, as if all programs ran side by side).
"""

from __future__ import annotations

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from kvlab.measure.kernel_viz import ProgramReads
from kvlab.widgets.animation import Animation
from kvlab.widgets.page_map_state import seq_color
from kvlab.widgets.static_figures import figure_png

BACKGROUND = "#f4f4f4"  # a block no program of the grid reads
TO_COME = "#d9d9d9"  # a block a program reads at a later step
NOW_OUTLINE = "#000000"  # the block each program reads at this step
ROW_PX = 28  # height of one program's row
# Under the walk's title: what its colours and outlines mean.
WALK_KEY = (
    "grey: not read yet · black outline: read at this step · "
    "sequence colour: read · L0, L1, ...: logical block index"
)


def block_reads_figure(
    reads: list[ProgramReads], num_blocks: int, num_splits: int = 1, title: str | None = None
) -> go.Figure:
    """Programs (rows) against physical blocks (columns); a cell is filled where one reads.

    The colour is the program's sequence and the text ``L<i>`` the logical block index, so
    reading a row in L order follows the program through its context.
    """
    fig = make_subplots(rows=1, cols=1)
    fig.add_trace(_heatmap(reads, num_blocks, num_splits, step=None), row=1, col=1)
    fig.update_layout(
        title=title,
        height=140 + ROW_PX * len(reads),
        margin=dict(l=10, r=10, t=60, b=50),
        plot_bgcolor=BACKGROUND,
    )
    _style_axes(fig, row=1)
    return fig


def read_walk_frames(
    grids: dict[str, tuple[list[ProgramReads], int]], num_blocks: int, title: str
) -> list[go.Figure]:
    """One figure per step of the walk, then one with every block read.

    Args:
        grids: a name for each grid (shown above it) -> (its programs' reads, num_splits).
        num_blocks: physical blocks in the pool (the columns).
        title: the lesson, above every frame.

    At step ``k`` every program reads its ``k``-th block (outlined); the blocks it read
    before are filled with its sequence's colour, those still to come are grey. A key
    under the title (``WALK_KEY``) says so.
    """
    steps = {name: _num_steps(reads) for name, (reads, _) in grids.items()}
    return [
        _walk_figure(grids, num_blocks, title, steps, step)
        for step in [*range(max(steps.values())), None]
    ]


def read_walk_animation(
    grids: dict[str, tuple[list[ProgramReads], int]],
    num_blocks: int,
    title: str,
    seconds: float = 0.7,
) -> Animation | go.Figure:
    """``read_walk_frames`` as an animated PNG, dwelling on the last frame.

    Returns the last frame as a plotly figure instead where no PNG can be made (no
    browser for kaleido), so that a lab still shows every block each program read.
    """
    frames = read_walk_frames(grids, num_blocks, title)
    pngs = [figure_png(frame) for frame in frames]
    if any(png is None for png in pngs):
        return frames[-1]
    hold = {len(pngs) - 1: 3.0}
    text = f"animation: {title}, {len(pngs)} frames"
    return Animation.of_pngs(pngs, seconds=seconds, hold=hold, text=text)


def _walk_figure(grids, num_blocks, title, steps, step) -> go.Figure:
    names = list(grids)
    heights = [len(reads) for reads, _ in grids.values()]
    fig = make_subplots(
        rows=len(names),
        cols=1,
        shared_xaxes=True,
        row_heights=heights,
        vertical_spacing=0.22 / len(names),
        subplot_titles=[_walk_subtitle(name, steps[name], step) for name in names],
    )
    most_splits = max(num_splits for _, num_splits in grids.values())  # labels of one width
    for row, (reads, _) in enumerate(grids.values(), start=1):
        fig.add_trace(_heatmap(reads, num_blocks, most_splits, step), row=row, col=1)
        _style_axes(fig, row=row, last=row == len(names))
        for y, r in enumerate(reads):
            if step is not None and step < len(r.block_ids):
                fig.add_shape(
                    type="rect",
                    x0=r.block_ids[step] - 0.5,
                    x1=r.block_ids[step] + 0.5,
                    y0=y - 0.5,
                    y1=y + 0.5,
                    line=dict(color=NOW_OUTLINE, width=3),
                    row=row,
                    col=1,
                )
    fig.update_layout(
        title=dict(text=title, subtitle=dict(text=WALK_KEY)),
        height=170 + ROW_PX * sum(heights) + 40 * len(names),
        margin=dict(l=10, r=10, t=110, b=50),
        plot_bgcolor=BACKGROUND,
    )
    return fig


def _walk_subtitle(name: str, num_steps: int, step: int | None) -> str:
    if step is None or step >= num_steps:
        return f"{name}: every program done after {num_steps} steps"
    return f"{name}: step {step + 1} of {num_steps}"


def _heatmap(reads: list[ProgramReads], num_blocks: int, num_splits: int, step) -> go.Heatmap:
    """Cells coloured by sequence where read (by ``step``, if given), grey where to come."""
    num_seqs = max(r.seq for r in reads) + 1
    z = [[None] * num_blocks for _ in reads]
    text = [[""] * num_blocks for _ in reads]
    for row, r in enumerate(reads):
        for i, block_id in enumerate(r.block_ids):
            read = step is None or i <= step
            z[row][block_id] = r.seq if read else num_seqs  # the last band: grey
            text[row][block_id] = f"L{r.first_logical + i}"
    return go.Heatmap(
        z=z,
        x=list(range(num_blocks)),
        y=[r.label(num_splits) for r in reads],
        text=text,
        texttemplate="%{text}",
        colorscale=_bands([seq_color(s) for s in range(num_seqs)] + [TO_COME]),
        zmin=-0.5,
        zmax=num_seqs + 0.5,
        showscale=False,
        xgap=2,
        ygap=2,
        hovertemplate="%{y} reads physical block %{x} (its logical block %{text})<extra></extra>",
    )


def _style_axes(fig: go.Figure, row: int, last: bool = True) -> None:
    fig.update_xaxes(
        title="physical block id" if last else None,
        dtick=1,
        showgrid=False,
        zeroline=False,
        row=row,
        col=1,
    )
    fig.update_yaxes(title="program", autorange="reversed", showgrid=False, row=row, col=1)


def _num_steps(reads: list[ProgramReads]) -> int:
    """Steps until the slowest program of a grid has read its last block."""
    return max(len(r.block_ids) for r in reads)


def _bands(colors: list[str]) -> list[list]:
    """A colorscale of flat bands, so that integer z ``i`` gets ``colors[i]``."""
    scale = []
    for i, color in enumerate(colors):
        scale += [[i / len(colors), color], [(i + 1) / len(colors), color]]
    return scale
