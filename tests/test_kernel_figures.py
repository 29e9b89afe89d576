"""kvlab.widgets.kernel_figures draws which blocks each decode program reads, and when.

Small block tables, built by hand: what each figure draws is checked cell by cell.
"""

from __future__ import annotations

import io

import plotly.graph_objects as go
import torch
from PIL import Image

from kvlab.measure.kernel_viz import decode_block_reads
from kvlab.widgets import kernel_figures
from kvlab.widgets.animation import Animation
from kvlab.widgets.kernel_figures import (
    NOW_OUTLINE,
    block_reads_figure,
    read_walk_animation,
    read_walk_frames,
)
from kvlab.widgets.page_map_state import seq_color

# Sequence 0 owns blocks 6, 1, 9 (10 tokens), sequence 1 owns 4, 0 (5 tokens).
BLOCK_TABLE = torch.tensor([[6, 1, 9], [4, 0, -1]], dtype=torch.int32)
SEQ_LENS = torch.tensor([10, 5], dtype=torch.int32)
BLOCK_SIZE, NUM_BLOCKS = 4, 10


def reads_of(num_splits: int, tile_n: int = 4):
    return decode_block_reads(
        BLOCK_TABLE, SEQ_LENS, BLOCK_SIZE, num_kv_heads=1, num_splits=num_splits, tile_n=tile_n
    )


def colour_of(heatmap, z: int) -> str:
    """The colour a heatmap's flat-band colorscale gives integer ``z``."""
    position = (z - heatmap.zmin) / (heatmap.zmax - heatmap.zmin)
    return [colour for start, colour in heatmap.colorscale if start <= position][-1]


def outlined_cells(fig) -> list[tuple[str, float]]:
    """(axis, column) of each outlined cell: the blocks read at the frame's step."""
    return [
        (shape.xref, shape.x0 + 0.5)
        for shape in fig.layout.shapes
        if shape.line.color == NOW_OUTLINE
    ]


def test_figure_fills_each_block_read_with_its_sequence_colour_and_logical_index():
    reads = reads_of(num_splits=2)
    fig = block_reads_figure(reads, NUM_BLOCKS, num_splits=2, title="what to see")
    (heatmap,) = fig.data
    assert list(heatmap.y) == [
        "seq 0 · KV head 0 · split 0",
        "seq 0 · KV head 0 · split 1",
        "seq 1 · KV head 0 · split 0",
        "seq 1 · KV head 0 · split 1",
    ]
    z = [list(row) for row in heatmap.z]
    # 4-token tiles and 2 splits: seq 0's 10 tokens are 8 + 2, seq 1's 5 tokens 4 + 1.
    assert [[i for i, cell in enumerate(row) if cell is not None] for row in z] == [
        [1, 6],
        [9],
        [4],
        [0],
    ]
    assert heatmap.text[1][9] == "L2" and heatmap.text[3][0] == "L1"
    assert colour_of(heatmap, z[0][6]) == seq_color(0)
    assert colour_of(heatmap, z[3][0]) == seq_color(1)
    assert fig.layout.title.text == "what to see"
    assert fig.layout.xaxis.title.text == "physical block id"
    assert fig.layout.yaxis.title.text == "program"


def test_walk_has_one_frame_per_step_of_the_slowest_grid_and_a_last_one():
    grids = {"1 split": (reads_of(1), 1), "2 splits": (reads_of(2), 2)}
    frames = read_walk_frames(grids, NUM_BLOCKS, title="the lesson")
    assert len(frames) == 3 + 1  # seq 0 reads 3 blocks alone; then every block read
    assert all(f.layout.title.text == "the lesson" for f in frames)
    subtitles = [a.text for a in frames[2].layout.annotations]
    assert subtitles == ["1 split: step 3 of 3", "2 splits: every program done after 2 steps"]
    assert frames[-1].layout.xaxis2.title.text == "physical block id"
    key = frames[0].layout.title.subtitle.text  # what grey and the outline mean
    assert "grey: not read yet" in key and "black outline: read at this step" in key
    assert all(f.layout.title.subtitle.text == key for f in frames)
    assert {trace.y[0] for trace in frames[0].data} == {"seq 0 · KV head 0 · split 0"}


def test_each_step_outlines_the_block_each_program_reads_then_and_greys_what_is_to_come():
    grids = {"1 split": (reads_of(1), 1), "2 splits": (reads_of(2), 2)}
    frames = read_walk_frames(grids, NUM_BLOCKS, title="t")
    # Step 0: in grid 1 seq 0 reads 6, seq 1 reads 4; in grid 2 split 0s read 6 and 4,
    # seq 0's split 1 reads 9 and seq 1's split 1 reads 0.
    assert sorted(outlined_cells(frames[0])) == [
        ("x", 4),
        ("x", 6),
        ("x2", 0),
        ("x2", 4),
        ("x2", 6),
        ("x2", 9),
    ]
    assert sorted(outlined_cells(frames[2])) == [("x", 9)]
    assert outlined_cells(frames[-1]) == []
    one_split = frames[0].data[0]
    grey = kernel_figures.TO_COME
    assert colour_of(one_split, one_split.z[0][6]) == seq_color(0)  # read now
    assert colour_of(one_split, one_split.z[0][1]) == grey  # seq 0's block L1, to come
    assert colour_of(one_split, one_split.z[1][0]) == grey
    last = frames[-1].data[0]
    assert all(colour_of(last, z) != grey for row in last.z for z in row if z is not None)


def small_png(colour: str) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (20, 10), colour).save(buffer, format="PNG")
    return buffer.getvalue()


def test_animation_plays_every_frame(monkeypatch):
    colours = iter(["red", "green", "blue", "white", "black"])
    monkeypatch.setattr(kernel_figures, "figure_png", lambda fig: small_png(next(colours)))
    grids = {"1 split": (reads_of(1), 1)}
    animation = read_walk_animation(grids, NUM_BLOCKS, title="t")
    assert isinstance(animation, Animation)
    assert animation.num_frames == 4
    assert b"acTL" in animation.png[:4096]


def test_without_a_browser_the_last_frame_is_shown_as_a_figure(monkeypatch):
    monkeypatch.setattr(kernel_figures, "figure_png", lambda fig: None)
    shown = read_walk_animation({"1 split": (reads_of(1), 1)}, NUM_BLOCKS, title="t")
    assert isinstance(shown, go.Figure)
    assert outlined_cells(shown) == []
