"""The page map: every physical block of a KV pool as one cell, colored by the request holding it.

One look shows what the allocator labs are about: a contiguous arena leaves long runs of
reserved-but-empty cells, a paged pool fills blocks one by one, shared prefix blocks carry a
``ref_cnt`` above one, and freed blocks that still hold a ``block_hash`` wait for a
prefix-cache hit.

    cell = one block   colour = its holder's seq_id (a shared block: one stripe per holder)
    grey = free   light, hatched = free but cached   dark outline + number = ref_cnt > 1
    hollow (a frame in the seq's colour), solid up to num_filled / block_size = reserved,
    partly written   white corner = a held block with a block_hash

Every colour is told apart by more than hue where a reader with a colour-vision deficiency
would confuse it (tests/test_colours.py); the colours live in ``kvlab.widgets.svg``
(``PAGE_MAP_COLORS``) and ``page_map_state.SEQ_PALETTE`` and are sent to the browser.

The widget draws on a single ``<canvas>`` (one widget model, whatever the pool size) and
takes any object with ``block_infos() -> list[BlockInfo]``, or the list itself. Python sends
the blocks as parallel lists of ints, indexed by ``block_id`` (``kvlab.widgets.page_map_state``
encodes them), so 4,096 blocks stay a few dozen KB; ``update`` only reassigns the lists,
and the browser redraws on change.

Wherever no kernel runs the widget (GitHub, nbviewer, an HTML export), its output shows an
SVG of the same state instead (``to_svg``, drawn by ``kvlab.widgets.svg``) and its text
(``to_text``). ``kvlab.widgets.step_view.StepView`` steps one map through a recorded run.

Not handled: per-layer or per-head views, animation between steps.
"""

from __future__ import annotations

from pathlib import Path

import anywidget
import traitlets as t

from kvlab.widgets.page_map_state import BlockCounts, block_infos_of, encode_blocks
from kvlab.widgets.svg import PAGE_MAP_COLORS, page_map_svg, with_static_copy

_HERE = Path(__file__).parent
_SVG_STATE = (
    "max_height",
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
    palette = t.Dict(PAGE_MAP_COLORS).tag(sync=True)
    # The grid's height at most, in px: the cells shrink to fit (a panel sets it lower).
    max_height = t.Int(420).tag(sync=True)  # the state colours, as svg.py draws them

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
