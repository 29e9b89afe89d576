"""Recorded runs as animated PNGs: what GitHub, nbviewer and an HTML export play.

An animation must be a real APNG (an ``acTL`` chunk, more than one frame), its frames must
show different steps in one palette, it must dwell on the step a view rests on, and bad
arguments must be refused by name.
"""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image
from test_static_views import snapshots

from kvlab.widgets import StepView
from kvlab.widgets.animation import MARKER_COLOR, Animation, pick_frames, svg_to_png


def frames(png: bytes) -> list[Image.Image]:
    image = Image.open(io.BytesIO(png))
    out = []
    for k in range(image.n_frames):
        image.seek(k)
        out.append(image.convert("RGB"))
    return out


def is_apng(png: bytes) -> bool:
    """An animated PNG: its acTL chunk comes before the first image data."""
    return png.startswith(b"\x89PNG") and 0 < png.find(b"acTL") < png.find(b"IDAT")


def durations(png: bytes) -> list[int]:
    image = Image.open(io.BytesIO(png))
    out = []
    for k in range(image.n_frames):
        image.seek(k)
        out.append(image.info["duration"])
    return out


def square(color: str, size: int = 20) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (size, size), color).save(buffer, format="PNG")
    return buffer.getvalue()


def test_a_step_view_is_animated_step_by_step_and_dwells_where_it_rests():
    view = StepView(snapshots(), title="demo", weight_bytes=1000)  # rests on step 1
    bundle, _ = view._repr_mimebundle_()
    png = base64.b64decode(bundle["image/png"])
    assert is_apng(png) and "image/svg+xml" not in bundle
    shown = frames(png)
    assert len(shown) == 3 and len({f.size for f in shown}) == 1
    assert list(shown[0].getdata()) != list(shown[1].getdata())
    assert durations(png) == [500, 2500, 1500]


def test_a_view_of_one_step_stays_an_svg():
    view = StepView(snapshots()[:1], title="one")
    bundle, _ = view._repr_mimebundle_()
    assert "image/png" not in bundle and bundle["image/svg+xml"].startswith("<svg")


def test_frames_keep_their_colours_in_the_shared_palette():
    animation = Animation.of_pngs([square("#0072b2"), square("#e69f00", 30)], seconds=0.2)
    first, second = frames(animation.png)
    assert first.size == second.size == (30, 30 + 6)  # the largest frame, and the bar
    assert first.getpixel((5, 5)) == (0, 0x72, 0xB2)
    assert second.getpixel((5, 5)) == (0xE6, 0x9F, 0x00)
    assert first.getpixel((25, 5)) == (255, 255, 255)  # the smaller frame, padded white
    # The progress bar along the bottom fills: half of it in the first of two frames.
    assert first.getpixel((29, 35)) == (255, 255, 255) != second.getpixel((29, 35))


def test_svgs_are_drawn_without_a_browser():
    svg = (
        '<svg xmlns="http://www.w3.org/2000/svg" width="8" height="4">'
        '<rect width="8" height="4" fill="#ff0000"/></svg>'
    )
    image = Image.open(io.BytesIO(svg_to_png(svg))).convert("RGB")
    assert image.size == (8, 4) and image.getpixel((1, 1)) == (255, 0, 0)


def test_a_marker_moves_under_a_still_picture():
    animation = Animation.under_a_still(
        square("#ffffff", 100), [10.0, 90.0], [square("#000000"), square("#000000")]
    )
    first, second = frames(animation.png)
    # The marker's tip sits just under the still picture, at the mark.
    assert first.getpixel((10, 104)) == MARKER_COLOR != second.getpixel((10, 104))
    assert second.getpixel((90, 104)) == MARKER_COLOR


def test_at_most_forty_frames_with_the_first_last_and_kept():
    picked = pick_frames(100, keep=[57])
    assert len(picked) <= 40 and picked == sorted(set(picked))
    assert {0, 57, 99} <= set(picked)
    assert pick_frames(5) == [0, 1, 2, 3, 4]


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: Animation.of_pngs([]), "pngs is empty"),
        (lambda: Animation.of_svgs([]), "svgs is empty"),
        (lambda: Animation.of_pngs([square("red")], hold={3: 1.0}), r"hold=\{3: 1.0\}"),
        (lambda: Animation.of_pngs([square("red")], seconds=0), "every duration must be > 0"),
        (
            lambda: Animation.under_a_still(square("red"), [1.0, 2.0], [square("red")]),
            "2 marks for 1 frames",
        ),
    ],
)
def test_bad_arguments_are_refused_by_name(call, message):
    with pytest.raises(ValueError, match=message):
        call()
