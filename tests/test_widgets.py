"""Python side of the page map and the memory gauge, driven by small fake caches.

The JavaScript runs only in a browser; these tests pin what it is sent (the synced
traitlets) and the hooks a browser test relies on.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

import kvlab.widgets as widgets
from kvlab.cache.base import BlockInfo, CacheUsage
from kvlab.memory import MIB
from kvlab.widgets import MemoryGauge, PageMap, format_bytes, seq_color
from kvlab.widgets.memory_gauge import CudaMemory, gauge_segments
from kvlab.widgets.page_map import encode_blocks

WIDGET_DIR = Path(widgets.__file__).parent


class FakeCache:
    """A pool of blocks and a usage, set directly by the test."""

    def __init__(self, blocks: list[BlockInfo], block_size: int = 16, bytes_per_slot: int = 1024):
        self.blocks = blocks
        self.block_size = block_size
        self.bytes_per_slot = bytes_per_slot

    def block_infos(self) -> list[BlockInfo]:
        return list(self.blocks)

    def usage(self) -> CacheUsage:
        held = [b for b in self.blocks if b.ref_cnt > 0]
        return CacheUsage(
            capacity_bytes=len(self.blocks) * self.block_size * self.bytes_per_slot,
            reserved_bytes=len(held) * self.block_size * self.bytes_per_slot,
            used_bytes=sum(b.num_filled for b in held) * self.bytes_per_slot,
        )


def free_block(block_id: int, cached: bool = False) -> BlockInfo:
    return BlockInfo(block_id, 0, (), None, 0, cached)


def held_block(block_id, seq_ids, logical_index, num_filled=16, cached=False) -> BlockInfo:
    return BlockInfo(block_id, len(seq_ids), tuple(seq_ids), logical_index, num_filled, cached)


def small_pool() -> list[BlockInfo]:
    """Seqs 1 and 2 share a cached prefix block; seq 1's last block is part full."""
    return [
        held_block(0, (1, 2), 0, cached=True),
        held_block(1, (1,), 1, num_filled=5),
        held_block(2, (2,), 1),
        free_block(3, cached=True),
        *(free_block(i) for i in range(4, 8)),
    ]


