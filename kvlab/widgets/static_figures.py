"""A PNG beside every plotly figure, so that a notebook read without a kernel shows it.

GitHub, nbviewer and ``jupyter nbconvert --to html`` draw nothing for an output stored only
as plotly's JSON. ``enable_static_figures()`` registers a plotly renderer that stores both:
the JSON, which JupyterLab draws as the interactive figure, and a PNG, which static readers
show (nbval does not compare PNGs, so the labs stay reproducible). The PNG comes from
kaleido, which drives a headless Chrome-family browser: Debian's ``chromium`` works, and
nothing is downloaded. One browser serves every figure of a kernel (about 2 s to start,
then about 0.1 s a figure).

    enable_static_figures()    fig.show() and a figure as a cell's value now carry a PNG
    figure_png(fig)            the PNG bytes, or None where no browser can make them
    static_figures_status()    why there are no PNGs, or None when there are

Not handled: other formats than PNG; a browser that appears after the first failure (the
kernel must restart); the widgets' pictures (``kvlab.widgets.svg`` draws those, no browser).
"""

from __future__ import annotations

import atexit
import base64

import plotly.io as pio
from plotly.io.base_renderers import MimetypeRenderer

RENDERER = "kvlab"
SIZE = (800, 500)  # a figure's PNG, in px, where its layout sets no size
_state: dict = {"server": False, "missing": None}


def figure_png(fig, width: int | None = None, height: int | None = None) -> bytes | None:
    """A PNG of a plotly figure (or its dict) at its layout's size (``SIZE`` if unset).

    Returns None, and remembers why, when kaleido or a browser is missing: a learner's
    laptop without Chrome still runs every lab, with interactive figures only.
    """
    if _state["missing"] is not None:
        return None
    fig_dict = fig if isinstance(fig, dict) else fig.to_dict()
    layout = fig_dict.get("layout", {})
    opts = {
        "format": "png",
        "width": width or layout.get("width") or SIZE[0],
        "height": height or layout.get("height") or SIZE[1],
        "scale": 1,
    }
    try:
        import kaleido

        if not _state["server"]:
            kaleido.start_sync_server(silence_warnings=True)
            atexit.register(kaleido.stop_sync_server, silence_warnings=True)
            _state["server"] = True
        return kaleido.calc_fig_sync(fig_dict, opts=opts)
    except Exception as error:  # noqa: BLE001 - any failure means: no static copy here
        _state["missing"] = f"{type(error).__name__}: {error}"
        return None


def static_figures_status() -> str | None:
    """Why figures carry no PNG in this kernel (kaleido or a browser missing), else None."""
    return _state["missing"]


class _JsonAndPng(MimetypeRenderer):
    """plotly's JSON for live front ends, plus a PNG for static ones."""

    def to_mimebundle(self, fig_dict):
        bundle = pio.renderers["plotly_mimetype"].to_mimebundle(fig_dict)
        png = figure_png(fig_dict)
        if png is not None:
            bundle["image/png"] = base64.b64encode(png).decode("ascii")
        return bundle


def enable_static_figures() -> None:
    """Make plotly's default renderer store a PNG beside each figure's JSON."""
    pio.renderers[RENDERER] = _JsonAndPng()
    pio.renderers.default = RENDERER
