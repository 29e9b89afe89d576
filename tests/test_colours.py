"""Colours every reader can tell apart: the page map's and the memory gauge's, under
simulated deuteranopia and protanopia as well as in normal vision.

Colour vision is simulated as Machado, Oliveira and Fernandes (2009) do, at severity 1.0
(a dichromat): their 3x3 matrix applied to linear RGB. Differences are CIEDE2000 in CIELAB
(D65), checked below against Sharma, Wu and Dalal's (2005) published pairs. Two colours
that a view tells apart by colour alone must differ by at least ``MIN_DIFFERENCE`` in every
vision; states whose colours come closer (reserved against free, cached against free) must
differ in shape instead: a hollow frame, a hatch.

The SVG path (svg.py) and the JavaScript path (page_map.js, memory_gauge.js) paint the same
constants: Python sends them to the browser, and the JavaScript files hold no colour at all.
"""

from __future__ import annotations

import itertools
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

import kvlab.widgets as widgets
from kvlab.cache.base import BlockInfo, CacheUsage
from kvlab.widgets import MemoryGauge, PageMap
from kvlab.widgets.batching_figures import STATE_COLORS, SWEEP_COLORS
from kvlab.widgets.memory_gauge import COLORS, HOLLOW
from kvlab.widgets.page_map_state import SEQ_PALETTE, seq_color
from kvlab.widgets.svg import PAGE_MAP_COLORS, page_map_svg

WIDGET_DIR = Path(widgets.__file__).parent
SVG = "{http://www.w3.org/2000/svg}"
MIN_DIFFERENCE = 11.0  # CIEDE2000; 1 is a just-noticeable difference side by side
VISIONS = ("normal", "deuteranopia", "protanopia")
MACHADO = {  # severity 1.0, applied to linear RGB
    "deuteranopia": (
        (0.367322, 0.860646, -0.227968),
        (0.280085, 0.672501, 0.047413),
        (-0.011820, 0.042940, 0.968881),
    ),
    "protanopia": (
        (0.152286, 1.052583, -0.204868),
        (0.114503, 0.786281, 0.099216),
        (-0.003882, -0.048116, 1.051998),
    ),
}
# The gauge's segments that only a CUDA device shows; they share a bar with the four
# CPU ones but are left out of the check against sequence colours (see the report of
# issue 33).
CUDA_ONLY = ("other tensors", "torch cache", "outside torch", "device free")


def lab(color: str, vision: str = "normal") -> tuple[float, float, float]:
    """CIELAB (D65) of an ``#rrggbb`` colour as a reader with ``vision`` sees it."""
    srgb = [int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in srgb]
    if vision != "normal":
        m = MACHADO[vision]
        lin = [min(1.0, max(0.0, sum(m[r][k] * lin[k] for k in range(3)))) for r in range(3)]
    r, g, b = lin
    xyz = (
        (0.4124564 * r + 0.3575761 * g + 0.1804375 * b) / 0.95047,
        0.2126729 * r + 0.7151522 * g + 0.0721750 * b,
        (0.0193339 * r + 0.1191920 * g + 0.9503041 * b) / 1.08883,
    )
    fx, fy, fz = (t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116 for t in xyz)
    return 116 * fy - 16, 500 * (fx - fy), 200 * (fy - fz)


