"""Labs 02 and 03's figures, built from small inputs: what each draws, and the inputs it
refuses."""

from __future__ import annotations

from dataclasses import fields

import pytest

from kvlab.measure.experiments import block_size_tradeoff
from kvlab.sim.metrics import SimResult
from kvlab.sim.paper import PUBLISHED_BREAKDOWN
from kvlab.widgets.memory_figures import (
    ALLOCATOR_KINDS,
    CONTIGUOUS_COLOR,
    MEMORY_PARTS,
    NOT_BROKEN_DOWN,
    PAGED_COLOR,
    allocator_kind,
    block_size_figure,
    concurrency_figure,
    where_memory_goes_figure,
)


def sim_result(label: str, token_states: float) -> SimResult:
    """A replay whose memory is token states, then an even split of the rest (every field
    the figures do not read is 0)."""
    rest = (1 - token_states) / 4
    given = dict(
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
    )
    return SimResult(**{f.name: given.get(f.name, 0) for f in fields(SimResult)})


def test_concurrency_figure_colours_contiguous_and_paged_and_hatches_clairvoyant():
    concurrency = {
        "contiguous pow2": 29,
        "contiguous exact": 33,
        "contiguous clairvoyant": 37,
        "paged, block_size 16": 42,
    }
    fig = concurrency_figure(concurrency, title="T")
    contiguous, clairvoyant, paged = fig.data
    assert list(contiguous.x) == ["contiguous pow2", "contiguous exact"]
    assert list(contiguous.y) == [29, 33] and contiguous.marker.color == CONTIGUOUS_COLOR
    assert clairvoyant.marker.color == CONTIGUOUS_COLOR
    assert clairvoyant.marker.pattern.shape == "/" and contiguous.marker.pattern.shape == ""
    assert list(paged.y) == [42] and paged.marker.color == PAGED_COLOR
    # The legend explains each kind and the hatching; the bars keep the order given.
    assert [t.name for t in fig.data] == [legend for legend, _, _ in ALLOCATOR_KINDS.values()]
    assert "hatched" in clairvoyant.name
    assert list(fig.layout.xaxis.categoryarray) == list(concurrency)
    assert fig.layout.title.text == "T"
    assert fig.layout.yaxis.title.text == "requests running at once"
    assert fig.layout.xaxis.title.text == "allocator"


def test_concurrency_figure_names_only_the_kinds_it_draws():
    fig = concurrency_figure({"max_model_len": 4, "exact": 33}, title="lab 02")
    assert len(fig.data) == 1 and list(fig.data[0].x) == ["max_model_len", "exact"]
    assert [allocator_kind(n) for n in ("pow2", "clairvoyant", "paged/16")] == [
        "contiguous",
        "clairvoyant",
        "paged",
    ]


def test_concurrency_figure_refuses_nothing_to_draw():
    with pytest.raises(ValueError, match="concurrency is empty"):
        concurrency_figure({}, title="x")


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
    assert "table" in fig.layout.title.text
    assert "block_size" in fig.layout.legend.title.text  # what the point labels are
    assert fig.layout.xaxis.dtick == 1  # powers of ten only: no minor labels


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


def test_a_step_view_without_its_gauge_draws_the_map_alone():
    from kvlab.cache import PagedKVCache
    from kvlab.widgets import PoolSnapshot, StepView

    cache = PagedKVCache(2, 2, 8, 4, block_size=4, device="cpu", enable_prefix_caching=False)
    snapshots = []
    for label, call in [
        ("allocate_slots(0, 5)", lambda: cache.manager.allocate_slots(0, 5)),
        ("fork(0, 1)", lambda: cache.manager.fork(0, 1)),
    ]:
        call()
        snapshots.append(PoolSnapshot.of(cache, step=len(snapshots), label=label))
    view = StepView(snapshots, title="fork", step=1, gauge=False)
    assert view.gauge not in view.children and view.page_map in view.children
    svg = view.to_svg()
    assert "fork: fork(0, 1)" in svg and "KV pool" not in svg
    assert "fork: fork(0, 1)" in repr(view) and "KV pool" not in repr(view)
    assert view.to_animation().num_frames == 2
