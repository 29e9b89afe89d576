"""Static pictures of the widgets and figures: what GitHub and nbviewer show without a kernel.

The SVGs are checked as documents (well-formed, one cell per block, the legend naming
exactly the states drawn) and against the state they draw; a StepView must rest where it
says and redraw on its slider; a figure's PNG must be a PNG wherever a browser exists.
"""

from __future__ import annotations

import base64
import shutil
import xml.etree.ElementTree as ET

import plotly.graph_objects as go
import plotly.io as pio
import pytest
from test_widgets import FakeCache, free_block, held_block, small_pool

from kvlab.cache.base import CacheUsage
from kvlab.widgets import MemoryGauge, PageMap, PoolSnapshot, StepView
from kvlab.widgets.block_table_diagram import BlockTableDiagram
from kvlab.widgets.static_figures import RENDERER, enable_static_figures, figure_png
from kvlab.widgets.svg import FREE

SVG = "{http://www.w3.org/2000/svg}"


def parse(svg: str) -> ET.Element:
    root = ET.fromstring(svg)  # raises on a malformed document
    assert root.tag == f"{SVG}svg"
    return root


def texts(root: ET.Element) -> list[str]:
    return [t.text for t in root.iter(f"{SVG}text")]


def test_page_map_bundle_carries_an_svg_of_its_state():
    pm = PageMap(FakeCache(small_pool()), title="paged")
    bundle, _ = pm._repr_mimebundle_()
    assert "application/vnd.jupyter.widget-view+json" in bundle
    assert bundle["text/plain"] == repr(pm)
    root = parse(bundle["image/svg+xml"])
    words = texts(root)
    assert words[0] == "paged" and words[-1] == pm.summary
    # seq 1 and seq 2 share block 0: both colours are drawn, in its cell.
    fills = {r.get("fill") for r in root.iter(f"{SVG}rect")}
    assert {pm.colors["1"], pm.colors["2"]} <= fills


def test_legend_names_exactly_the_states_drawn():
    pm = PageMap(FakeCache(small_pool()))
    assert [key for key, _ in pm.legend] == [
        "free",
        "cached",
        "reserved",
        "shared",
        "hashed",
        "seq 1",
        "seq 2",
    ]
    # A pool of full, unshared blocks and plain free ones: no cached, shared, hollow or corner.
    plain = [held_block(0, (0,), 0), held_block(1, (3,), 0), free_block(2)]
    pm.update(FakeCache(plain))
    assert [key for key, _ in pm.legend] == ["free", "seq 0", "seq 3"]
    labels = [label for _, label in pm.legend]
    assert all(label in texts(parse(pm.to_svg())) for label in labels)


def test_legend_lists_at_most_sixteen_seqs():
    blocks = [held_block(i, (i,), 0) for i in range(20)]
    legend = PageMap(FakeCache(blocks)).legend
    assert [k for k, _ in legend if k.startswith("seq ")] == [f"seq {i}" for i in range(16)]
    assert legend[-1] == ["more", "+4 more seqs"]


def test_svg_draws_one_cell_per_block_at_any_size():
    for n in (1, 8, 64, 512, 4096):
        blocks = [free_block(i) for i in range(n)]
        root = parse(PageMap(blocks).to_svg())
        cells = [r for r in root.iter(f"{SVG}rect") if r.get("fill") == FREE]
        assert len(cells) == n + 1  # and the legend's swatch


def test_gauge_svg_draws_the_pool_on_its_own_scale():
    usage = CacheUsage(capacity_bytes=100 * 2**20, reserved_bytes=40 * 2**20, used_bytes=10 * 2**20)
    gauge = MemoryGauge(usage, weight_bytes=900 * 2**20, title="paged")
    root = parse(gauge.to_svg())
    words = texts(root)
    assert "KV used 10.0 MiB (10.0%)" in words  # of the pool, not of all memory
    assert "weights 900.0 MiB (90.0%)" in words  # of all memory
    used = {r.get("height"): r for r in root.iter(f"{SVG}rect") if r.get("fill") == "#2e9e5b"}
    pool_bar, whole_bar = (float(used[height].get("width")) for height in ("22", "10"))
    assert pool_bar == pytest.approx(0.10 * 640, abs=0.1)
    assert whole_bar == pytest.approx(0.01 * 640, abs=0.1)


def snapshots() -> list[PoolSnapshot]:
    """Three steps: seq 0 holds one block, then two (the fullest), then none."""
    steps = [
        [held_block(0, (0,), 0, num_filled=9), free_block(1), free_block(2)],
        [held_block(0, (0,), 0), held_block(1, (0,), 1, num_filled=3), free_block(2)],
        [free_block(0), free_block(1), free_block(2)],
    ]
    return [PoolSnapshot.of(FakeCache(blocks), step) for step, blocks in enumerate(steps)]


