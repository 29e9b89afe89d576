"""The widgets as a learner sees them: labs 03 and 04 run in JupyterLab, in Chromium.

nbval never runs widget JavaScript, so these tests are the only proof that the page map
and the memory gauge draw something and that a batching slider changes the plots and the
page map. They need Debian's ``chromium`` and the ``playwright`` package; without them they
skip, except where ``KVLAB_REQUIRE_BROWSER=1`` (CI) turns the skip into a failure.
Screenshots land in ``test-artifacts/``.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import pytest
from browser import (
    ARTIFACTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    LabServer,
    missing_browser,
    run_all_cells,
    screenshot,
)

PAGE_MAP = '[data-testid="kvlab-page-map"]'
GAUGE = '[data-testid="kvlab-memory-gauge"]'
PANEL = ".kvlab-batching-panel"


@dataclass
class Lab:
    page: object
    server: LabServer
    errors: list[str]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = missing_browser()
    if reason:
        if os.environ.get("KVLAB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser tests are required here (KVLAB_REQUIRE_BROWSER=1): {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    server = LabServer(tmp_path_factory.mktemp("labs"))
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1280, "height": 1000})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            yield Lab(page, server, errors)
            browser.close()
    finally:
        server.close()


try:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # the fixture skips or fails with the reason
    PlaywrightTimeout = TimeoutError


def drawn_blocks(page) -> list[int]:
    """data-drawn-blocks of every page map on the page (set by its JS after each draw)."""
    maps = page.locator(PAGE_MAP)
    return [int(maps.nth(i).get_attribute("data-drawn-blocks") or 0) for i in range(maps.count())]


def test_lab03_page_map_and_gauge_render(lab):
    page = lab.page
    run_all_cells(page, lab.server, "03_paged.ipynb")
    try:
        page.wait_for_function(
            f"() => document.querySelectorAll('{PAGE_MAP}[data-drawn-blocks]').length > 0",
            timeout=30_000,
        )
    except PlaywrightTimeout:
        pytest.fail(f"no page map finished drawing in 30 s; JavaScript errors: {lab.errors}")
    blocks = drawn_blocks(page)
    assert blocks and max(blocks) > 0, f"no page map drew a block: {blocks}"
    gauge = page.locator(GAUGE).first
    assert page.locator(GAUGE).count() > 0, "no memory gauge rendered"
    assert int(gauge.get_attribute("data-drawn-segments") or 0) > 0, "the gauge drew nothing"
    screenshot(page, "lab03_memory_gauge.png", gauge)
    check_tooltip_is_whole(page)
    check_legends_name_what_is_drawn(page)
    screenshot_map_with_tooltip(page)
    check_step_view_follows_its_slider(page)
    assert not lab.errors, f"JavaScript errors: {lab.errors}"


def check_tooltip_is_whole(page) -> None:
    """Hover over a held block of the fork map (a one-row map, where output areas used to
    clip the tooltip after three lines): every line, ref_cnt included, must be on screen."""
    fork_map = page.locator(".kvlab-page-map-root", has_text="after fork(0, 1)").first
    canvas = fork_map.locator(PAGE_MAP)
    canvas.scroll_into_view_if_needed()
    cell = int(canvas.get_attribute("data-cell-px"))
    canvas.hover(position={"x": cell // 2, "y": cell // 2})
    tooltip = page.locator('[data-testid="kvlab-page-map-tooltip"]:visible').first
    text = tooltip.text_content()
    assert "ref_cnt 2" in text and "tokens 16 / 16" in text, text
    box = tooltip.bounding_box()
    # Drawn whole: it lives outside every output area (which clip with overflow: hidden),
    # in a fixed layer, and lies inside the window.
    outside = tooltip.evaluate(
        "el => el.parentElement === document.body && getComputedStyle(el).position === 'fixed'"
    )
    assert outside, "the tooltip sits inside an output area, which clips it"
    assert box["y"] >= 0 and box["y"] + box["height"] <= page.viewport_size["height"], box
    screenshot(page, "lab03_tooltip.png")


def check_legends_name_what_is_drawn(page) -> None:
    """Every page map's legend (worked out in Python) lists exactly the states its canvas
    painted (recorded by the JavaScript as it draws each cell)."""
    maps = page.locator(".kvlab-page-map-root")
    seen = []
    for i in range(maps.count()):
        root = maps.nth(i)
        root.scroll_into_view_if_needed()  # JupyterLab draws only what is near the view
        canvas = root.locator(PAGE_MAP)
        page.wait_for_function(
            "el => el.dataset.drawnStates !== undefined", arg=canvas.element_handle()
        )
        drawn = set(filter(None, canvas.get_attribute("data-drawn-states").split(",")))
        keys = root.locator(".kvlab-legend-item[data-key]")
        listed = {keys.nth(k).get_attribute("data-key") for k in range(keys.count())}
        more = root.locator(".kvlab-legend-item:not([data-key])").count() > 0
        states = {k for k in drawn if not k.startswith("seq ")}
        title = root.locator(".kvlab-page-map-title").text_content()
        assert {k for k in listed if not k.startswith("seq ")} == states, (title, listed, drawn)
        seqs_drawn = drawn - states
        seqs_listed = listed - states
        assert seqs_listed <= seqs_drawn and (more or seqs_listed == seqs_drawn), (title, listed)
        seen.append(states)
    # Lab 03's maps draw every state of a pool without prefix caching, so each was checked
    # (cached and hashed blocks are lab 06's).
    assert set().union(*seen) >= {"free", "reserved", "shared"}, seen


def screenshot_map_with_tooltip(page) -> None:
    """The README's page map: the paged run at the step it rests on, with its title,
    legend, counts and the tooltip of block 0 open (one picture of the map and the
    tooltip)."""
    root = page.locator(".kvlab-step-view .kvlab-page-map-root").first
    root.scroll_into_view_if_needed()
    canvas = root.locator(PAGE_MAP)
    cell = int(canvas.get_attribute("data-cell-px"))
    canvas.hover(position={"x": cell // 2, "y": cell // 2})
    tooltip = page.locator('[data-testid="kvlab-page-map-tooltip"]:visible').first
    assert "block 0" in tooltip.text_content()
    boxes = [root.bounding_box(), tooltip.bounding_box()]
    left = min(b["x"] for b in boxes) - 4
    top = min(b["y"] for b in boxes) - 2
    right = max(b["x"] + b["width"] for b in boxes) + 4
    bottom = max(b["y"] + b["height"] for b in boxes) + 2
    clip = {"x": left, "y": top, "width": right - left, "height": bottom - top}
    screenshot_clip(page, "lab03_page_map.png", clip)


def screenshot_clip(page, name: str, clip: dict) -> None:
    """A screenshot of one region of the notebook (kept inside its visible area: JupyterLab
    does not draw the parts of a notebook that are scrolled out of view)."""
    area = page.locator(".jp-NotebookPanel-notebook:visible").first.bounding_box()
    clip = dict(clip, x=max(area["x"], clip["x"]), y=max(area["y"], clip["y"]))
    clip["width"] = min(clip["width"], area["x"] + area["width"] - clip["x"])
    clip["height"] = min(clip["height"], area["y"] + area["height"] - clip["y"])
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / name), clip=clip)


def check_step_view_follows_its_slider(page) -> None:
    """The paged run's StepView rests on the step its prose is about; one key press goes
    back a step and redraws the map's title."""
    view = page.locator(".kvlab-step-view").first
    view.scroll_into_view_if_needed()
    title = view.locator(".kvlab-page-map-title")
    before = title.text_content()
    view.locator(".kvlab-slider-step .noUi-handle, .kvlab-slider-step input").first.focus()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(
        "([el, before]) => el.textContent !== before", arg=[title.element_handle(), before]
    )


