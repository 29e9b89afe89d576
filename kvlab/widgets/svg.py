"""Static pictures of the page map and the memory gauge, drawn as SVG in Python.

A widget view is an empty box wherever no kernel runs it: on GitHub, on nbviewer, in
``jupyter nbconvert --to html``. So each widget also puts an SVG of the state it shows into
its output (``_repr_mimebundle_``); JupyterLab prefers the live view, static renderers show
the SVG. The drawing follows the widgets' JavaScript (page_map.js, memory_gauge.js) closely
enough that the two read the same, and it is deterministic: the same state gives the same
text, so nbval can compare it.

    page_map_svg(state)    the grid of blocks, its legend (only the states drawn), the counts
    gauge_svg(state)       the KV pool bar to scale, the whole memory bar under it, the counts

Not handled: tooltips (a static picture has no pointer), fonts other than the browser's
sans-serif; text widths are estimated, so very long titles may run past the edge.
"""

from __future__ import annotations

import re
from html import escape

WIDTH = 640
FONT = 'font-family="sans-serif" font-size="12"'
# The page map's state colours, here once: page_map.py sends them to page_map.js
# (``PAGE_MAP_COLORS``), and tests/test_colours.py checks them under simulated colour-vision
# deficiencies. Where two states collide in colour for some reader, a pattern tells them apart:
# cached cells are hatched, reserved ones hollow (a frame in the seq's colour), shared ones
# outlined in black.
FREE = "#d4d4d4"
CACHED = "#cfe9dc"
CACHED_HATCH = "#5f9e80"
SHARED_OUTLINE = "#111111"
UNKNOWN_SEQ = "#888888"  # a seq without a colour; also the legend's "any seq" swatches
BACKGROUND = "#ffffff"  # the inside of a reserved cell, the hash corner
PAGE_MAP_COLORS = {
    "free": FREE,
    "cached": CACHED,
    "cached_hatch": CACHED_HATCH,
    "outline": SHARED_OUTLINE,
    "unknown_seq": UNKNOWN_SEQ,
    "background": BACKGROUND,
}
_MAX_CELL, _MIN_CELL, _MAX_HEIGHT = 28, 4, 420  # as in page_map.js
_CHAR_PX = 6.2  # the width of one 12 px sans-serif character, on average


