"""Each page map speaks its lab's words: a contiguous arena (lab 02) of cells, ranges and
slots, a paged pool (labs 03-06) of blocks, ref_cnt and block_hash.

The tooltip is written by page_map.js; node runs that file's own ``tooltipText`` here on
the state PageMap sends, so the words checked are the words a learner reads. The legend and
the summary come from Python and are checked beside them.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import kvlab.widgets as widgets
from kvlab.cache.base import BlockInfo
from kvlab.widgets import PageMap

PAGE_MAP_JS = Path(widgets.__file__).parent / "page_map.js"
PAGED_WORDS = ("block", "ref_cnt", "cached", "shared", "hash")

pytestmark = pytest.mark.skipif(shutil.which("node") is None, reason="needs node")


def tooltips(pm: PageMap, tmp_path: Path) -> list[str]:
    """page_map.js's tooltip of every cell of ``pm``, run by node."""
    names = ("block_size", "owner", "ref_cnt", "logical_index", "num_filled", "cached")
    state = {name: getattr(pm, name) for name in names + ("shared_seq_ids",)}
    module = tmp_path / "page_map.mjs"
    module.write_text(PAGE_MAP_JS.read_text() + "\nexport { tooltipText };\n")
    script = (
        f"import {{ tooltipText }} from {json.dumps(module.as_uri())};\n"
        f"const s = {json.dumps(state)};\n"
        "console.log(JSON.stringify(s.owner.map((_, i) => tooltipText(s, i))));\n"
    )
    out = subprocess.run(
        ["node", "--input-type=module", "-e", script], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def arena() -> list[BlockInfo]:
    """Seq 1's range ends in cell 1, where seq 2's begins; cell 2 reserved, cell 3 free."""
    return [
        BlockInfo(0, 1, (1,), 0, 16, False),
        BlockInfo(1, 2, (1, 2), 1, 9, False),
        BlockInfo(2, 1, (2,), 1, 0, False),
        BlockInfo(3, 0, (), None, 0, False),
    ]


def test_a_contiguous_arena_speaks_of_ranges_and_slots(tmp_path):
    pm = PageMap(arena())  # no block_size: a contiguous arena's cells
    texts = tooltips(pm, tmp_path)
    assert texts[1] == "cell 1\nthe ranges of seq 1 and seq 2 meet here\n9 slots written"
    assert texts[2] == "cell 2\nin seq 2's range (its cell 1)\nreserved: no slot written yet"
    assert texts[3] == "cell 3\nfree: in no seq's range"
    words = "\n".join([*texts, pm.summary, *(label for _, label in pm.legend)])
    assert [w for w in PAGED_WORDS if w in words] == []


def test_a_paged_pool_speaks_of_blocks_and_ref_cnt(tmp_path):
    pool = [
        BlockInfo(0, 2, (1, 2), 0, 16, True),
        BlockInfo(1, 1, (1,), 1, 5, False),
        BlockInfo(2, 0, (), None, 0, True),
    ]
    texts = tooltips(PageMap(pool, block_size=16), tmp_path)
    assert texts[0].splitlines()[:4] == [
        "block 0",
        "seq_ids 1, 2",
        "logical block 0 (in seq 1)",
        "ref_cnt 2",
    ]
    assert texts[2] == "block 2\nfree, cached: holds a block_hash a prefix hit can reuse"
