"""A picture of block tables: each sequence's logical blocks, and the physical block each
one maps to, as the PagedAttention paper draws them (its Figures 6 and 7).

Lab 03 prints ``block_table [0, 1, 2, 6]``; this draws it. Every sequence gets a row of
logical blocks, each with ``block_size`` slots filled as far as its tokens reach, and a
line from each logical block down to its physical block in the pool. A physical block
held by two sequences gets two lines and its ``ref_cnt``; blocks held by nobody are grey.

    diagram = BlockTableDiagram.of(cache, [0, 1])     # reads a PagedKVCache's public state
    diagram                                          # SVG in a notebook, text elsewhere

Not handled: pools of more than 32 blocks (the physical row stops there and says how many
it left out), live updates (it is a picture of one moment; ``PageMap`` is the live view).
"""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from kvlab.widgets.page_map_state import seq_color
from kvlab.widgets.svg import FREE, svg_document, svg_text

MAX_PHYSICAL = 32
_BLOCK_W, _BLOCK_H, _GAP, _CELL_W, _LABEL_W, _ROW_GAP = 52, 26, 8, 32, 120, 48


@dataclass(frozen=True)
class BlockTableDiagram:
    """Block tables of some sequences at one moment, drawn as SVG.

    Attributes:
        tables: ``seq_id -> block_table`` (physical block ids, in logical order).
        num_tokens: ``seq_id -> tokens the sequence holds``.
        block_size: token slots per block.
        num_blocks: physical blocks in the pool.
        title: a line above the picture ("" for none).
    """

    tables: dict[int, list[int]]
    num_tokens: dict[int, int]
    block_size: int
    num_blocks: int
    title: str = ""

    @classmethod
    def of(cls, cache, seq_ids, title: str = "") -> BlockTableDiagram:
        """The block tables of ``seq_ids`` in ``cache`` (a ``PagedKVCache``) now."""
        seq_ids = list(seq_ids)
        return cls(
            tables={s: list(cache.block_table(s)) for s in seq_ids},
            num_tokens={s: cache.num_tokens(s) for s in seq_ids},
            block_size=cache.block_size,
            num_blocks=cache.num_blocks,
            title=title,
        )

    def holders(self) -> dict[int, list[int]]:
        """``physical block -> seq_ids that hold it``, in the order of ``tables``."""
        held: dict[int, list[int]] = {}
        for seq_id, table in self.tables.items():
            for block in table:
                held.setdefault(block, []).append(seq_id)
        return held

    def filled(self, seq_id: int, logical: int) -> int:
        """Slots of logical block ``logical`` of ``seq_id`` that hold a token."""
        return max(0, min(self.block_size, self.num_tokens[seq_id] - logical * self.block_size))

    def __repr__(self) -> str:
        lines = [self.title] if self.title else []
        for seq_id, table in self.tables.items():
            pairs = ", ".join(
                f"{k}->{block} ({self.filled(seq_id, k)}/{self.block_size})"
                for k, block in enumerate(table)
            )
            lines.append(
                f"seq {seq_id} ({self.num_tokens[seq_id]} tokens): logical->physical {pairs}"
            )
        shared = {b: s for b, s in self.holders().items() if len(s) > 1}
        if shared:
            lines.append(
                "shared: "
                + ", ".join(f"block {b} (ref_cnt {len(s)})" for b, s in sorted(shared.items()))
            )
        return "\n".join(lines)

    def _repr_svg_(self) -> str:
        return self.svg()

    def svg(self) -> str:
        """The picture: the physical pool in the middle, the first sequence's logical
        blocks above it, the second's below (then alternating), one line per table entry."""
        shown = min(self.num_blocks, MAX_PHYSICAL)
        seq_ids = list(self.tables)
        above, below = seq_ids[0::2], seq_ids[1::2]
        longest = max((len(t) for t in self.tables.values()), default=0)
        width = _LABEL_W + max(longest * (_BLOCK_W + _GAP), shown * _CELL_W)
        body, lines, ends = [], [], {}
        y = 4
        if self.title:
            body.append(svg_text(0, 16, self.title, ' font-weight="bold"'))
            y = 28
        for seq_id in reversed(above):
            body += self._logical_row(seq_id, y + 12, ends, label_above=True)
            y += 12 + _BLOCK_H + _ROW_GAP
        pool_y = y
        body.append(svg_text(0, pool_y + 17, "physical blocks"))
        held = self.holders()
        for block in range(shown):
            x = _LABEL_W + block * _CELL_W
            holders = held.get(block, [])
            filled = max((self.filled(s, self.tables[s].index(block)) for s in holders), default=0)
            body += self._block(x, pool_y, _CELL_W - 3, _BLOCK_H, holders, filled)
            body.append(_small(x + (_CELL_W - 3) / 2, pool_y + 17, str(block), halo=True))
            if len(holders) > 1:  # shared: outlined, as in the page map
                body.append(
                    f'<rect x="{x + 1:g}" y="{pool_y + 1}" width="{_CELL_W - 5}" '
                    f'height="{_BLOCK_H - 2}" fill="none" stroke="#111" stroke-width="2"/>'
                )
        y = pool_y + _BLOCK_H + _ROW_GAP
        for seq_id in below:
            body += self._logical_row(seq_id, y, ends, label_above=False)
            y += _BLOCK_H + 12 + _ROW_GAP
        y -= _ROW_GAP - 24  # the last row needs no gap under it, only its labels
        for (seq_id, k), (x1, y1) in ends.items():
            block = self.tables[seq_id][k]
            if block >= shown:
                continue
            x2 = _LABEL_W + block * _CELL_W + (_CELL_W - 3) / 2
            y2 = pool_y if y1 < pool_y else pool_y + _BLOCK_H
            lines.append(
                f'<line x1="{x1:g}" y1="{y1:g}" x2="{x2:g}" y2="{y2:g}" '
                f'stroke="{seq_color(seq_id)}" stroke-width="1.5"/>'
            )
        notes = [f"block {b}: ref_cnt {len(s)}" for b, s in sorted(held.items()) if len(s) > 1]
        if self.num_blocks > shown:
            notes.append(f"blocks {shown}-{self.num_blocks - 1} not drawn")
        if notes:
            body.append(svg_text(0, y, "; ".join(notes)))
            y += 16
        return svg_document(round(width), round(y - 8), lines + body, self.title or "block tables")

    def _logical_row(self, seq_id: int, y: float, ends: dict, label_above: bool) -> list[str]:
        """One sequence's logical blocks at height ``y``; records where each line starts."""
        parts = [svg_text(0, y + 17, f"seq {seq_id} ({self.num_tokens[seq_id]} tokens)")]
        for k in range(len(self.tables[seq_id])):
            x = _LABEL_W + k * (_BLOCK_W + _GAP)
            parts += self._block(x, y, _BLOCK_W, _BLOCK_H, [seq_id], self.filled(seq_id, k))
            label_y = y - 3 if label_above else y + _BLOCK_H + 11
            parts.append(_small(x + _BLOCK_W / 2, label_y, f"logical {k}"))
            ends[(seq_id, k)] = (x + _BLOCK_W / 2, y + _BLOCK_H if label_above else y)
        return parts

    def _block(self, x: float, y: float, w: float, h: int, holders, filled: int) -> list[str]:
        """One block: a frame, its slots filled from the left in the holders' colours."""
        parts = [f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h}" fill="{FREE}"/>']
        if holders and filled:
            band = h / len(holders)
            for k, seq_id in enumerate(holders):
                fill_w = w * filled / self.block_size
                parts.append(
                    f'<rect x="{x:g}" y="{y + k * band:g}" width="{fill_w:g}" height="{band:g}" '
                    f'fill="{seq_color(seq_id)}"/>'
                )
        slot_w = w / self.block_size
        if slot_w >= 2.5:  # slot ticks, where they stay apart
            parts += [
                f'<line x1="{x + i * slot_w:g}" y1="{y:g}" x2="{x + i * slot_w:g}" '
                f'y2="{y + h:g}" stroke="#ffffff" stroke-width="0.5"/>'
                for i in range(1, self.block_size)
            ]
        parts.append(
            f'<rect x="{x:g}" y="{y:g}" width="{w:g}" height="{h}" fill="none" stroke="#444" '
            'stroke-width="1"/>'
        )
        return parts


def _small(x: float, y: float, text: str, halo: bool = False) -> str:
    """A 10 px label centred on ``x``; ``halo`` puts a white patch behind it, so that it
    reads on a coloured block."""
    patch = ""
    if halo:
        w = 6 * len(text) + 4
        patch = (
            f'<rect x="{x - w / 2:g}" y="{y - 9:g}" width="{w}" height="12" rx="2" '
            'fill="#ffffff" fill-opacity="0.85"/>'
        )
    return patch + (
        f'<text x="{x:g}" y="{y:g}" font-family="sans-serif" font-size="10" fill="#222" '
        f'text-anchor="middle">{escape(text)}</text>'
    )