def wait_until_idle(page, quiet_s: float = 1.5) -> None:
    """Until the panel has finished every replay the key presses queued: no "replaying"
    status, and nothing it shows has changed for ``quiet_s`` seconds."""
    last, since = None, time.monotonic()
    deadline = since + 120
    while time.monotonic() < deadline:
        status = page.locator(".kvlab-batching-status").first.text_content()
        now = (status, page.evaluate(PANEL_STATE))
        if now != last or "replaying" in status:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return
        page.wait_for_timeout(250)
    pytest.fail(f"the batching panel was still replaying after 120 s: {last}")


PANEL_STATE = """() => {
    const panel = document.querySelector('.kvlab-batching-panel');
    if (!panel) return null;
    const plot = panel.querySelector('.kvlab-batching-plot .js-plotly-plot');
    const map = panel.querySelector('.kvlab-batching-page-map [data-testid="kvlab-page-map"]');
    const summary = panel.querySelector('[data-testid="kvlab-page-map-summary"]');
    return {
        plot: plot ? JSON.stringify(plot.data.map(trace => [trace.x, trace.y])) : null,
        blocks: map ? map.getAttribute('data-drawn-blocks') : null,
        summary: summary ? summary.textContent : null,
    };
}"""


def test_lab04_slider_replays_and_redraws(lab):
    page = lab.page
    run_all_cells(page, lab.server, "04_batching.ipynb")
    page.wait_for_function(f"() => {{ const s = ({PANEL_STATE})(); return s && s.plot; }}")
    before = page.evaluate(PANEL_STATE)
    assert before["blocks"] and int(before["blocks"]) > 0, f"the panel's page map: {before}"
    panel = page.locator(PANEL).first
    screenshot(page, "lab04_batching_panel.png", panel)
    # Sliders and page map on one 1,000 px screen: from the first slider to the map's end.
    top = panel.locator(".kvlab-slider-max_num_seqs").first.bounding_box()["y"]
    map_box = panel.locator(PAGE_MAP).first.bounding_box()
    assert map_box["y"] + map_box["height"] - top < 1000, (top, map_box)

    # Move the arrival-rate slider as a learner would: focus its handle, press the arrow key.
    handle = panel.locator(".kvlab-slider-arrival_rate .noUi-handle").first
    handle.scroll_into_view_if_needed()
    handle.focus()
    for _ in range(3):
        page.keyboard.press("ArrowRight")
    try:
        page.wait_for_function(
            f"""(before) => {{
                const now = ({PANEL_STATE})();
                return now && now.plot && now.plot !== before.plot
                    && now.summary !== before.summary;
            }}""",
            arg=before,
            timeout=120_000,
        )
    except PlaywrightTimeout:
        after = page.evaluate(PANEL_STATE)
        pytest.fail(
            "moving the arrival_rate slider did not change both the plot and the page map: "
            f"plot changed={after['plot'] != before['plot']}, "
            f"page map {before['summary']!r} -> {after['summary']!r}; errors: {lab.errors}"
        )
    wait_until_idle(page)
    # The README's panel: from the scheduling toggle to the window's bottom edge, which
    # takes in the sliders, the pool and the top of the timeline.
    panel.scroll_into_view_if_needed()
    page.evaluate("el => el.scrollIntoView({block: 'start'})", panel.element_handle())
    screenshot_clip(page, "lab04_batching_panel_after.png", panel.bounding_box())
    assert not lab.errors, f"JavaScript errors: {lab.errors}"
