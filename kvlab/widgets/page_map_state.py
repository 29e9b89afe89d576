"""A pool's blocks as the page map draws them: checked, counted, coloured, and encoded.

``encode_blocks`` turns one ``BlockInfo`` per block (``kvlab.cache.base``) into the state
``kvlab.widgets.page_map.PageMap`` sends to the browser (``page_map.js``) and that
``kvlab.widgets.svg`` draws: parallel lists indexed by ``block_id`` (holder, ``ref_cnt``,
logical index, tokens filled, cached), so 4,096 blocks stay a few dozen KB, plus:

    colors   seq_id -> colour (``seq_color``: the same id, the same colour, everywhere)
    legend   an entry for exactly the states the map draws, sequences last
    counts   ``BlockCounts``: used, shared, cached and free blocks, slots filled

It checks the blocks first: ids 0..n-1 once each, and no block contradicting itself (a
held block without holders, more tokens than ``block_size``).

Not handled: per-layer or per-head views (a block is one cell for every layer).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kvlab.cache.base import BlockInfo

MAX_LEGEND_SEQS = 16
_LEGEND_LABELS = {
    "free": "free",
    "cached": "free, cached (keeps its block_hash)",
    "reserved": "hollow: reserved, not yet written (solid: tokens written)",
    "shared": "outlined: shared (the number is ref_cnt)",
    "hashed": "white corner: has a block_hash",
}
# A contiguous arena (lab 02) in its own words: ranges of slots, no blocks, sharing or hashes.
_ARENA_LABELS = {
    **_LEGEND_LABELS,
    "reserved": "hollow: in a seq's range, no token written yet",
    "meet": "dashed: two requests' ranges meet in this cell",
}
_FIELDS = ("block_id", "ref_cnt", "seq_ids", "logical_index", "num_filled", "cached")


# Twelve colours chosen for readers with and without a colour-vision deficiency: under
# simulated deuteranopia and protanopia (and in normal vision) every two differ by a CIEDE2000
# of at least 12, and each differs by as much from the colours the page map and the gauge
# give to states (free grey, cached green, the outline's black, the gauge's green, orange and
# slate); tests/test_colours.py checks it. No grey among them: grey means free. Neighbouring
# ids, which usually run together, differ by 30 or more. More than twelve colours that far
# apart do not exist for a dichromat, so id 12 takes id 0's colour again (the tooltip and the
# legend still name each seq).
SEQ_PALETTE = (
    "#004499",
    "#cc6600",
    "#88ccff",
    "#773355",
    "#5577ff",
    "#115500",
    "#44aa99",
    "#5522ff",
    "#227755",
    "#88dd99",
    "#5599bb",
    "#bb1133",
)


def seq_color(seq_id: int) -> str:
    """A colour for ``seq_id`` that never changes between steps or widgets: one of
    ``SEQ_PALETTE``, in turn (ids 12 apart share a colour)."""
    return SEQ_PALETTE[seq_id % len(SEQ_PALETTE)]


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
        if self.block_size is None:
            # A contiguous arena (lab 02) in its own words: cells of slots, reserved by
            # ranges that may meet inside one cell; no blocks, no sharing, no cache.
            return (
                f"{self.num_blocks} cells: {self.used} reserved ({self.shared} where two "
                f"ranges meet), {self.free} free; {self.num_seqs} seqs"
            )
        text = (
            f"{self.num_blocks} blocks: {self.used} used ({self.shared} shared), "
            f"{self.cached} cached, {self.free} free; {self.num_seqs} seqs"
        )
        if self.used:
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
    ``shared`` (ref_cnt > 1), ``meet`` (a contiguous arena's cell where two ranges meet),
    ``hashed`` (held, with a block_hash), ``seq <id>``, ``more``.
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
    if block_size is None:
        # A contiguous arena's cells: two ranges meeting in a cell is not sharing.
        present["meet"] = present.pop("shared")
    labels = _LEGEND_LABELS if block_size is not None else _ARENA_LABELS
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
