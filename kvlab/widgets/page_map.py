"""The page map: every physical block of a KV pool as one cell, colored by the request holding it.

One look shows what the allocator labs are about: a contiguous arena leaves long runs of
reserved-but-empty cells, a paged pool fills blocks one by one, shared prefix blocks carry a
``ref_cnt`` above one, and freed blocks that still hold a ``block_hash`` wait for a
prefix-cache hit.

    cell = one block   color = its first holder's seq_id   grey = free
    light, hatched = free but cached   dark outline + number = shared (ref_cnt > 1)
    pale with a solid bottom part = partly filled (num_filled / block_size)

The widget draws on a single ``<canvas>`` (one widget model, whatever the pool size) and
takes any object with ``block_infos() -> list[BlockInfo]``, or the list itself. Python sends
the blocks as parallel lists of ints, indexed by ``block_id``, so 4,096 blocks stay a few
dozen KB; ``update`` only reassigns the lists, and the browser redraws on change.

Not handled: per-layer or per-head views, animation between steps, a static (no-JavaScript)
rendering; ``to_text()`` gives the counts as text instead.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anywidget
import traitlets as t

from kvlab.cache.base import BlockInfo

_HERE = Path(__file__).parent
_FIELDS = ("block_id", "ref_cnt", "seq_ids", "logical_index", "num_filled", "cached")


def seq_color(seq_id: int) -> str:
    """A color for ``seq_id`` that never changes between steps or widgets.

    Consecutive ids step the hue by the golden angle, so neighbours look different; the
    lightness cycles through three levels so that ids whose hues come close (seq 1 and
    seq 14) still differ. Saturated colors stay apart from the greys of free blocks.
    """
    hue = (seq_id * 137.508) % 360
    lightness = (47, 34, 60)[seq_id % 3]
    return f"hsl({hue:.0f}, 65%, {lightness}%)"


@dataclass(frozen=True)
class BlockCounts:
    """How the pool's blocks split up at one moment.

    Attributes:
        num_blocks: cells in the map.
        used: blocks held by at least one sequence (ref_cnt > 0).
        shared: used blocks held by more than one sequence (ref_cnt > 1).
        cached: free blocks that still carry a ``block_hash``.
        free: free blocks without a hash.
        num_seqs: distinct sequences holding blocks.
        num_filled: tokens written in used blocks.
        block_size: tokens per block, when known.
    """

    num_blocks: int
    used: int
    shared: int
    cached: int
    free: int
    num_seqs: int
    num_filled: int
    block_size: int | None

    def __str__(self) -> str:
        text = (
            f"{self.num_blocks} blocks: {self.used} used ({self.shared} shared), "
            f"{self.cached} cached, {self.free} free; {self.num_seqs} seqs"
        )
        if self.block_size and self.used:
            slots = self.used * self.block_size
            text += f"; {self.num_filled}/{slots} slots filled ({self.num_filled / slots:.0%})"
        return text


def block_infos_of(source) -> list:
    """The block list of a cache (anything with ``block_infos()``), or ``source`` itself."""
    if hasattr(source, "block_infos"):
        return list(source.block_infos())
    if isinstance(source, Iterable) and not isinstance(source, (str, bytes, dict)):
        return list(source)
    raise TypeError(
        f"the page map needs a cache with block_infos() or a list of BlockInfo, "
        f"got {type(source).__name__}"
    )


def encode_blocks(infos: Sequence[BlockInfo], block_size: int | None = None) -> dict:
    """Check ``infos`` and turn them into the parallel lists the browser draws.

    Args:
        infos: one ``BlockInfo`` (or an object with the same attributes) per block; the ids
            must be 0..n-1, each once, in any order.
        block_size: tokens per block; ``num_filled`` may not exceed it.

    Returns:
        A dict of lists indexed by block_id (``owner``, ``ref_cnt``, ``logical_index``,
        ``num_filled``, ``cached``), ``shared_seq_ids`` ({block_id: all holders} for blocks
        with more than one holder), ``colors`` ({seq_id: color}) and ``counts``.

    Raises:
        TypeError: an element lacks a BlockInfo attribute.
        ValueError: ids missing or duplicated, or a block contradicts itself.
    """
    blocks = sorted(infos, key=_block_id_of)
    _check_ids([b.block_id for b in blocks])
    for block in blocks:
        _check_block(block, block_size)
    holders = [tuple(b.seq_ids) for b in blocks]
    seqs = sorted({s for h in holders for s in h})
    counts = BlockCounts(
        num_blocks=len(blocks),
        used=sum(b.ref_cnt > 0 for b in blocks),
        shared=sum(b.ref_cnt > 1 for b in blocks),
        cached=sum(b.ref_cnt == 0 and bool(b.cached) for b in blocks),
        free=sum(b.ref_cnt == 0 and not b.cached for b in blocks),
        num_seqs=len(seqs),
        num_filled=sum(b.num_filled for b in blocks if b.ref_cnt > 0),
        block_size=block_size,
    )
    return {
        # NOTE: None (JSON null) marks a free block; it costs a few bytes more than a
        # sentinel like -1 but cannot be mistaken for a request id.
        "owner": [h[0] if h else None for h in holders],
        "ref_cnt": [b.ref_cnt for b in blocks],
        "logical_index": [b.logical_index for b in blocks],
        "num_filled": [b.num_filled for b in blocks],
        "cached": [int(bool(b.cached)) for b in blocks],
        "shared_seq_ids": {str(i): list(h) for i, h in enumerate(holders) if len(h) > 1},
        "colors": {str(s): seq_color(s) for s in seqs},
        "counts": counts,
    }


def _block_id_of(block) -> int:
    missing = [f for f in _FIELDS if not hasattr(block, f)]
    if missing:
        raise TypeError(
            f"block_infos holds a {type(block).__name__} without {', '.join(missing)}; "
            "pass BlockInfo objects (kvlab.cache.base.BlockInfo)"
        )
    return block.block_id


def _check_ids(ids: list[int]) -> None:
    duplicated = sorted(i for i, n in Counter(ids).items() if n > 1)
    if duplicated:
        raise ValueError(f"block_infos lists these block ids more than once: {duplicated[:20]}")
    missing = sorted(set(range(len(ids))) - set(ids))
    if missing:
        raise ValueError(
            f"block_infos must cover block ids 0..{len(ids) - 1} once each; "
            f"missing {missing[:20]}, out of range {sorted(set(ids) - set(range(len(ids))))[:20]}"
        )


def _check_block(block, block_size: int | None) -> None:
    where = f"block {block.block_id}"
    if block.ref_cnt < 0:
        raise ValueError(f"{where} has ref_cnt {block.ref_cnt} < 0")
    if (block.ref_cnt > 0) != bool(block.seq_ids):
        raise ValueError(
            f"{where} has ref_cnt {block.ref_cnt} but seq_ids {tuple(block.seq_ids)}: "
            "a held block needs its holders, a free one none"
        )
    if block.num_filled < 0 or (block_size is not None and block.num_filled > block_size):
        raise ValueError(f"{where} has num_filled {block.num_filled}, outside 0..{block_size}")


class PageMap(anywidget.AnyWidget):
    """A live map of a KV pool's blocks; call ``update`` after each engine step.

    Example:
        >>> pm = PageMap(cache, title="paged, block_size 16")
        >>> pm                      # shows the map in a notebook cell
        >>> pm.update()             # after each step: re-reads cache.block_infos()
    """

    _esm = _HERE / "page_map.js"
    _css = _HERE / "page_map.css"

    title = t.Unicode("").tag(sync=True)
    block_size = t.Int(None, allow_none=True).tag(sync=True)
    num_blocks = t.Int(0).tag(sync=True)
    # Parallel lists indexed by block_id. No element traits: `update` builds them, and
    # validating 4k elements per list on every step would cost more than building them.
    owner = t.List().tag(sync=True)
    ref_cnt = t.List().tag(sync=True)
    logical_index = t.List().tag(sync=True)
    num_filled = t.List().tag(sync=True)
    cached = t.List().tag(sync=True)
    shared_seq_ids = t.Dict().tag(sync=True)
    colors = t.Dict().tag(sync=True)
    summary = t.Unicode("0 blocks").tag(sync=True)

    def __init__(self, cache=None, title: str = "", block_size: int | None = None, **kwargs):
        super().__init__(title=title, block_size=block_size, **kwargs)
        self._fixed_block_size = block_size
        self._source = None
        self.counts: BlockCounts | None = None
        if cache is not None:
            self.update(cache)

    def update(self, cache_or_block_infos=None) -> None:
        """Redraw from a cache (or a list of BlockInfo); with no argument, from the last cache.

        Only lists that changed are sent to the browser, in one message.
        """
        if cache_or_block_infos is not None:
            source = cache_or_block_infos
            # A cache is re-read on every update; a plain list (or generator) is read once.
            self._source = source if hasattr(source, "block_infos") else block_infos_of(source)
        if self._source is None:
            raise ValueError("PageMap.update() needs a cache or block_infos the first time")
        block_size = self._fixed_block_size or getattr(self._source, "block_size", None)
        encoded = encode_blocks(block_infos_of(self._source), block_size)
        self.counts = encoded.pop("counts")
        with self.hold_sync():
            self.block_size = block_size
            self.num_blocks = self.counts.num_blocks
            for name, value in encoded.items():
                setattr(self, name, value)
            self.summary = str(self.counts)

    def to_text(self) -> str:
        """The title and the block counts: deterministic text for notebooks and tests."""
        return f"{self.title}: {self.summary}" if self.title else self.summary

    def __repr__(self) -> str:
        return f"PageMap({self.to_text()})"
