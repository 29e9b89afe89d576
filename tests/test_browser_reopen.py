"""A picture in every widget cell of labs 03 and 04, whenever a learner looks.

In JupyterLab in Chromium, served as `make lab` serves it (``binder/`` on
JUPYTER_CONFIG_PATH): a fresh clone opened before anything runs (untrusted: JupyterLab
shows the ``image/png`` picture, never the widget view, an unsafe mimetype); the lab run
(live widgets), saved and reloaded while its kernel runs (live widgets again, from the
kernel); then closed with its kernel shut down and reopened, twice (the second time after
a save of the reopened lab, when JupyterLab 4 would drop restored widget state). Without
binder/jupyter_server_config.py the reopened cells say "Error displaying widget: model not
found". The browser console must stay free of errors throughout. Screenshots of each lab's
first widget cell land in ``test-artifacts/``. Labs 02 and 06 show their widgets the same
way and pass too, but would more than double the time (a lab's run takes 2-4 min here).
"""

from __future__ import annotations

import json
import os
import re

import pytest
from browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO,
    LabServer,
    missing_browser,
    run_all_cells,
    screenshot,
)

LAB_CONFIG = REPO / "binder"
LABS = ["03_paged.ipynb", "04_batching.ipynb"]
WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    reason = missing_browser()
    if reason:
        if os.environ.get("KVLAB_REQUIRE_BROWSER") == "1":
            pytest.fail(f"browser tests are required here (KVLAB_REQUIRE_BROWSER=1): {reason}")
        pytest.skip(reason)
    from playwright.sync_api import sync_playwright

    with pytest.MonkeyPatch.context() as env:  # the server reads it as it starts
        paths = [str(LAB_CONFIG), *filter(None, [os.environ.get("JUPYTER_CONFIG_PATH")])]
        env.setenv("JUPYTER_CONFIG_PATH", os.pathsep.join(paths))
        server = LabServer(tmp_path_factory.mktemp("labs"))
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.on(
                "console",
                lambda message: message.type == "error" and errors.append(message.text),
            )
            yield page, server, errors
            browser.close()
    finally:
        server.close()


def widget_cells(notebook: str) -> list[int]:
    """Indices of the cells whose committed outputs hold a widget view."""
    cells = json.loads((REPO / "labs" / notebook).read_text())["cells"]
    return [
        i
        for i, cell in enumerate(cells)
        for output in cell.get("outputs", [])
        if WIDGET_VIEW in output.get("data", {})
    ]


# For each widget cell: what its output area shows. A picture is a loaded <img> or a
# widget that drew on a canvas; "Loading widget..." means the widget manager is not done.
SHOWN = """(cells) => {
    const notebook = window.jupyterapp.shell.currentWidget.content;
    return cells.map(i => {
        const area = notebook.widgets[i].node.querySelector('.jp-OutputArea');
        const text = area ? area.textContent : '';
        const images = area ? [...area.querySelectorAll('img')] : [];
        const canvases = area ? [...area.querySelectorAll('canvas')] : [];
        return {
            cell: i,
            image: images.some(img => img.complete && img.naturalWidth > 0),
            widget: canvases.some(canvas => canvas.width > 0 && canvas.height > 0),
            error: text.includes('Error displaying widget'),
            loading: text.includes('Loading widget'),
        };
    });
}"""


def open_notebook(page, server: LabServer, notebook: str) -> None:
    """Open ``notebook`` in a workspace of its own and wait until its kernel is idle and
    JupyterLab's debugger has asked the new kernel for its state (it enables its toolbar
    button then): a reload or a shutdown before the kernel answers cancels the request,
    which JupyterLab logs as a console error. The kernel must then have no request left
    unanswered for three polls in a row, 0.4 s (the debugger asks twice). The button is
    enabled for a kernel with a debugger: ipykernel's, which brings debugpy."""
    workspace = notebook.removesuffix(".ipynb").replace("_", "-")
    page.goto(f"{server.url}/lab/workspaces/{workspace}/tree/{notebook}?reset")
    page.wait_for_function(
        """(notebook) => {
            const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            const kernel = w && w.context && w.context.path.endsWith(notebook)
                && w.sessionContext.session && w.sessionContext.session.kernel;
            const bug = w && w.toolbar && w.toolbar.node.querySelector('.jp-DebuggerBugButton');
            const ready = kernel && kernel.connectionStatus === 'connected'
                && kernel.status === 'idle' && bug && bug.getAttribute('aria-disabled') === 'false'
                && kernel._futures.size === 0;
            window.kvlabQuietPolls = ready ? (window.kvlabQuietPolls || 0) + 1 : 0;
            return window.kvlabQuietPolls >= 3;
        }""",
        arg=notebook,
        timeout=120_000,
        polling=200,
    )