def grid_layout(
    num_blocks: int, width: int = WIDTH, max_height: int = _MAX_HEIGHT
) -> tuple[int, int]:
    """(cell size in px, columns): the biggest cells whose grid fits ``max_height`` px at
    ``width``."""
    for cell in range(_MAX_CELL, _MIN_CELL, -1):
        cols = max(1, width // cell)
        if -(-num_blocks // cols) * cell <= max_height:
            return cell, cols
    return _MIN_CELL, max(1, width // _MIN_CELL)


def svg_text(x: float, y: float, text: str, extra: str = "") -> str:
    return f'<text x="{x:g}" y="{y:g}" {FONT}{extra}>{escape(text)}</text>'


def _wrapped(x: float, y: float, text: str, width: int) -> tuple[list[str], float]:
    """``text`` in as many lines as ``width`` needs; returns the parts and the next free y."""
    lines, line = [], ""
    for word in text.split(" "):
        if line and _CHAR_PX * len(line + " " + word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}" if line else word
    lines.append(line)
    return [svg_text(x, y + 16 * k, part) for k, part in enumerate(lines)], y + 16 * len(lines)


def svg_document(width: int, height: int, body: list[str], label: str) -> str:
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        f'viewBox="0 0 {width} {height}" role="img" aria-label="{escape(label)}">'
        f'<rect width="{width}" height="{height}" fill="#ffffff"/>' + "".join(body) + "</svg>"
    )


def _legend(items: list[tuple], y: float, width: int) -> tuple[list[str], float]:
    """``(swatch, label)`` pairs wrapped into rows, where ``swatch(x, y)`` draws a 12 px
    square (or is None); returns the SVG parts and the next free y."""
    parts, x = [], 0.0
    for swatch, label in items:
        item_width = (17 if swatch else 0) + _CHAR_PX * len(label) + 14
        if x > 0 and x + item_width > width:
            x, y = 0.0, y + 18
        if swatch:
            parts.append(swatch(x, y - 10))
            x += 17
        parts.append(svg_text(x, y, label))
        x += item_width - (17 if swatch else 0)
    return parts, y + 20


def _box(fill: str, extra: str = ""):
    """A legend swatch: a 12 px rounded square of ``fill``."""
    return lambda x, y: (
        f'<rect x="{x:g}" y="{y:g}" width="12" height="12" rx="2" fill="{fill}"{extra}/>'
    )


def _reserved_box(x: float, y: float) -> str:
    """Hollow, solid up to a third: a frame in any seq's colour, as ``_cell`` draws one."""
    return (
        f'<rect x="{x:g}" y="{y + 8:g}" width="12" height="4" fill="{UNKNOWN_SEQ}"/>'
        f'<rect x="{x + 1:g}" y="{y + 1:g}" width="10" height="10" fill="none" '
        f'stroke="{UNKNOWN_SEQ}" stroke-width="2"/>'
    )


def _hash_corner_box(x: float, y: float) -> str:
    return _box(UNKNOWN_SEQ)(x, y) + f'<path d="M{x + 12:g} {y:g}h-5l5 5z" fill="{BACKGROUND}"/>'


def frame_px(size: float) -> int:
    """The width of a reserved cell's frame (as in page_map.js): thicker on bigger cells."""
    return 2 if size >= 14 else 1


# ---- page map --------------------------------------------------------------------------


def _cell(state: dict, i: int, x: int, y: int, size: int) -> list[str]:
    owner = state["owner"][i]
    cached = state["cached"][i]
    if owner is None:
        # Hatched at every size: cached and free differ little in colour for some readers.
        fill = "url(#kvlab-hatch)" if cached else FREE
        return [f'<rect x="{x}" y="{y}" width="{size}" height="{size}" fill="{fill}"/>']
    holders = state["shared_seq_ids"].get(str(i), [owner])
    colors = [state["colors"].get(str(s), UNKNOWN_SEQ) for s in holders]
    block_size = state["block_size"]
    filled = state["num_filled"][i]
    frac = min(1.0, filled / block_size) if block_size else (1.0 if filled else 0.0)
    parts = []
    # A shared block shows every holder: one vertical stripe each. A stripe is solid up to
    # its fill level; a reserved one is hollow above it, framed in the holder's colour, so
    # that it differs from a free cell in shape, not only in colour.
    stripe = size / len(colors)
    height = round(size * frac)
    lw = frame_px(size)
    for k, color in enumerate(colors):
        sx = x + k * stripe
        if frac < 1:
            parts.append(
                f'<rect x="{sx + lw / 2:g}" y="{y + lw / 2:g}" width="{stripe - lw:g}" '
                f'height="{size - lw:g}" fill="{BACKGROUND}" stroke="{color}" '
                f'stroke-width="{lw}"/>'
            )
        if height:
            parts.append(
                f'<rect x="{sx:g}" y="{y + size - height}" width="{stripe:g}" height="{height}" '
                f'fill="{color}"/>'
            )
    if cached and size >= 10:
        third = size / 3
        parts.append(
            f'<path d="M{x + size} {y}h{-third:g}l{third:g} {third:g}z" fill="{BACKGROUND}"/>'
        )
    if state["ref_cnt"][i] > 1 and block_size is None:
        # A contiguous arena's cell where two ranges meet: dashed, and no count (no sharing).
        parts.append(
            f'<rect x="{x + 1}" y="{y + 1}" width="{size - 2}" height="{size - 2}" fill="none" '
            f'stroke="{SHARED_OUTLINE}" stroke-width="2" stroke-dasharray="3 2"/>'
        )
    elif state["ref_cnt"][i] > 1:
        lw = 2 if size >= 10 else 1
        parts.append(
            f'<rect x="{x + lw / 2:g}" y="{y + lw / 2:g}" width="{size - lw}" '
            f'height="{size - lw}" fill="none" stroke="{SHARED_OUTLINE}" stroke-width="{lw}"/>'
        )
        if size >= 14:
            parts.append(
                f'<text x="{x + size / 2:g}" y="{y + size / 2 + 4:g}" font-family="sans-serif" '
                f'font-size="{size * 0.55:.0f}" font-weight="bold" text-anchor="middle" '
                f'stroke="{BACKGROUND}" stroke-width="3" paint-order="stroke">'
                f"{state['ref_cnt'][i]}</text>"
            )
    return parts


def _legend_swatch(key: str, colors: dict):
    """The swatch of one legend entry of ``PageMap.legend``."""
    if key.startswith("seq "):
        return _box(colors.get(key.removeprefix("seq "), UNKNOWN_SEQ))
    return {
        "free": _box(FREE),
        "cached": _box("url(#kvlab-hatch)"),
        "reserved": _reserved_box,
        "shared": _box(BACKGROUND, f' stroke="{SHARED_OUTLINE}" stroke-width="2"'),
        "meet": _box(
            BACKGROUND, f' stroke="{SHARED_OUTLINE}" stroke-width="2" stroke-dasharray="3 2"'
        ),
        "hashed": _hash_corner_box,
        "more": None,
    }[key]


def page_map_svg(state: dict, width: int = WIDTH) -> str:
    """An SVG of the page map: title, one cell per block, a legend, the counts.

    Args:
        state: the widget's synced lists (``PageMap.state_for_svg()``): ``title``,
            ``block_size``, ``owner``, ``ref_cnt``, ``num_filled``, ``cached``,
            ``shared_seq_ids``, ``colors``, ``legend``, ``summary``, and ``max_height``
            (optional, 420 by default).
        width: pixels; the cells shrink to keep the grid at most ``max_height`` px tall.
    """
    n = len(state["owner"])
    cell, cols = grid_layout(n, width, state.get("max_height", _MAX_HEIGHT))
    size = cell - 1 if cell >= 8 else cell
    body = [
        '<defs><pattern id="kvlab-hatch" width="4" height="4" patternUnits="userSpaceOnUse" '
        'patternTransform="rotate(45)">'
        f'<rect width="4" height="4" fill="{CACHED}"/>'
        f'<line x1="0" y1="0" x2="0" y2="4" stroke="{CACHED_HATCH}" stroke-width="1.5"/>'
        "</pattern></defs>"
    ]
    y = 4
    if state["title"]:
        body.append(svg_text(0, 16, state["title"], ' font-weight="bold"'))
        y = 24
    for i in range(n):
        body += _cell(state, i, (i % cols) * cell, y + (i // cols) * cell, size)
    y += max(1, -(-n // cols)) * cell + 18
    entries = [(_legend_swatch(key, state["colors"]), label) for key, label in state["legend"]]
    legend, y = _legend(entries, y, width)
    body += legend
    summary, y = _wrapped(0, y, state["summary"], width)
    body += summary
    return svg_document(width, round(y - 4), body, state["title"] or "page map")


# ---- memory gauge ----------------------------------------------------------------------


def _bar(segments: list[dict], x: float, y: float, width: float, height: int) -> list[str]:
    """Stretches to scale, each non-empty one at least 2 px wide (as in memory_gauge.js)."""
    total = sum(s["num_bytes"] for s in segments)
    parts = [f'<rect x="{x}" y="{y}" width="{width}" height="{height}" fill="#eeeeee"/>']
    for s in segments:
        if not s["num_bytes"]:
            continue
        w = max(2.0, width * s["num_bytes"] / total)
        if s.get("hollow"):
            # Reserved but unused: a frame, as a reserved page map cell is drawn.
            lw = min(2.0, w / 2)
            parts.append(
                f'<rect x="{x + lw / 2:.1f}" y="{y + lw / 2:g}" width="{w - lw:.1f}" '
                f'height="{height - lw:g}" fill="none" stroke="{s["color"]}" '
                f'stroke-width="{lw:g}"/>'
            )
        else:
            parts.append(
                f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{height}" fill="{s["color"]}"/>'
            )
        x += w
    return parts


def _segment_box(segment: dict):
    """A gauge legend's swatch: solid, or a frame for a hollow segment."""
    if segment.get("hollow"):
        return lambda x, y: (
            f'<rect x="{x + 1:g}" y="{y + 1:g}" width="10" height="10" rx="1" fill="none" '
            f'stroke="{segment["color"]}" stroke-width="2"/>'
        )
    return _box(segment["color"])


def gauge_svg(state: dict, width: int = WIDTH, kv_only: bool = False) -> str:
    """An SVG of the memory gauge: the KV pool on its own scale, then all memory.

    Args:
        state: ``MemoryGauge.state_for_svg()``: ``title``, ``segments`` (dicts with
            ``name``, ``num_bytes``, ``label``, ``color``, ``share``, ``kv``), ``kv_label``,
            ``kv_share`` (the pool's share of all memory), ``total_label``, ``device``,
            ``summary``.
        kv_only: stop after the KV pool's bar and legend (a frame of an animation, where
            the weights do not change from step to step).
    """
    kv = [s for s in state["segments"] if s["kv"]]
    body = [
        svg_text(
            0,
            16,
            f"{state['title'] + ': ' if state['title'] else ''}{state['kv_label']} KV pool",
            ' font-weight="bold"',
        )
    ]
    body += _bar(kv, 0, 24, width, 22)
    legend, y = _legend(
        [(_segment_box(s), f"{s['name']} {s['label']} ({s['share']:.1%})") for s in kv],
        62,
        width,
    )
    body += legend
    if kv_only:
        return svg_document(width, round(y - 4), body, state["title"] or "memory gauge")
    body.append(svg_text(0, y, f"all memory, {state['total_label']} ({state['device']}):"))
    body += _bar(state["segments"], 0, y + 6, width, 10)
    others = [s for s in state["segments"] if not s["kv"]]
    legend, y = _legend(
        [(_segment_box(s), f"{s['name']} {s['label']} ({s['share']:.1%})") for s in others]
        + [(None, f"and the KV pool ({state['kv_share']:.1%}), split as above")],
        y + 34,
        width,
    )
    body += legend
    summary, y = _wrapped(0, y, state["summary"], width)
    body += summary
    return svg_document(width, round(y - 4), body, state["title"] or "memory gauge")


def stack_svgs(svgs: list[str]) -> str:
    """One SVG of ``svgs`` (as made here) one under the other, 8 px apart."""
    height, parts = 0, []
    for svg in svgs:
        w, h = (int(v) for v in re.search(r'width="(\d+)" height="(\d+)"', svg).groups())
        parts.append(svg.replace("<svg ", f'<svg x="0" y="{height}" ', 1))
        height += h + 8
    width = max(int(re.search(r'width="(\d+)"', s).group(1)) for s in svgs)
    return svg_document(width, max(0, height - 8), parts, "KV pool")


def with_static_copy(bundle, text: str, picture: str | dict):
    """A widget's mime bundle (a dict, or anywidget's ``(data, metadata)``) with ``text`` as
    its plain text and a picture beside the live view, for front ends that cannot run it:
    an SVG document, or ``{mime type: data}`` (an animated PNG)."""
    data, metadata = bundle if isinstance(bundle, tuple) else (bundle, {})
    static = {"image/svg+xml": picture} if isinstance(picture, str) else picture
    return {**data, "text/plain": text, **static}, metadata
