"""A run that unfolds over steps, as a picture that moves where no kernel runs.

A step slider shows one step at a time, and a notebook saved with its outputs keeps only
the step the slider rested on: on GitHub, on nbviewer, in an HTML export, the story of a
run (an arena filling, blocks scattering, a queue draining) shrinks to one frame. An
animated PNG (APNG) is an ordinary PNG whose extra frames browsers play in a loop, so all
of those show it, and so does JupyterLab, even in a notebook not yet trusted.

    Animation.of_svgs(svgs, seconds=0.5, hold={3: 2.0})   frames drawn as SVG
                                                           (kvlab.widgets.svg), rendered
                                                           by resvg
    Animation.of_pngs(pngs, ...)                           frames that are PNGs already
    Animation.under_a_still(timeline, marks, pngs, ...)    a still picture (a timeline
                                                           drawn by kaleido), a marker
                                                           under it that moves, frames
                                                           below
    animation.png, animation.num_frames                    the file, and its length
    animation                                              shows as the picture

Every frame is put on one canvas (the largest frame's size) in one shared palette, with a
thin bar along the bottom that fills as the run goes on, so a reader sees where the loop
starts. nbval does not compare PNGs: frames may differ between machines (fonts, resvg's
version) without failing a lab.

Not handled: pausing or stepping (the live widget does that); more than ``MAX_FRAMES``
frames (``pick_frames`` chooses which to keep).
"""

from __future__ import annotations

import base64
import io
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

MAX_FRAMES = 40  # about 300-600 KiB for a page map and its gauge
SECONDS = 0.5  # each frame, unless held longer
PROGRESS_PX = 4  # the height of the bar that fills as the run goes on
PROGRESS_COLOR = (120, 120, 120)
MARKER_PX = 12  # the height of the marker under a still picture
MARKER_COLOR = (200, 30, 30)


@dataclass(frozen=True)
class Animation:
    """An animated PNG; a notebook shows it as a picture.

    Attributes:
        png: the APNG's bytes.
        num_frames: how many frames it plays.
        text: what the notebook shows where no picture can be shown.
    """

    png: bytes
    num_frames: int
    text: str = "animation"

    @classmethod
    def of_svgs(
        cls,
        svgs: Sequence[str],
        seconds: float = SECONDS,
        hold: dict[int, float] | None = None,
        text: str = "animation",
    ) -> Animation:
        """An animation of SVG documents, one per frame (see ``of_pngs`` for the rest).

        Raises:
            ValueError: ``svgs`` is empty, or one of them is not an SVG resvg can draw.
        """
        if not svgs:
            raise ValueError("svgs is empty: an animation needs at least one frame")
        return cls.of_pngs([svg_to_png(svg) for svg in svgs], seconds=seconds, hold=hold, text=text)

    @classmethod
    def of_pngs(
        cls,
        pngs: Sequence[bytes],
        seconds: float = SECONDS,
        hold: dict[int, float] | None = None,
        text: str = "animation",
    ) -> Animation:
        """An animation of PNG images, one per frame.

        Args:
            pngs: the frames, in order; sizes may differ (each sits at the top left of
                a canvas as large as the largest).
            seconds: how long each frame shows.
            hold: frame index -> seconds, for frames to dwell on (the step a lab's prose
                is about, the last one).
            text: the plain-text stand-in.

        Raises:
            ValueError: no frames, a duration that is not positive, or a ``hold`` index
                outside the frames.
        """
        if not pngs:
            raise ValueError("pngs is empty: an animation needs at least one frame")
        return cls._of_images([_image(png) for png in pngs], seconds, hold, text)

    @classmethod
    def under_a_still(
        cls,
        still: bytes,
        marks: Sequence[float],
        pngs: Sequence[bytes],
        seconds: float = SECONDS,
        hold: dict[int, float] | None = None,
        text: str = "animation",
    ) -> Animation:
        """A still picture on top (a timeline), frame ``k`` of ``pngs`` under it, and
        between the two a marker at ``marks[k]`` pixels from the left: the moment of the
        still picture that frame ``k`` shows. Only the marker and the frames below it
        change, which keeps the file small.

        Raises:
            ValueError: as ``of_pngs``, or not one mark per frame.
        """
        if len(marks) != len(pngs):
            raise ValueError(f"{len(marks)} marks for {len(pngs)} frames: give one per frame")
        if not pngs:
            raise ValueError("pngs is empty: an animation needs at least one frame")
        from PIL import Image, ImageDraw

        top = _image(still)
        frames = [_image(png) for png in pngs]
        width = max(top.width, *(f.width for f in frames))
        composed = []
        for mark, frame in zip(marks, frames, strict=True):
            canvas = Image.new("RGB", (width, top.height + MARKER_PX + frame.height), "white")
            canvas.paste(top, (0, 0))
            y = top.height
            ImageDraw.Draw(canvas).polygon(
                [(mark, y), (mark - 6, y + MARKER_PX - 1), (mark + 6, y + MARKER_PX - 1)],
                fill=MARKER_COLOR,
            )
            canvas.paste(frame, (0, y + MARKER_PX))
            composed.append(canvas)
        return cls._of_images(composed, seconds, hold, text)

    @classmethod
    def _of_images(cls, images: list, seconds: float, hold: dict | None, text: str) -> Animation:
        hold = dict(hold or {})
        bad = [i for i in hold if not 0 <= i < len(images)]
        if bad:
            raise ValueError(
                f"hold={hold!r} is not allowed: frame indices are 0..{len(images) - 1}"
            )
        durations = [hold.get(i, seconds) for i in range(len(images))]
        if min(durations) <= 0:
            raise ValueError(f"seconds={seconds!r}, hold={hold!r}: every duration must be > 0")
        frames = _on_one_canvas(images)
        buffer = io.BytesIO()
        frames[0].save(
            buffer,
            format="PNG",
            save_all=True,
            append_images=frames[1:],
            duration=[round(1000 * d) for d in durations],
            loop=0,
        )
        return cls(buffer.getvalue(), len(frames), text)

    def static_copy(self) -> dict:
        """``{"image/png": base64 text}``: the picture part of a notebook output."""
        return {"image/png": base64.b64encode(self.png).decode("ascii")}

    def _repr_mimebundle_(self, **kwargs):
        return {**self.static_copy(), "text/plain": self.text}

    def __repr__(self) -> str:
        return self.text


