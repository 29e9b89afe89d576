"""The page map: every physical block of a KV pool as one cell, colored by the request holding it.

One look shows what the allocator labs are about: a contiguous arena leaves long runs of
reserved-but-empty cells, a paged pool fills blocks one by one, shared prefix blocks carry a
``ref_cnt`` above one, and freed blocks that still hold a ``block_hash`` wait for a
prefix-cache hit.

    cell = one block   colour = its holder's seq_id (a shared block: one stripe per holder)
    grey = free   light, hatched = free but cached   dark outline + number = ref_cnt > 1
    pale with a solid bottom part = partly filled (num_filled / block_size)
    white corner = a held block with a block_hash

The widget draws on a single ``<canvas>`` (one widget model, whatever the pool size) and
takes any object with ``block_infos() -> list[BlockInfo]``, or the list itself. Python sends
the blocks as parallel lists of ints, indexed by ``block_id``, so 4,096 blocks stay a few
dozen KB; ``update`` only reassigns the lists, and the browser redraws on change.

Wherever no kernel runs the widget (GitHub, nbviewer, an HTML export), its output shows an
SVG of the same state instead (``to_svg``, drawn by ``kvlab.widgets.svg``) and its text
(``to_text``). ``kvlab.widgets.step_view.StepView`` steps one map through a recorded run.

Not handled: per-layer or per-head views, animation between steps.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import anywidget
import traitlets as t

from kvlab.cache.base import BlockInfo
from kvlab.widgets.svg import page_map_svg, with_static_copy

_HERE = Path(__file__).parent
_SVG_STATE = (
    "title",
    "block_size",
    "owner",
    "ref_cnt",
    "num_filled",
    "cached",
    "shared_seq_ids",
    "colors",
    "legend",
    "summary",
)
MAX_LEGEND_SEQS = 16
_LEGEND_LABELS = {
    "free": "free",
    "cached": "free, cached (keeps its block_hash)",
    "reserved": "pale: reserved, not yet written",
    "shared": "outlined: shared (the number is ref_cnt)",
    "hashed": "white corner: has a block_hash",
}
_FIELDS = ("block_id", "ref_cnt", "seq_ids", "logical_index", "num_filled", "cached")


# Okabe and Ito's palette, which readers with any common colour-vision deficiency can tell
# apart (black is left for the shared-block outline). After seven ids the same hues come
# back darker, then lighter, then darker still.
_PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#56B4E9", "#CC79A7", "#F0E442")
_SHADES = (1.0, 0.62, 1.45, 0.4, 1.8)


def seq_color(seq_id: int) -> str:
    """A colour for ``seq_id`` that never changes between steps or widgets.

    Ids 0-6 take the seven colours of a colour-blind-safe palette in an order where
    neighbours differ in both hue and lightness; later ids repeat the hues in other shades,
    so that 35 ids get 35 different colours.
    """
    base = _PALETTE[seq_id % len(_PALETTE)]
    shade = _SHADES[(seq_id // len(_PALETTE)) % len(_SHADES)]
    rgb = [int(base[i : i + 2], 16) for i in (1, 3, 5)]
    if shade <= 1:
        rgb = [round(c * shade) for c in rgb]
    else:  # towards white
        rgb = [round(c + (255 - c) * (shade - 1) / 1.2) for c in rgb]
    return "#" + "".join(f"{c:02x}" for c in rgb)


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
        # A contiguous arena's cells (no block_size) hold two ranges where they meet.
        shared = "shared" if self.block_size else "split between two ranges"
        text = (
            f"{self.num_blocks} blocks: {self.used} used ({self.shared} {shared}), "
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
        with more than one holder), ``colors`` ({seq_id: color}), ``legend``
        (``legend_entries``) and ``counts``.

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
        "legend": legend_entries(blocks, seqs, block_size),
        "counts": counts,
    }


def legend_entries(blocks: Sequence, seqs: list[int], block_size: int | None) -> list[list[str]]:
    """``[key, label]`` for exactly the states the map draws, sequences last.

    Keys: ``free``, ``cached`` (free with a block_hash), ``reserved`` (held, not full),
    ``shared`` (ref_cnt > 1), ``hashed`` (held, with a block_hash), ``seq <id>``, ``more``.
    """
    held = [b for b in blocks if b.ref_cnt > 0]
    free = [b for b in blocks if b.ref_cnt == 0]
    full = block_size or 1
    present = {
        "free": any(not b.cached for b in free),
        "cached": any(b.cached for b in free),
        "reserved": any(b.num_filled < full for b in held),
        "shared": any(b.ref_cnt > 1 for b in held),
        "hashed": any(b.cached for b in held),
    }
    labels = dict(_LEGEND_LABELS)
    if block_size is None:
        # A contiguous arena's cells: two ranges meeting in a cell is not sharing.
        labels["shared"] = "outlined: a cell where two requests' ranges meet"
    entries = [[key, labels[key]] for key, shown in present.items() if shown]
    entries += [[f"seq {s}", f"seq {s}"] for s in seqs[:MAX_LEGEND_SEQS]]
    if len(seqs) > MAX_LEGEND_SEQS:
        entries.append(["more", f"+{len(seqs) - MAX_LEGEND_SEQS} more seqs"])
    return entries


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
    legend = t.List().tag(sync=True)
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

    def to_svg(self) -> str:
        """A static picture of the map as it is now (``kvlab.widgets.svg``)."""
        return page_map_svg({name: getattr(self, name) for name in _SVG_STATE})

    def _repr_mimebundle_(self, **kwargs):
        # The live view for JupyterLab, an SVG for GitHub, nbviewer and HTML exports.
        return with_static_copy(super()._repr_mimebundle_(**kwargs), repr(self), self.to_svg())

    def __repr__(self) -> str:
        return f"PageMap({self.to_text()})"
