"""Every lab as a reader sees it on GitHub or nbviewer, before installing anything.

Those renderers run no JavaScript: an output stored only as plotly's JSON or a widget view
is an empty box there. This test converts each committed lab to HTML (as nbviewer does)
and fails for every figure or widget output that comes out without a picture. A progress
bar, which is a widget view plus its text, is the one widget allowed to have none.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from nbconvert import HTMLExporter

LABS = sorted((Path(__file__).parent.parent / "labs").glob("*.ipynb"))
LIVE = {"application/vnd.plotly.v1+json", "application/vnd.jupyter.widget-view+json"}
STATIC = {"image/png", "image/svg+xml"}


def live_outputs(notebook) -> list[tuple[int, dict]]:
    """(code cell index, output) of every output a static renderer cannot draw by itself."""
    found = []
    code = [c for c in notebook.cells if c.cell_type == "code"]
    for index, cell in enumerate(code):
        for output in cell.get("outputs", []):
            data = output.get("data", {})
            if not LIVE & set(data):
                continue
            if set(data) - STATIC == set(data) and "it/s" in data.get("text/plain", ""):
                continue  # a progress bar: its text is the picture
            found.append((index, output))
    return found


@pytest.mark.parametrize("path", LABS, ids=[p.stem for p in LABS])
def test_every_figure_and_widget_shows_up_without_a_kernel(path):
    notebook = nbformat.read(path, as_version=4)
    outputs = live_outputs(notebook)
    blank = [i for i, output in outputs if not STATIC & set(output["data"])]
    assert not blank, (
        f"{path.name}: code cells {blank} hold a figure or widget with no PNG or SVG beside "
        "it; re-execute the lab where a browser exists (enable_static_figures needs one)"
    )
    html, _ = HTMLExporter().from_notebook_node(notebook)
    pictures = len(re.findall(r'<img [^>]*src="data:image/(?:png|svg\+xml);base64,', html))
    assert pictures >= len(outputs), (
        f"{path.name}: {len(outputs)} figure and widget outputs, but the HTML shows "
        f"only {pictures} pictures"
    )
