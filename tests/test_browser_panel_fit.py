"""The batching panel on a 1366x768 laptop: it fits, its tabs draw, quick moves cost one
replay, a refused replay greys out what it left on screen.

A 1366x768 laptop shows about 537 px of notebook (the browser's and JupyterLab's bars take
the rest), so the panel, scrolled to the top of the view, must end within 537 px, with a
pool of 64 blocks and with one of 512, whose map's cells shrink to keep it as short. Measured in
Chromium at 1366x768 in JupyterLab with its default layout (file browser open). The same
skips as ``test_browser.py``; screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from browser import CHROMIUM, CHROMIUM_ARGS, LabServer, missing_browser, run_all_cells, screenshot

LAPTOP = {"width": 1366, "height": 768}
LAPTOP_NOTEBOOK_PX = 537  # the notebook area a 1366x768 laptop shows (issue 33)
PANEL = ".kvlab-batching-panel"
GAUGE = '[data-testid="kvlab-memory-gauge"]'
MAP = '[data-testid="kvlab-page-map"]'
NOTEBOOK = "batching_panel_fit.ipynb"
CELLS = (
    "import torch\ntorch.set_num_threads(1)\nfrom kvlab.widgets import BatchingPanel",
    "panel = BatchingPanel()\npanel",
    "large = BatchingPanel(num_blocks=512, compare=False)\nlarge",
)


def notebook() -> str:
    cells = [
        {"cell_type": "code", "metadata": {}, "source": s, "outputs": [], "execution_count": None}
        for s in CELLS
    ]
    kernel = {"name": "python3", "display_name": "Python 3", "language": "python"}
    return json.dumps({"cells": cells, "metadata": {"kernelspec": kernel}, "nbformat": 4,
                       "nbformat_minor": 5})  # fmt: skip


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    reason = missing_browser()
    if reason:
        if os.environ.get("KVLAB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser tests are required here (KVLAB_REQUIRE_BROWSER=1): {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    workdir = tmp_path_factory.mktemp("labs")
    server = LabServer(workdir)
    (workdir / NOTEBOOK).write_text(notebook())
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport=LAPTOP)
            page.errors = []
            page.on("pageerror", lambda error: page.errors.append(str(error)))
            run_all_cells(page, server, NOTEBOOK)
            page.wait_for_function(
                f"""() => {{
                    const panels = [...document.querySelectorAll('{PANEL}')];
                    return panels.length === 2 && panels.every(
                        p => p.querySelector('.kvlab-batching-plot .js-plotly-plot'));
                }}""",
                timeout=60_000,
            )
            yield page
            browser.close()
    finally:
        server.close()


def at_top(page, index: int):
    """Panel ``index`` scrolled to the top of the notebook's view, drawn; its locator."""
    panel = page.locator(PANEL).nth(index)
    panel.evaluate("el => el.scrollIntoView({block: 'start'})")
    page.wait_for_function(
        "el => el.querySelector('[data-testid=\"kvlab-page-map\"][data-drawn-blocks]')",
        arg=panel.element_handle(),
    )
    page.wait_for_timeout(500)  # the scroll settles and the map redraws at its width
    return panel


def box(locator) -> dict:
    return locator.first.bounding_box()


def test_the_panel_fits_a_laptop_view_with_its_gauge(page):
    panel = at_top(page, 0)
    top = box(panel)["y"]
    height = box(panel)["height"]
    gauge = box(panel.locator(GAUGE))
    screenshot(page, "panel_fit_1366x768.png")
    print(f"panel height {height:.0f} px; gauge ends {gauge['y'] + gauge['height'] - top:.0f} px")
    assert height <= LAPTOP_NOTEBOOK_PX, f"the panel is {height:.0f} px tall"
    assert gauge["y"] + gauge["height"] - top <= LAPTOP_NOTEBOOK_PX, (top, gauge)
    # Side by side: the plots beside the pool, not under it.
    plot = box(panel.locator(".kvlab-batching-plot"))
    assert plot["y"] < gauge["y"] + gauge["height"], (plot, gauge)
    assert not page.errors, page.errors


def test_a_large_pool_keeps_its_gauge_in_view(page):
    panel = at_top(page, 1)
    top = box(panel)["y"]
    gauge = box(panel.locator(GAUGE))
    canvas = panel.locator(MAP).first
    assert canvas.get_attribute("data-drawn-blocks") == "512"
    screenshot(page, "panel_fit_512_blocks.png")
    print(f"512 blocks: panel {box(panel)['height']:.0f} px, map {box(canvas)['height']:.0f} px")
    assert gauge["y"] + gauge["height"] - top <= LAPTOP_NOTEBOOK_PX, (top, gauge)
    assert box(panel)["height"] <= LAPTOP_NOTEBOOK_PX, box(panel)