def test_step_view_rests_on_the_fullest_step_and_follows_its_slider():
    view = StepView(snapshots(), title="demo", weight_bytes=1000)
    assert view.slider.value == 1 and view.play.max == 2
    assert view.page_map.title == "demo: after step 1 (fullest)"
    assert view.page_map.counts.used == 2
    view.slider.value = 2
    assert view.page_map.title == "demo: after step 2" and view.page_map.counts.used == 0
    assert "demo: after step 2" in texts(parse(view.to_svg()))
    bundle, _ = view._repr_mimebundle_()
    assert bundle["text/plain"].startswith("StepView(demo: after step 2")
    # Drawing the animation's frames leaves the view on the step it showed.
    assert view.slider.value == 2 and view.page_map.title == "demo: after step 2"


@pytest.mark.parametrize("step", [-1, 3, 1.0, True])
def test_step_view_refuses_a_step_outside_the_recording(step):
    with pytest.raises(ValueError, match=rf"step={step!r} is not allowed: use an index 0..2"):
        StepView(snapshots(), step=step)


def test_an_empty_step_view_draws_live_then_loads_a_recording():
    view = StepView([], title="run")
    with pytest.raises(ValueError, match="at least one snapshot"):
        view.load([])
    recorded = snapshots()
    view.show_live(recorded[1], "run: replaying")
    assert view.page_map.title == "run: replaying" and view.slider.max == 0
    view.load(recorded, step=0, title="again")
    assert view.slider.max == len(recorded) - 1 and view.slider.value == 0
    assert view.page_map.title.startswith("again: after step 0")
    view.slider.value = 2
    assert view.page_map.title.startswith("again: after step 2")


def figure() -> go.Figure:
    fig = go.Figure(go.Bar(x=["a", "b"], y=[1, 2]))
    fig.update_layout(width=320, height=200)
    return fig


@pytest.mark.skipif(shutil.which("chromium") is None, reason="no Chrome-family browser here")
def test_figures_carry_a_png_of_their_size():
    png = figure_png(figure())
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = int.from_bytes(png[16:20], "big"), int.from_bytes(png[20:24], "big")
    assert (width, height) == (320, 200)
    default = pio.renderers.default
    try:
        enable_static_figures()
        assert pio.renderers.default == RENDERER
        bundle = pio.renderers[RENDERER].to_mimebundle(figure().to_dict())
    finally:
        pio.renderers.default = default
    assert "application/vnd.plotly.v1+json" in bundle
    assert base64.b64decode(bundle["image/png"])[:8] == png[:8]


# ---- block-table diagram -------------------------------------------------------------


def _paged_cache(num_blocks: int):
    from kvlab.cache.paged import PagedKVCache

    return PagedKVCache(1, 1, 2, num_blocks, block_size=4, device="cpu")


def test_block_table_diagram_draws_every_entry_of_the_caches_tables():
    cache = _paged_cache(8)
    cache.allocate_slots(0, 9)  # 3 blocks, the last with 1 token
    cache.allocate_slots(1, 4)
    cache.allocate_slots(0, 4)  # a 4th block, not next to its 3rd
    diagram = BlockTableDiagram.of(cache, [0, 1], title="two")
    assert diagram.tables == {0: cache.block_table(0), 1: cache.block_table(1)}
    root = parse(diagram.svg())
    lines = list(root.iter(f"{SVG}line"))
    drawn = [ln for ln in lines if ln.get("stroke") != "#ffffff"]  # not the slot ticks
    assert len(drawn) == len(cache.block_table(0)) + len(cache.block_table(1))
    # Each line ends above its physical block: block b's centre is at 120 + 32 b + 14.5.
    ends = sorted(float(ln.get("x2")) for ln in drawn)
    blocks = sorted(cache.block_table(0) + cache.block_table(1))
    assert ends == [120 + 32 * b + 14.5 for b in blocks]
    text = repr(diagram)
    assert f"seq 0 (13 tokens): logical->physical 0->{cache.block_table(0)[0]} (4/4)" in text
    assert "(1/4)" in text  # the 4th block of seq 0 holds 1 token
    assert "not drawn" not in " ".join(texts(root))


def test_block_table_diagram_shows_shared_blocks_and_what_it_leaves_out():
    cache = _paged_cache(40)
    cache.allocate_slots(0, 6)
    cache.fork(0, 1)
    for _ in range(34):  # push seq 0 past the 32 blocks drawn
        cache.allocate_slots(0, 4)
    diagram = BlockTableDiagram.of(cache, [0, 1])
    root = parse(diagram.svg())
    words = " ".join(texts(root))
    # Block 0 (full) stays shared; seq 0's first write copied the partly filled block 1.
    assert "block 0: ref_cnt 2" in words and "block 1: ref_cnt" not in words
    assert "blocks 32-39 not drawn" in words
    assert diagram.holders()[0] == [0, 1]
    assert "shared: block 0 (ref_cnt 2)" in repr(diagram)
    # Entries that point past the drawn pool get no line.
    drawn = [ln for ln in root.iter(f"{SVG}line") if ln.get("stroke") != "#ffffff"]
    entries = sum(b < 32 for t in diagram.tables.values() for b in t)
    assert len(drawn) == entries < sum(len(t) for t in diagram.tables.values())