def big_pool(num_blocks: int = 4096, num_seqs: int = 64) -> list[BlockInfo]:
    """Every block held: seq s holds blocks s, s + num_seqs, ... (interleaved, as after churn)."""
    return [
        held_block(i, (i % num_seqs,), i // num_seqs, num_filled=1 + i % 16)
        for i in range(num_blocks)
    ]


# --- page map: what gets synced ---------------------------------------------------------


def test_page_map_encodes_owner_ref_cnt_and_flags_per_block():
    pm = PageMap(FakeCache(small_pool()))
    assert pm.num_blocks == 8
    assert pm.block_size == 16  # read from the cache
    assert pm.owner == [1, 1, 2, None, None, None, None, None]
    assert pm.ref_cnt == [2, 1, 1, 0, 0, 0, 0, 0]
    assert pm.logical_index == [0, 1, 1, None, None, None, None, None]
    assert pm.num_filled == [16, 5, 16, 0, 0, 0, 0, 0]
    assert pm.cached == [1, 0, 0, 1, 0, 0, 0, 0]
    assert pm.shared_seq_ids == {"0": [1, 2]}
    assert set(pm.colors) == {"1", "2"}


def test_page_map_counts_and_summary():
    pm = PageMap(FakeCache(small_pool()), title="paged")
    c = pm.counts
    assert (c.num_blocks, c.used, c.shared, c.cached, c.free, c.num_seqs) == (8, 3, 1, 1, 4, 2)
    assert c.used + c.cached + c.free == c.num_blocks
    assert pm.summary == (
        "8 blocks: 3 used (1 shared), 1 cached, 4 free; 2 seqs; 37/48 slots filled (77%)"
    )
    assert pm.to_text() == f"paged: {pm.summary}"
    assert repr(pm) == f"PageMap(paged: {pm.summary})"


def test_page_map_cells_shrink_to_its_max_height_in_the_static_copy_too():
    from kvlab.widgets.svg import grid_layout

    assert grid_layout(512, 640) == (22, 29)  # 18 rows of 22 px: within the default 420
    assert grid_layout(512, 640, max_height=140) == (12, 53)  # 10 rows of 12 px
    pm = PageMap(FakeCache(big_pool(512, 8)))
    tall = pm.to_svg()
    pm.max_height = 140
    short = pm.to_svg()
    assert 'width="21"' in tall and 'width="21"' not in short  # 22 px cells, 1 px gap
    assert 'width="11"' in short


def test_page_map_takes_a_plain_list_in_any_order():
    blocks = small_pool()
    shuffled = random.Random(0).sample(blocks, len(blocks))
    pm = PageMap(shuffled, block_size=16)
    reference = encode_blocks(blocks, 16)
    assert pm.owner == reference["owner"]
    assert pm.num_filled == reference["num_filled"]


def test_block_size_argument_wins_over_the_cache_and_may_be_unknown():
    assert PageMap(FakeCache(small_pool(), block_size=16), block_size=32).block_size == 32
    pm = PageMap(small_pool())
    assert pm.block_size is None
    assert "slots filled" not in pm.summary


def test_a_contiguous_arena_is_drawn_in_lab_02s_words():
    """Cells where two ranges meet are not shared blocks: no block, ref_cnt or cache words."""
    arena = [
        held_block(0, (1,), 0, num_filled=16),
        held_block(1, (1, 2), 1, num_filled=9),  # seq 1's range ends, seq 2's begins
        held_block(2, (2,), 1, num_filled=0),
        free_block(3),
    ]
    pm = PageMap(arena)  # no block_size: an arena's cells
    assert pm.summary == "4 cells: 3 reserved (1 where two ranges meet), 1 free; 2 seqs"
    assert [key for key, _ in pm.legend] == ["free", "reserved", "meet", "seq 1", "seq 2"]
    svg = pm.to_svg()
    for word in ("block", "ref_cnt", "cached", "shared"):
        assert word not in pm.summary and word not in svg
    assert 'stroke-dasharray="3 2"' in svg and ">2</text>" not in svg


def test_seq_colors_are_stable_across_updates_and_distinct():
    cache = FakeCache(small_pool())
    pm = PageMap(cache)
    color_of_2 = pm.colors["2"]
    cache.blocks = [held_block(0, (2,), 0), held_block(1, (3,), 0), free_block(2)]
    pm.update()
    assert pm.colors == {"2": color_of_2, "3": seq_color(3)}
    assert PageMap([held_block(0, (2,), 0)]).colors["2"] == color_of_2
    # Any twelve ids in a row get twelve colours; ids twelve apart share one (a dichromat
    # cannot tell more apart: tests/test_colours.py).
    assert all(len({seq_color(s) for s in range(k, k + 12)}) == 12 for k in range(24))
    assert seq_color(5) == seq_color(17)


def test_update_rereads_the_cache_and_sends_only_what_changed(monkeypatch):
    cache = FakeCache(small_pool())
    pm = PageMap(cache)
    sent = []
    monkeypatch.setattr(pm, "_send", lambda msg, buffers=None: sent.append(msg))
    cache.blocks[1] = held_block(1, (1,), 1, num_filled=6)  # one decode step of seq 1
    pm.update()
    assert pm.num_filled[1] == 6
    assert len(sent) == 1, "one message per update"
    assert set(sent[0]["state"]) <= {"num_filled", "summary"}


def test_four_thousand_blocks_stay_small_on_the_wire():
    pm = PageMap(FakeCache(big_pool(4096)))
    assert pm.num_blocks == 4096
    assert pm.counts.num_seqs == 64
    data = {k: v for k, v in pm.get_state().items() if not k.startswith("_")}
    assert len(json.dumps(data)) < 90_000
    # Everything, the JavaScript and CSS included, as a notebook saves it.
    assert len(json.dumps(pm.get_state())) < 100_000


# --- page map: bad input names the problem ----------------------------------------------


def test_duplicated_block_ids_are_named():
    blocks = small_pool() + [free_block(5), free_block(3)]
    with pytest.raises(ValueError, match=r"more than once: \[3, 5\]"):
        PageMap(blocks)


def test_missing_block_ids_are_named():
    blocks = [b for b in small_pool() if b.block_id != 4]
    with pytest.raises(ValueError, match=r"missing \[4\], out of range \[7\]"):
        PageMap(blocks)


@pytest.mark.parametrize(
    ("block", "message"),
    [
        (BlockInfo(0, 1, (), 0, 3, False), "block 0 has ref_cnt 1 but seq_ids ()"),
        (BlockInfo(0, 0, (4,), None, 0, False), r"block 0 has ref_cnt 0 but seq_ids \(4,\)"),
        (BlockInfo(0, -1, (), None, 0, False), "ref_cnt -1 < 0"),
        (BlockInfo(0, 1, (4,), 0, 17, False), r"num_filled 17, outside 0..16"),
    ],
)
def test_inconsistent_blocks_are_named(block, message):
    with pytest.raises(ValueError, match=message):
        PageMap([block], block_size=16)


def test_wrong_sources_are_named():
    with pytest.raises(TypeError, match="block_infos"):
        PageMap(42)
    with pytest.raises(TypeError, match="dict without block_id"):
        PageMap([{"block_id": 0}])
    with pytest.raises(ValueError, match="needs a cache"):
        PageMap().update()


# --- memory gauge -----------------------------------------------------------------------


def test_gauge_segments_add_up_on_cpu():
    cache = FakeCache(small_pool(), bytes_per_slot=MIB)
    gauge = MemoryGauge(cache, weight_bytes=500 * MIB, title="paged")
    usage = cache.usage()
    sizes = {s["name"]: s["num_bytes"] for s in gauge.segments}
    assert list(sizes) == ["weights", "KV used", "KV reserved, unused", "KV free"]
    assert sizes == {
        "weights": 500 * MIB,
        "KV used": 37 * MIB,
        "KV reserved, unused": 11 * MIB,
        "KV free": 80 * MIB,
    }
    assert sum(sizes.values()) == gauge.total_bytes == 500 * MIB + usage.capacity_bytes
    assert gauge.total_label == "628.0 MiB"
    assert gauge.device == "cpu"
    # One base for every percentage: the KV pool.
    assert gauge.to_text() == (
        "paged: KV pool 128.0 MiB: 37.0 MiB (28.9%) used, 11.0 MiB (8.6%) reserved but "
        "unused, 80.0 MiB (62.5%) free; weights 500.0 MiB"
    )
    shares = {s["name"]: s["share"] for s in gauge.segments}
    assert shares["KV used"] == 37 / 128 and shares["KV free"] == 80 / 128
    assert shares["weights"] == 500 / 628
    assert gauge.kv_share == 128 / 628


def test_gauge_update_follows_the_cache_and_accepts_a_usage():
    cache = FakeCache(small_pool(), bytes_per_slot=MIB)
    gauge = MemoryGauge(cache)
    cache.blocks = [free_block(i) for i in range(8)]
    gauge.update()
    assert [s["num_bytes"] for s in gauge.segments] == [0, 0, 0, 128 * MIB]
    gauge.update(CacheUsage(10, 6, 3), weight_bytes=1)
    assert [s["num_bytes"] for s in gauge.segments] == [1, 3, 3, 4]
    assert MemoryGauge().total_bytes == 0


def test_gauge_on_cuda_adds_up_to_the_device():
    usage = CacheUsage(capacity_bytes=40, reserved_bytes=30, used_bytes=20)
    cuda = CudaMemory(total_bytes=200, free_bytes=50, reserved_bytes=120, allocated_bytes=100)
    segments = gauge_segments(usage, weight_bytes=50, cuda=cuda)
    sizes = {s.name: s.num_bytes for s in segments}
    assert sizes == {
        "weights": 50,
        "KV used": 20,
        "KV reserved, unused": 10,
        "KV free": 10,
        "other tensors": 10,
        "torch cache": 20,
        "outside torch": 30,
        "device free": 50,
    }
    assert sum(sizes.values()) == cuda.total_bytes


def test_gauge_bad_input_is_named():
    with pytest.raises(ValueError, match="used 5, reserved 3"):
        MemoryGauge(CacheUsage(10, 3, 5))
    with pytest.raises(TypeError, match="usage"):
        MemoryGauge(object())
    with pytest.raises(ValueError, match="weight_bytes"):
        MemoryGauge(weight_bytes=-1)


@pytest.mark.parametrize(
    ("num_bytes", "text"),
    [
        (512, "512 B"),
        (3 * 1024, "3.0 KiB"),
        (12 * MIB + MIB // 2, "12.5 MiB"),
        (3 << 29, "1.50 GiB"),
    ],
)
def test_format_bytes(num_bytes, text):
    assert format_bytes(num_bytes) == text


# --- hooks for the browser test ---------------------------------------------------------


def test_front_end_files_carry_the_test_hooks():
    page_map_js = (WIDGET_DIR / "page_map.js").read_text()
    for hook in ('"kvlab-page-map"', "drawnBlocks", '"kvlab-page-map-tooltip"', "export default"):
        assert hook in page_map_js
    gauge_js = (WIDGET_DIR / "memory_gauge.js").read_text()
    for hook in ('"kvlab-memory-gauge"', "drawnSegments", "export default"):
        assert hook in gauge_js
    assert PageMap()._esm == page_map_js
