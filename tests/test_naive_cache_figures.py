"""Lab 01's figures, built from small inputs: what each draws, and the inputs it refuses."""

from __future__ import annotations

import pytest
from transformers import DynamicCache

from kvlab.measure.naive_hf import DecodeTrace, MemoryBreakdown, NoCacheStep
from kvlab.measure.padded_batch import SLOT_KIND_NAMES, PaddedBatch
from kvlab.memory import MIB
from kvlab.widgets.naive_cache_figures import (
    WITH_CACHE,
    WITHOUT_CACHE,
    cache_growth_figure,
    memory_figure,
    padding_figure,
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


def test_step_time_figure_draws_decode_steps_against_no_cache_steps():
    no_cache = [NoCacheStep(3, 0.5, 4), NoCacheStep(6, 0.8, 7)]
    fig = step_time_figure(trace(), no_cache)
    cached, uncached = fig.data
    assert list(cached.x) == [4, 5, 6]  # the prefill is not a per-token time
    assert list(cached.y) == pytest.approx([50, 60, 50])
    assert (list(uncached.x), list(uncached.y)) == ([3, 6], pytest.approx([500, 800]))
    assert (cached.line.color, uncached.line.color) == (WITH_CACHE, WITHOUT_CACHE)
    assert "flat with a cache" in fig.layout.title.text
    assert fig.layout.xaxis.title.text == "context length (tokens)"
    assert fig.layout.yaxis.title.text == "time per token (ms)"


def test_work_and_time_figure_draws_running_totals_side_by_side():
    fig = work_and_time_figure([3, 4], [3, 7], [1.0, 0.5], [1.0, 2.0])
    assert fig.layout.title.text == "Without a cache: 2x the work, only 2.0x the time"
    work_with, work_without, time_with, time_without = fig.data
    assert (list(work_with.y), list(work_without.y)) == ([3, 4], [3, 7])
    assert (list(time_with.y), list(time_without.y)) == ([1.0, 1.5], [1.0, 3.0])
    assert [trace.showlegend for trace in fig.data] == [True, True, False, False]
    assert [a.text for a in fig.layout.annotations] == ["work", "time", "4", "7", "1.5 s", "3.0 s"]
    assert fig.layout.xaxis.title.text == fig.layout.xaxis2.title.text == "tokens generated"
    assert fig.layout.yaxis.title.text == "token positions computed (total)"
    assert fig.layout.yaxis2.title.text == "seconds (total)"
    with pytest.raises(ValueError, match="one value per generated token"):
        work_and_time_figure([3, 4], [3, 7], [1.0], [1.0, 2.0])


def test_cache_growth_figure_puts_the_measured_bytes_on_the_formula():
    fig = cache_growth_figure(trace(), BYTES_PER_TOKEN)
    measured, formula = fig.data
    assert list(measured.y) == pytest.approx([n * BYTES_PER_TOKEN / MIB for n in (3, 4, 5, 6)])
    assert list(formula.x) == [0, 6]
    assert formula.name == "formula: 1,000 bytes x tokens"
    assert fig.layout.title.text.startswith("The cache grows by 1,000 bytes per token")
    assert fig.layout.yaxis.title.text == "cache size (MiB)"


def test_padding_figure_colours_every_position_by_what_it_holds():
    # Request 0: 1 left pad, 2 prompt, 1 generated, 1 pad after EOS; request 1: 3 prompt, 2 gen.
    batch = PaddedBatch(
        prompt_lens=[2, 3],
        outputs=[[9, 2], [9, 9, 2]],
        cache_shape=(2, 1, 5, 4),
        cache_bytes=10 * BYTES_PER_TOKEN,
        bytes_per_token=BYTES_PER_TOKEN,
    )
    fig = padding_figure(batch)
    [heatmap] = fig.data
    assert [list(row) for row in heatmap.z] == [[0, 1, 1, 2, 3], [1, 1, 1, 2, 2]]
    assert list(heatmap.colorbar.ticktext) == list(SLOT_KIND_NAMES)
    assert fig.layout.title.text.startswith("20% of the batch's cache holds padding")
    assert fig.layout.xaxis.title.text == "position in the cache (tokens)"
    assert fig.layout.yaxis.title.text == "request"


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
    assert fig.layout.yaxis.type == "log"
    assert fig.layout.yaxis.title.text == "memory (MiB, log scale)"
    assert "the KV cache grows" in fig.layout.title.text