def pictures(page, cells: list[int], expect: str) -> list[dict]:
    """Wait until every widget cell shows ``expect`` ("image" or "widget") and no error;
    return what each shows when that does not come within 30 s."""
    done = f"""(cells) => ({SHOWN})(cells).every(c => c.{expect} && !c.error && !c.loading)"""
    try:
        page.wait_for_function(done, arg=cells, timeout=30_000, polling=500)
    except Exception:  # Playwright's timeout: the caller names the cells that fail
        pass
    return page.evaluate(SHOWN, cells)


def save(page) -> None:
    page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
    page.wait_for_function(
        "() => !window.jupyterapp.shell.currentWidget.context.model.dirty", timeout=60_000
    )


def save_and_shut_down(page) -> None:
    """Save the current notebook, shut its kernel down and close it, as a learner who
    leaves for the day (the kernel's widget models go with it)."""
    save(page)
    page.evaluate(
        """async () => {
            const w = window.jupyterapp.shell.currentWidget;
            await w.sessionContext.shutdown();
            w.dispose();
        }"""
    )


def first_cell_screenshot(page, cells: list[int], name: str) -> None:
    area = page.locator(".jp-NotebookPanel:visible .jp-Cell").nth(cells[0])
    area.scroll_into_view_if_needed()
    screenshot(page, name, area.locator(".jp-OutputArea"))


@pytest.mark.parametrize("notebook", LABS)
def test_widget_cells_show_a_picture_before_run_and_after_reopen(lab, notebook):
    page, server, errors = lab
    errors.clear()
    cells = widget_cells(notebook)
    assert cells, f"{notebook} has no widget output to look at"
    stem = notebook[:2]

    open_notebook(page, server, notebook)
    shown = pictures(page, cells, "image")
    first_cell_screenshot(page, cells, f"reopen_lab{stem}_1_before_run.png")
    assert all(c["image"] and not c["error"] for c in shown), f"before the first run: {shown}"

    run_all_cells(page, server, notebook)
    shown = pictures(page, cells, "widget")
    first_cell_screenshot(page, cells, f"reopen_lab{stem}_2_after_run.png")
    assert all(c["widget"] and not c["error"] for c in shown), f"after running: {shown}"
    save(page)
    open_notebook(page, server, notebook)  # a page reload: the kernel and its models live on
    shown = pictures(page, cells, "widget")
    first_cell_screenshot(page, cells, f"reopen_lab{stem}_2_reload.png")
    assert all(c["widget"] and not c["error"] for c in shown), f"after a reload: {shown}"
    save_and_shut_down(page)

    for reopen in (1, 2):
        open_notebook(page, server, notebook)
        shown = pictures(page, cells, "image")
        first_cell_screenshot(page, cells, f"reopen_lab{stem}_3_reopen_{reopen}.png")
        assert all(c["image"] and not c["error"] for c in shown), f"reopen {reopen}: {shown}"
        save_and_shut_down(page)
    assert not errors, f"browser console errors: {errors}"


def test_make_lab_and_binder_serve_with_the_lab_config():
    """`make lab` and Binder's start script put binder/ on JUPYTER_CONFIG_PATH, the server
    settings the test above runs under."""
    makefile = (REPO / "Makefile").read_text()
    lab_recipe = re.search(r"^lab:.*\n((?:\t.*\n)+)", makefile, re.MULTILINE).group(1)
    assert 'JUPYTER_CONFIG_PATH="$(CURDIR)/binder' in lab_recipe, lab_recipe
    start = (LAB_CONFIG / "start").read_text()
    assert 'export JUPYTER_CONFIG_PATH="${here}' in start, start
    assert (LAB_CONFIG / "jupyter_server_config.py").exists()