def ciede2000(lab1, lab2) -> float:
    """The CIEDE2000 colour difference (Sharma, Wu and Dalal 2005, with kL = kC = kH = 1)."""
    (l1, a1, b1), (l2, a2, b2) = lab1, lab2
    c_mean = (math.hypot(a1, b1) + math.hypot(a2, b2)) / 2
    g = 0.5 * (1 - math.sqrt(c_mean**7 / (c_mean**7 + 25**7)))
    a1, a2 = (1 + g) * a1, (1 + g) * a2
    c1, c2 = math.hypot(a1, b1), math.hypot(a2, b2)
    h1 = math.degrees(math.atan2(b1, a1)) % 360 if c1 else 0.0
    h2 = math.degrees(math.atan2(b2, a2)) % 360 if c2 else 0.0
    dh = 0.0 if c1 * c2 == 0 else (h2 - h1 + 180) % 360 - 180
    d_hue = 2 * math.sqrt(c1 * c2) * math.sin(math.radians(dh / 2))
    l_mean, c_mean = (l1 + l2) / 2, (c1 + c2) / 2
    if c1 * c2 == 0:
        h_mean = h1 + h2
    elif abs(h1 - h2) <= 180:
        h_mean = (h1 + h2) / 2
    else:
        h_mean = (h1 + h2 + 360) / 2 if h1 + h2 < 360 else (h1 + h2 - 360) / 2
    t = (
        1
        - 0.17 * math.cos(math.radians(h_mean - 30))
        + 0.24 * math.cos(math.radians(2 * h_mean))
        + 0.32 * math.cos(math.radians(3 * h_mean + 6))
        - 0.20 * math.cos(math.radians(4 * h_mean - 63))
    )
    s_l = 1 + 0.015 * (l_mean - 50) ** 2 / math.sqrt(20 + (l_mean - 50) ** 2)
    s_c, s_h = 1 + 0.045 * c_mean, 1 + 0.015 * c_mean * t
    rotation = (
        -math.sin(math.radians(60 * math.exp(-(((h_mean - 275) / 25) ** 2))))
        * 2
        * math.sqrt(c_mean**7 / (c_mean**7 + 25**7))
    )
    dl, dc, dhh = (l2 - l1) / s_l, (c2 - c1) / s_c, d_hue / s_h
    return math.sqrt(dl**2 + dc**2 + dhh**2 + rotation * dc * dhh)


def difference(a: str, b: str, vision: str) -> float:
    return ciede2000(lab(a, vision), lab(b, vision))


def too_close(colours: dict[str, str], against: dict[str, str] | None = None) -> list[str]:
    """Every pair (within ``colours``, or between it and ``against``) closer than
    ``MIN_DIFFERENCE`` in some vision, worded."""
    pairs = (
        itertools.combinations(colours.items(), 2)
        if against is None
        else itertools.product(colours.items(), against.items())
    )
    return [
        f"{na} {a} ~ {nb} {b}: {difference(a, b, v):.1f} ({v})"
        for (na, a), (nb, b) in pairs
        for v in VISIONS
        if difference(a, b, v) < MIN_DIFFERENCE
    ]


def seq_colours() -> dict[str, str]:
    """Every colour a sequence can get (``seq_color`` cycles through the palette)."""
    return {f"seq {s}": seq_color(s) for s in range(len(SEQ_PALETTE))}


# The states each view tells apart by colour alone. The page map: free cells and the
# outline of a shared block (cached cells are hatched, reserved ones framed around the
# background, and the "any seq" grey only fills legend swatches). The gauge: its four
# segments on a CPU.
MAP_STATES = {k: PAGE_MAP_COLORS[k] for k in ("free", "outline")}
GAUGE_STATES = {k: v for k, v in COLORS.items() if k not in CUDA_ONLY}


# ---- the measure itself -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lab1", "lab2", "expected"),
    [  # Sharma, Wu and Dalal (2005), table 1: pairs 1, 7 and 17
        ((50.0, 2.6772, -79.7751), (50.0, 0.0, -82.7485), 2.0425),
        ((50.0, 0.0, 0.0), (50.0, -1.0, 2.0), 2.3669),
        ((22.7233, 20.0904, -46.6940), (23.0331, 14.9730, -42.5619), 2.0373),
    ],
)
def test_ciede2000_matches_the_published_pairs(lab1, lab2, expected):
    assert ciede2000(lab1, lab2) == pytest.approx(expected, abs=1e-4)


def test_the_simulation_keeps_greys_and_confuses_red_with_green():
    for vision in MACHADO:
        assert difference("#777777", "#777777", vision) == 0
        assert lab("#777777", vision) == pytest.approx(lab("#777777"), abs=0.1)
    # Red and green, far apart in normal vision, come close for a dichromat.
    assert difference("#cc3333", "#669900", "normal") > 40
    assert difference("#cc3333", "#669900", "deuteranopia") < 12


# ---- the colours --------------------------------------------------------------------------


def test_sequence_colours_differ_from_each_other_in_every_vision():
    assert too_close(seq_colours()) == []
    assert len(set(SEQ_PALETTE)) == len(SEQ_PALETTE)


