"""Lab 03's figures, built from small inputs: what each draws, and the inputs it refuses."""

from __future__ import annotations

import pytest

from kvlab.measure.experiments import block_size_tradeoff
from kvlab.sim.metrics import SimResult
from kvlab.sim.paper import PUBLISHED_BREAKDOWN
from kvlab.widgets.memory_figures import (
    CONTIGUOUS_COLOR,
    MEMORY_PARTS,
    NOT_BROKEN_DOWN,
    PAGED_COLOR,
    block_size_figure,
    concurrency_figure,
    where_memory_goes_figure,
)


def sim_result(label: str, token_states: float) -> SimResult:
    """A replay whose memory is token states, then an even split of the rest."""
    rest = (1 - token_states) / 4
    return SimResult(
        label=label,
        capacity_slots=1000,
        num_requests=10,
        num_steps=5,
        measured_steps=5,
        sim_seconds=1.0,
        utilization=token_states,
        token_states=token_states,
        reserved_for_future=rest,
        internal_fragmentation=rest,
        external_fragmentation=rest,
        free=rest,
        mean_running=2.0,
        peak_running=3,
        fit_at_once=2.0,
        num_preemptions=0,
    )


def test_concurrency_figure_draws_one_bar_per_allocator_paged_in_green():
    fig = concurrency_figure({"contiguous pow2": 29, "paged, block_size 16": 42}, title="T")
    (bar,) = fig.data
    assert list(bar.x) == ["contiguous pow2", "paged, block_size 16"]
    assert list(bar.y) == [29, 42]
    assert list(bar.marker.color) == [CONTIGUOUS_COLOR, PAGED_COLOR]
    assert fig.layout.title.text == "T"
    assert fig.layout.yaxis.title.text == "requests running at once"
    assert fig.layout.xaxis.title.text == "allocator"


def test_concurrency_figure_refuses_nothing_to_draw():
    with pytest.raises(ValueError, match="concurrency is empty"):
        concurrency_figure({})


def test_block_size_figure_draws_one_curve_per_workload_labelled_by_block_size():
    tradeoff = {"short": block_size_tradeoff([5, 20]), "long": block_size_tradeoff([300])}
    fig = block_size_figure(tradeoff, {"short": 2, "long": 1})
    assert [t.name for t in fig.data] == ["short", "long"]
    short = fig.data[0]
    assert list(short.text) == ["1", "2", "4", "8", "16", "32", "64", "128", "256"]
    assert short.x[0] == 12.5  # block_size 1: one entry per token, 25 tokens / 2 sequences
    assert short.y[0] == 0.0  # and nothing empty
    assert short.y[-1] == pytest.approx(100 * (1 - 25 / 512))  # one block of 256 each
    assert fig.layout.xaxis.type == "log"
    assert fig.layout.xaxis.title.text == "block-table entries per sequence (log scale)"
    assert fig.layout.yaxis.title.text == "empty slots in held blocks (%)"
    assert "table entries" in fig.layout.title.text


def test_block_size_figure_needs_a_count_for_every_workload():
    with pytest.raises(ValueError, match="num_seqs has no count for"):
        block_size_figure({"short": block_size_tradeoff([5])}, {})


def test_where_memory_goes_stacks_each_part_and_puts_the_paper_beside_ours():
    labels = list(PUBLISHED_BREAKDOWN)
    runs = {
        "Llama": [sim_result(label, 0.5) for label in labels],
        "OPT": [sim_result(label, 0.6) for label in labels],
    }
    fig = where_memory_goes_figure(runs, title="T")
    names = [t.name for t in fig.data]
    assert names == [name for name, _, _ in MEMORY_PARTS] + [NOT_BROKEN_DOWN]
    token_states = fig.data[0]
    groups, bars = token_states.x
    assert list(bars[:3]) == ["Llama", "OPT", "paper"]
    assert groups[0] == "max_model_len" and groups[-1] == "paged/16"
    assert list(token_states.y[:3]) == pytest.approx([50.0, 60.0, 20.4])
    # Every bar adds up to the whole memory, the paper's included.
    for index in range(len(bars)):
        assert sum(t.y[index] for t in fig.data) == pytest.approx(100.0)
    # vLLM's bar names only its token states: the rest is drawn as not broken down.
    assert fig.data[-1].y[-1] == pytest.approx(100 - 96.3)
    assert fig.layout.barmode == "stack"
    assert fig.layout.yaxis.title.text == "share of the KV memory (%)"
    assert fig.layout.title.text == "T"


def test_where_memory_goes_refuses_models_with_different_allocators():
    runs = {"A": [sim_result("paged/16", 0.9)], "B": [sim_result("paged/32", 0.9)]}
    with pytest.raises(ValueError, match="allocators differ"):
        where_memory_goes_figure(runs)
