"""The labs' animations as a reader without a kernel sees them: in Chromium, on the HTML
page nbconvert makes of each committed lab (what nbviewer shows).

A step slider's recording, the batching panel's replay and a build-it's failing case are
saved as animated PNGs. Here Chromium decodes each one (WebCodecs' ``ImageDecoder``): it
must have more than one frame, and its middle frame must differ from its first. Then one
animation per lab is watched as an ``<img>``: two screenshots a few frames apart must
differ, so the page really plays it. Labs 02, 03, 04 and 06 must each hold at least one.
Needs Debian's ``chromium`` and ``playwright``, as the other browser tests do.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbformat
import pytest
from browser import ARTIFACTS, CHROMIUM, CHROMIUM_ARGS, missing_browser
from nbconvert import HTMLExporter

LABS = sorted((Path(__file__).parent.parent / "labs").glob("*.ipynb"))
MUST_ANIMATE = {"02_contiguous", "03_paged", "04_batching", "06_prefix_sharing"}

DECODE_ANIMATIONS = """async () => {
    const out = [];
    const images = [...document.querySelectorAll('img')]
        .filter(img => img.src.startsWith('data:image/png'));
    for (const [index, img] of images.entries()) {
        const data = await (await fetch(img.src)).arrayBuffer();
        const decoder = new ImageDecoder({data, type: 'image/png'});
        await decoder.tracks.ready;
        const frames = decoder.tracks.selectedTrack.frameCount;
        if (frames < 2) continue;  // a still figure
        const pixels = async (k) => {
            const {image} = await decoder.decode({frameIndex: k});
            const canvas = new OffscreenCanvas(image.displayWidth, image.displayHeight);
            const context = canvas.getContext('2d');
            context.drawImage(image, 0, 0);
            image.close();
            return context.getImageData(0, 0, canvas.width, canvas.height).data;
        };
        const first = await pixels(0), middle = await pixels(Math.floor(frames / 2));
        let differ = first.length !== middle.length;
        for (let i = 0; !differ && i < first.length; i++) differ = first[i] !== middle[i];
        out.push({index, frames, differ});
    }
    return out;
}"""


@pytest.fixture(scope="module")
def browser():
    reason = missing_browser()
    if reason:
        if os.environ.get("KVLAB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser tests are required here (KVLAB_REQUIRE_BROWSER=1): {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.mark.parametrize("path", LABS, ids=[p.stem for p in LABS])
def test_every_animation_plays_without_a_kernel(browser, path, tmp_path):
    html, _ = HTMLExporter().from_notebook_node(nbformat.read(path, as_version=4))
    page_file = tmp_path / f"{path.stem}.html"
    page_file.write_text(html)
    page = browser.new_page(viewport={"width": 1000, "height": 1400})
    try:
        # A file: URL is a secure context, which ImageDecoder needs.
        page.goto(page_file.as_uri())
        animations = page.evaluate(DECODE_ANIMATIONS)
        if path.stem in MUST_ANIMATE:
            assert animations, f"{path.name}: no animated picture in the static page"
        still = [a for a in animations if not a["differ"]]
        assert not still, f"{path.name}: animations whose middle frame is their first: {still}"
        if animations:
            watch_one_play(page, animations[0]["index"], path.stem)
    finally:
        page.close()


def watch_one_play(page, index: int, name: str) -> None:
    """Two screenshots of the ``index``-th PNG on the page, 1.6 s apart (at least three
    frames of 0.5 s), must differ: the browser plays the animation in the page."""
    image = page.locator("img[src^='data:image/png']").nth(index)
    image.scroll_into_view_if_needed()
    first = image.screenshot()
    page.wait_for_timeout(1600)
    later = image.screenshot()
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"{name}_animation_later.png").write_bytes(later)
    assert first != later, f"{name}: the animation did not move in 1.6 s"
