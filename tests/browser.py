"""Drive JupyterLab in headless Chromium: open a lab, run all cells, look at what rendered.

Widget JavaScript never runs under nbval, so only a real browser shows that a learner sees
the page map and that a slider changes it. JupyterLab runs on loopback from a copy of
``labs/`` (its autosave must not rewrite the committed notebooks); Chromium comes from
Debian's ``chromium`` package, driven by Playwright's Python package.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

CHROMIUM = os.environ.get("KVLAB_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
REPO = Path(__file__).resolve().parents[1]
ARTIFACTS = REPO / "test-artifacts"


def missing_browser() -> str | None:
    """Why a browser test cannot run here, or None when it can."""
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        return "the Python package 'playwright' is not installed (pip install -e '.[test]')"
    if not Path(CHROMIUM).exists():
        return f"no Chromium at {CHROMIUM} (Debian: apt-get install chromium)"
    return None


class LabServer:
    """JupyterLab serving a copy of labs/ on a free loopback port, for one test module."""

    def __init__(self, workdir: Path):
        shutil.copytree(REPO / "labs", workdir, dirs_exist_ok=True)
        # NOTE: JupyterLab 4 renders only the cells in view ("windowing"); a widget far down
        # a notebook would then have no element to look at. Turn windowing off.
        settings = workdir / ".settings" / "@jupyterlab" / "notebook-extension"
        settings.mkdir(parents=True)
        (settings / "tracker.jupyterlab-settings").write_text('{"windowingMode": "none"}')
        # and no "get notified about Jupyter news?" pop-up over the widgets
        news = workdir / ".settings" / "@jupyterlab" / "apputils-extension"
        news.mkdir(parents=True)
        (news / "notification.jupyterlab-settings").write_text('{"fetchNews": "false"}')
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = (workdir / "jupyterlab.log").open("w")
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
                "--ip=127.0.0.1", f"--port={self.port}", "--IdentityProvider.token=",
                "--ServerApp.password=", f"--ServerApp.root_dir={workdir}",
                "--LabApp.expose_app_in_browser=True",
            ],
            cwd=workdir, stdout=self.log, stderr=subprocess.STDOUT,
            env={**os.environ, "JUPYTERLAB_SETTINGS_DIR": str(workdir / ".settings")},
        )  # fmt: skip
        self._wait_until_up(timeout=120)

    def _wait_until_up(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"JupyterLab exited with {self.process.returncode}")
            try:
                urllib.request.urlopen(f"{self.url}/api/status", timeout=2)
                return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer on {self.url} within {timeout} s")

    def close(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(20)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.log.close()


def run_all_cells(page, server: LabServer, notebook: str, timeout_s: float = 600) -> None:
    """Open ``notebook``, wait for its kernel, run every cell, wait until all have run.

    Raises AssertionError naming the first cell that produced an error output.
    """
    # A workspace of its own, reset, so that notebooks opened by earlier tests are not
    # restored and made current instead of this one.
    workspace = Path(notebook).stem.replace("_", "-")
    page.goto(f"{server.url}/lab/workspaces/{workspace}/tree/{notebook}?reset")
    page.wait_for_function(
        """(notebook) => {
            const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;
            return w && w.context && w.context.path.endsWith(notebook);
        }""",
        arg=notebook,
        timeout=120_000,
    )
    # "Run all" sent before the kernel is connected silently does nothing: wait for it.
    page.wait_for_function(
        """() => {
            const w = window.jupyterapp.shell.currentWidget;
            const kernel = w && w.sessionContext && w.sessionContext.session
                && w.sessionContext.session.kernel;
            return kernel && kernel.connectionStatus === 'connected' && kernel.status === 'idle';
        }""",
        timeout=120_000,
    )
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
    page.wait_for_function(
        """() => {
            const w = window.jupyterapp.shell.currentWidget;
            const cells = w.content.widgets.filter(c => c.model.type === 'code');
            const done = cells.every(c => c.model.executionCount !== null
                                        && c.model.executionState !== 'running');
            return done && w.sessionContext.session.kernel.status === 'idle';
        }""",
        timeout=timeout_s * 1000,
        polling=1000,
    )
    error = page.evaluate(
        """() => {
            const w = window.jupyterapp.shell.currentWidget;
            for (const [i, c] of w.content.widgets.entries()) {
                if (c.model.type !== 'code') continue;
                const outs = c.model.outputs.toJSON();
                const err = outs.find(o => o.output_type === 'error');
                if (err) return `cell ${i}: ${err.ename}: ${err.evalue}`;
            }
            return null;
        }"""
    )
    assert error is None, f"{notebook} raised in the browser: {error}"


def screenshot(page, name: str, locator=None) -> Path:
    """Save a screenshot under test-artifacts/ (the whole page, or one element)."""
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / name
    (locator or page).screenshot(path=str(path))
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
