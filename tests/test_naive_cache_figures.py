"""Lab 01's figures, built from small inputs: what each draws, and the inputs it refuses."""

from __future__ import annotations

import re

import pytest
from transformers import DynamicCache

from kvlab.measure.naive_hf import DecodeTrace, MemoryBreakdown, NoCacheStep
from kvlab.measure.padded_batch import SLOT_KIND_NAMES, PaddedBatch
from kvlab.memory import MIB
from kvlab.widgets.naive_cache_figures import (
    SLOT_KIND_COLORS,
    WITH_CACHE,
    WITHOUT_CACHE,
    cache_writes_animation,
    cache_writes_frames,
    memory_figure,
    padding_animation,
    padding_frames,
    step_time_figure,
    work_and_time_figure,
)

BYTES_PER_TOKEN = 1000


def trace() -> DecodeTrace:
    """A 3-token prompt and 3 decode steps after the prefill."""
    return DecodeTrace(
        token_ids=[1, 2, 3, 4, 5, 6, 7],
        num_prompt_tokens=3,
        step_seconds=[0.5, 0.05, 0.06, 0.05],
        cache_lens=[3, 4, 5, 6],
        cache_bytes=[n * BYTES_PER_TOKEN for n in (3, 4, 5, 6)],
        cache=DynamicCache(),
    )


def test_step_time_figure_draws_decode_steps_against_no_cache_steps_and_their_line():
    no_cache = [NoCacheStep(3, 0.5, 4), NoCacheStep(6, 0.8, 7), NoCacheStep(9, 1.1, 8)]
    fig = step_time_figure(trace(), no_cache)
    cached, uncached, line = fig.data
    assert list(cached.x) == [4, 5, 6]  # the prefill is not a per-token time
    assert list(cached.y) == pytest.approx([50, 60, 50])
    assert (list(uncached.x), list(uncached.y)) == ([3, 6, 9], pytest.approx([500, 800, 1100]))
    assert (list(line.x), list(line.y)) == ([3, 9], pytest.approx([500, 1100]))
    assert line.name == "line through the 3 points: 100.0 ms per token"
    assert (cached.line.color, uncached.marker.color) == (WITH_CACHE, WITHOUT_CACHE)
    assert "flat with a cache" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "context length (tokens)"
    assert fig.layout.yaxis.title.text == "time per token (ms)"
    assert fig.layout.legend.y >= 1  # above the plot: it covers no data


def test_work_and_time_figure_draws_running_totals_side_by_side():
    fig = work_and_time_figure([3, 4], [3, 7], [1.0, 0.5], [1.0, 2.0])
    assert fig.layout.title.text == "Without a cache: 2x the work, only 2.0x the time"
    work_with, work_without, time_with, time_without = fig.data
    assert (list(work_with.y), list(work_without.y)) == ([3, 4], [3, 7])
    assert (list(time_with.y), list(time_without.y)) == ([1.0, 1.5], [1.0, 3.0])
    assert [trace.showlegend for trace in fig.data] == [True, True, False, False]
    assert [a.text for a in fig.layout.annotations] == [
        "work",
        "time",
        "4",
        "7",
        "1.5 s",
        "3.0 s (estimated)",
    ]
    assert fig.layout.xaxis.title.text == fig.layout.xaxis2.title.text == "tokens generated"
    assert fig.layout.yaxis.title.text == "token positions computed (total)"
    assert fig.layout.yaxis2.title.text == "seconds (total)"
    assert fig.layout.legend.y >= 1
    with pytest.raises(ValueError, match="one value per generated token"):
        work_and_time_figure([3, 4], [3, 7], [1.0], [1.0, 2.0])


def test_cache_writes_frames_pile_up_one_new_tensor_per_step():
    frames = cache_writes_frames(trace())
    assert len(frames) == 4  # one per step: few enough to keep them all
    # 3 + 4 + 5 + 6 = 18 tokens written for a 6-token cache.
    assert "Every step rewrites the whole cache" in frames[0]
    assert "(3x)" in frames[0]
    assert "step 2: torch.cat wrote a new tensor of 5 tokens" in frames[2]
    assert "tokens written at this step (1,000 bytes each)" in frames[-1]
    # Two rectangles a row (copied, new), one row per step so far, two legend squares.
    rows = [len(re.findall("<rect ", frame)) - 1 - 2 for frame in frames]  # less the background
    assert rows == [2, 4, 6, 8]


def test_cache_writes_animation_plays_every_frame():
    animation = cache_writes_animation(trace())
    assert animation.num_frames == 4
    assert b"acTL" in animation.png[:4096]


def padded_batch() -> PaddedBatch:
    # Request 0: 1 left pad, 2 prompt, 1 generated, 1 pad after EOS; request 1: 3 prompt, 2 gen.
    return PaddedBatch(
        prompt_lens=[2, 3],
        outputs=[[9, 2], [9, 9, 2]],
        cache_shape=(2, 1, 5, 4),
        cache_bytes=10 * BYTES_PER_TOKEN,
        bytes_per_token=BYTES_PER_TOKEN,
    )


def test_padding_frames_grow_every_row_by_one_position_a_step():
    frames = padding_frames(padded_batch(), labels=["short", "long"])
    assert len(frames) == 3  # the prefill, then a decode step per token of the longest answer
    assert frames[0].count("Padding fills 20% of the batch") == 2  # the title, and aria-label
    assert "after the prefill: every prompt padded on the left to 3 positions" in frames[0]
    assert "after decode step 1: 4 positions per row" in frames[1]
    assert "fed padding: short" in frames[2]
    assert "fed padding" not in frames[1]
    for name in SLOT_KIND_NAMES:
        assert name in frames[0]  # the legend, in every frame
    after_eos = SLOT_KIND_COLORS[SLOT_KIND_NAMES.index("padding after EOS")]
    assert f'fill="{after_eos}"' in frames[2]
    assert frames[1].count(f'fill="{after_eos}"') == 1  # the legend's square only
    with pytest.raises(ValueError, match="1 labels for 2 requests"):
        padding_frames(padded_batch(), labels=["one"])


def test_padding_animation_dwells_on_the_prefill_and_the_end():
    animation = padding_animation(padded_batch())
    assert animation.num_frames == 3
    assert "2 requests over 3 steps" in animation.text


def test_memory_figure_draws_weights_kv_and_activations_per_load():
    rows = [
        MemoryBreakdown(1, 100, 5 * MIB, MIB, MIB // 4),
        MemoryBreakdown(8, 200, 5 * MIB, 16 * MIB, MIB),
    ]
    fig = memory_figure(rows)
    assert [bar.name for bar in fig.data] == [
        "weights",
        "KV cache",
        "activations (one decode step)",
    ]
    assert list(fig.data[0].x) == ["1 x 100", "8 x 200"]
    assert list(fig.data[1].y) == [1, 16]
    assert list(fig.data[1].text) == ["1.0 MiB", "16.0 MiB"]  # the value on every bar
    assert fig.layout.yaxis.type == "log"
    assert fig.layout.yaxis.title.text == "memory (MiB, log scale)"
    assert "the KV cache grows" in fig.layout.title.text