def test_sequence_colours_differ_from_every_state_in_the_same_view():
    """A seq's cell must not read as free, as an outline, as a reserved cell's inside, or
    as one of the gauge's segments beside the map."""
    background = {"background": PAGE_MAP_COLORS["background"]}
    assert too_close(seq_colours(), {**MAP_STATES, **background, **GAUGE_STATES}) == []


def test_states_told_apart_by_colour_differ_in_every_vision():
    assert too_close(MAP_STATES) == []
    assert too_close(GAUGE_STATES) == []


def test_one_meaning_per_colour_in_a_view():
    """The gauge's free KV is the map's free grey, and no other segment takes a map state's
    colour (today's "KV free" was the map's "free, cached" green)."""
    assert COLORS["KV free"] == PAGE_MAP_COLORS["free"]
    others = {k: v for k, v in COLORS.items() if k != "KV free"}
    assert not set(others.values()) & set(PAGE_MAP_COLORS.values())


def test_lab04s_sweep_lines_differ_and_take_no_timeline_states_colour():
    """Lab 04 draws a sweep's loads as lines beside timelines whose colours are states:
    the lines must differ in every vision, and orange must stay prefill."""
    sweeps = {f"sweep {i}": c for i, c in enumerate(SWEEP_COLORS)}
    assert too_close(sweeps) == []
    assert not set(SWEEP_COLORS) & set(STATE_COLORS.values())


# ---- shapes where colours come close ------------------------------------------------------


def cells(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)
    return [r for r in root.iter(f"{SVG}rect") if r.get("width") not in (None, "12")]


def test_reserved_and_cached_cells_differ_from_free_ones_in_shape():
    """A reserved cell is a frame in its seq's colour around the background; a cached one
    is hatched, at every cell size; a free one is a plain grey square."""
    blocks = [
        BlockInfo(0, 1, (2,), 0, 0, False),  # seq 2 reserved, nothing written
        BlockInfo(1, 0, (), None, 0, False),
        BlockInfo(2, 0, (), None, 0, True),
    ]
    svg = PageMap(blocks, block_size=16).to_svg()
    frames = [r for r in cells(svg) if r.get("stroke") == seq_color(2)]
    assert frames and all(r.get("fill") == PAGE_MAP_COLORS["background"] for r in frames)
    fills = [r.get("fill") for r in cells(svg) if r.get("stroke") is None]
    assert PAGE_MAP_COLORS["free"] in fills and "url(#kvlab-hatch)" in fills
    # 4,096 blocks: the smallest cells, still hatched.
    many = [BlockInfo(i, 0, (), None, 0, i == 0) for i in range(4096)]
    assert "url(#kvlab-hatch)" in [r.get("fill") for r in cells(page_map_svg(_state(many)))]


def _state(blocks: list[BlockInfo]) -> dict:
    pm = PageMap(blocks, block_size=16)
    names = ("title", "block_size", "owner", "ref_cnt", "num_filled", "cached")
    rest = ("shared_seq_ids", "colors", "legend", "summary")
    return {name: getattr(pm, name) for name in names + rest}


def test_the_gauge_draws_reserved_kv_hollow():
    usage = CacheUsage(capacity_bytes=100, reserved_bytes=60, used_bytes=20)
    gauge = MemoryGauge(usage)
    hollow = [s["name"] for s in gauge.segments if s["hollow"]]
    assert hollow == ["KV reserved, unused"] == sorted(HOLLOW)
    rects = ET.fromstring(gauge.to_svg()).iter(f"{SVG}rect")
    reserved = COLORS["KV reserved, unused"]
    assert any(r.get("stroke") == reserved and r.get("fill") == "none" for r in rects)


# ---- one source for both paths ------------------------------------------------------------


@pytest.mark.parametrize("name", ["page_map.js", "memory_gauge.js"])
def test_the_javascript_paints_only_colours_python_sends(name):
    text = (WIDGET_DIR / name).read_text()
    literals = re.findall(r"#[0-9a-fA-F]{3,8}\b|rgba?\(|hsla?\(", text)
    assert literals == [], f"{name} writes colours of its own: {literals}"


def test_the_page_map_sends_the_colours_svg_draws():
    assert PageMap([]).palette == PAGE_MAP_COLORS
    js = (WIDGET_DIR / "page_map.js").read_text()
    for key in PAGE_MAP_COLORS:
        assert f"palette.{key}" in js or f"p.{key}" in js, f"page_map.js never paints {key}"