def test_the_policies_tab_draws_its_plot(page):
    panel = at_top(page, 0)
    panel.locator(".lm-TabBar-tab", has_text="the three policies").first.click()
    plot = panel.locator(".kvlab-batching-comparison .js-plotly-plot").first
    plot.wait_for(state="visible")
    # A plot drawn while its tab was hidden must still take the tab's width when shown.
    assert box(plot)["width"] > 300, box(plot)
    assert box(panel)["height"] <= LAPTOP_NOTEBOOK_PX, box(panel)
    screenshot(page, "panel_fit_policies_tab.png", panel)
    panel.locator(".lm-TabBar-tab", has_text="timeline").first.click()


def kernel_says(page, code: str) -> str:
    """What ``code`` prints when run in the notebook's kernel (no cell is added)."""
    return page.evaluate(
        """(code) => new Promise((resolve) => {
            const kernel = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel;
            const future = kernel.requestExecute({code, silent: false, store_history: false});
            let text = '';
            future.onIOPub = (msg) => {
                if (msg.header.msg_type === 'stream') text += msg.content.text;
            };
            future.done.then(() => resolve(text));
        })""",
        code,
    )


def press_and_time(page, panel, knob: str, keys: list[str]) -> tuple[float, int]:
    """Press ``keys`` on a knob's slider, quickly, one after the other; seconds until the
    panel's last redraw, and the replays that cost."""
    before = int(kernel_says(page, "print(panel.num_replays)"))
    summary = panel.locator('[data-testid="kvlab-page-map-summary"]').first
    old = summary.text_content()
    handle = panel.locator(f".kvlab-slider-{knob} .noUi-handle").first
    handle.focus()
    start = time.monotonic()
    for key in keys:
        page.keyboard.press(key)
        page.wait_for_timeout(60)
    page.wait_for_function(
        """([el, old]) => el.textContent !== old && !document
            .querySelector('.kvlab-batching-status').textContent.includes('replaying')""",
        arg=[summary.element_handle(), old],
        timeout=60_000,
    )
    seconds = wait_until_quiet(page, summary) - start
    return seconds, int(kernel_says(page, "print(panel.num_replays)")) - before


def wait_until_quiet(page, summary, quiet_s: float = 2.0) -> float:
    """Until no replay has started or drawn for ``quiet_s`` seconds (a replay that a later
    message started would change the status or the map's summary); when the last change
    was seen (``time.monotonic``)."""
    status = page.locator(".kvlab-batching-status").first
    last, since = None, time.monotonic()
    while time.monotonic() - since < quiet_s:
        now = (status.text_content(), summary.text_content())
        if now != last or "replaying" in now[0]:
            last, since = now, time.monotonic()
        page.wait_for_timeout(200)
    return since


def test_quick_moves_cost_one_replay(page):
    """Three presses of an arrow key, 60 ms apart: one replay (of the three policies).
    Without the panel's coalescing it costs two: the first press replays at once, and
    ipywidgets sends the kernel only the last of the presses that came meanwhile."""
    panel = at_top(page, 0)
    one, one_replays = press_and_time(page, panel, "arrival_rate", ["ArrowRight"])
    three, three_replays = press_and_time(page, panel, "arrival_rate", ["ArrowRight"] * 3)
    print(f"arrival_rate: one move {one:.1f} s, three quick moves {three:.1f} s")
    assert one_replays == 3  # the selected policy and the two others
    assert three_replays == 3, f"three quick moves cost {three_replays} replays, not 3"
    assert float(kernel_says(page, "print(panel.settings.arrival_rate)")) == pytest.approx(10)
    assert not page.errors, page.errors


def test_a_refused_replay_greys_out_the_stale_results(page):
    panel = at_top(page, 0)
    results = panel.locator(".kvlab-step-view").first
    assert float(results.evaluate("el => getComputedStyle(el.parentElement).opacity")) == 1
    kernel_says(page, "panel.set(block_size=1, num_blocks=4)")
    status = panel.locator(".kvlab-batching-status").first
    page.wait_for_function(
        "el => el.textContent.includes('Not replayed')", arg=status.element_handle()
    )
    assert "num_blocks to" in status.text_content(), status.text_content()
    opacity = float(results.evaluate("el => getComputedStyle(el.parentElement).opacity"))
    assert opacity < 0.5, f"the stale results are drawn at opacity {opacity}"
    screenshot(page, "panel_fit_refused.png", panel)
    kernel_says(page, "panel.set(block_size=8, num_blocks=64)")
    page.wait_for_function(
        "el => getComputedStyle(el.parentElement).opacity === '1'", arg=results.element_handle()
    )
    assert not page.errors, page.errors