def svg_to_png(svg: str) -> bytes:
    """An SVG document drawn as a PNG, by resvg (no browser needed)."""
    import resvg_py

    return bytes(resvg_py.svg_to_bytes(svg_string=svg))


def pick_frames(num_steps: int, keep: Sequence[int] = (), limit: int = MAX_FRAMES) -> list[int]:
    """At most ``limit`` step indices of ``num_steps``, evenly spread, always with the first,
    the last and those in ``keep`` (the step a view rests on)."""
    if num_steps <= limit:
        return list(range(num_steps))
    must = {0, num_steps - 1, *keep}
    spread = limit - len(must)
    picked = {round(k * (num_steps - 1) / max(1, spread - 1)) for k in range(max(0, spread))}
    return sorted(must | picked)


def _image(png: bytes):
    from PIL import Image

    return Image.open(io.BytesIO(png)).convert("RGB")


def _on_one_canvas(images: list) -> list:
    """The frames on one white canvas each, with the progress bar, in one palette."""
    from PIL import Image, ImageDraw

    width = max(image.width for image in images)
    height = max(image.height for image in images) + PROGRESS_PX + 2
    canvases = []
    for k, image in enumerate(images):
        canvas = Image.new("RGB", (width, height), "white")
        canvas.paste(image, (0, 0))
        if len(images) > 1:
            filled = round(width * (k + 1) / len(images))
            ImageDraw.Draw(canvas).rectangle(
                [0, height - PROGRESS_PX, filled - 1, height - 1], fill=PROGRESS_COLOR
            )
        canvases.append(canvas)
    # One palette for every frame: the 256 colours that cover the most pixels over the
    # whole run (a block's colour, however briefly it shows, outweighs the rarest shades of
    # anti-aliased text). Colours stay the same from frame to frame, and the file is about
    # half the size of full-colour frames.
    counts: Counter = Counter()
    for canvas in canvases:
        for num_pixels, color in canvas.getcolors(width * height):
            counts[color] += num_pixels
    colors = [c for c, _ in counts.most_common(256)]
    palette = Image.new("P", (1, 1))
    palette.putpalette([v for color in colors for v in color] + [255] * 3 * (256 - len(colors)))
    return [c.quantize(palette=palette, dither=Image.Dither.NONE) for c in canvases]
