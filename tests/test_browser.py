"""The quickstart in a real browser: JupyterLab on loopback, headless Chromium, the slice
picker rendered and responding to a change of generation (no cluster needed)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[1]
CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = ROOT / "build" / "screenshots"
NOTEBOOK = "01_quickstart.ipynb"

pytestmark = pytest.mark.skipif(
    not os.path.exists(CHROMIUM),
    reason=f"{CHROMIUM} is missing: install Debian's chromium (apt-get install chromium); "
    ".ci/run does",
)


class _Token(str):
    """The server's token; its repr stays out of tracebacks and logs."""

    def __repr__(self) -> str:
        return "'<token>'"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_server(
    base: str, token: _Token, process: subprocess.Popen, log: Path, timeout_s: float = 90.0
) -> None:
    # The token goes in a header, never in a URL that an error message could show.
    request = urllib.request.Request(f"{base}/api/status",
                                     headers={"Authorization": f"token {token}"})
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(
                f"JupyterLab exited early with code {process.returncode}; its log: {log}")
        with (
            contextlib.suppress(urllib.error.URLError, ConnectionError, TimeoutError),
            urllib.request.urlopen(request, timeout=2) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"JupyterLab did not answer at {base} in {timeout_s:.0f} s; log: {log}")


def _stop(process: subprocess.Popen) -> None:
    """Stop JupyterLab and everything it started (kernels included)."""
    try:
        family = [process.pid] + [c.pid for c in psutil.Process(process.pid).children(True)]
    except psutil.NoSuchProcess:
        family = [process.pid]
    process.terminate()
    try:
        process.wait(20)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(10)
    procs = []
    for pid in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            procs.append(psutil.Process(pid))
    for proc in procs:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(procs, timeout=10)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()


@pytest.fixture
def jupyterlab(tmp_path):
    """JupyterLab serving a copy of the quickstart, on 127.0.0.1 with a random token."""
    root = tmp_path / "lab"
    root.mkdir()
    shutil.copy(ROOT / "notebooks" / NOTEBOOK, root / NOTEBOOK)
    settings = tmp_path / "settings"
    # No news prompt covering the page.
    news = settings / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    token = _Token(secrets.token_hex(24))
    port = _free_port()
    env = {
        **os.environ,
        "JUPYTER_CONFIG_DIR": str(tmp_path / "config"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"),
        "JUPYTERLAB_SETTINGS_DIR": str(settings),
        "JUPYTERLAB_WORKSPACES_DIR": str(tmp_path / "workspaces"),
    }
    env.pop("RAY_ADDRESS", None)
    # The token reaches JupyterLab through its environment, not its command line, where
    # any process listing would show it.
    env["JUPYTER_TOKEN"] = token
    command = [
        sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1",
        f"--port={port}", f"--ServerApp.root_dir={root}", "--ServerApp.port_retries=0",
        "--ServerApp.terminals_enabled=False",
    ]
    if os.geteuid() == 0:  # CI containers run as root; JupyterLab refuses that by default
        command.append("--ServerApp.allow_root=True")
    log_path = tmp_path / "jupyterlab.log"
    log = open(log_path, "w")  # noqa: SIM115 - closed below
    process = subprocess.Popen(
        command,
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
        start_new_session=True,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        _wait_for_server(base, token, process, log_path)
        yield base, token
    finally:
        _stop(process)
        log.close()


def _topology_options(picker) -> list[str]:
    return picker.locator(".widget-dropdown select").nth(1).evaluate(
        "select => Array.from(select.options).map(o => o.value || o.textContent)"
    )


@pytest.mark.slow
def test_quickstart_picker_renders_and_follows_the_generation(jupyterlab):
    from playwright.sync_api import expect, sync_playwright

    base, token = jupyterlab
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            # Authorised by header, so the token is in no URL that an error could print.
            context = browser.new_context(
                viewport={"width": 1400, "height": 1000},
                extra_http_headers={"Authorization": f"token {token}"},
            )
            page = context.new_page()
            page.goto(f"{base}/lab/tree/{NOTEBOOK}")
            page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=90_000)
            # Wait until the page is talking to a ready kernel, or the first run is lost.
            idle = page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\|\s*Idle"))
            idle.first.wait_for(timeout=120_000)
            cells = json.loads((ROOT / "notebooks" / NOTEBOOK).read_text())["cells"]
            picker_cell = next(
                i for i, c in enumerate(cells) if "ui.SlicePicker(" in "".join(c["source"])
            )
            # Run every cell from the top down to the picker's (markdown cells just render),
            # each code cell to its end before the next.
            rendered = page.locator(".jp-Notebook .jp-Cell")
            rendered.first.click()
            for index in range(picker_cell + 1):
                page.keyboard.press("Shift+Enter")
                if cells[index]["cell_type"] == "code":
                    expect(rendered.nth(index).locator(".jp-InputPrompt")).to_have_text(
                        re.compile(r"\[\d+\]"), timeout=120_000
                    )
            output = page.locator(".jp-Notebook .jp-CodeCell", has_text="ui.SlicePicker(")
            output.locator(".widget-dropdown select").nth(1).wait_for(timeout=120_000)
            assert "Error displaying widget" not in page.content()
            assert "not connected" in output.inner_text()
            before = _topology_options(output)
            assert "2x2" in before and "2x2x1" not in before

            output.locator(".widget-dropdown select").first.select_option("v5p")
            page.wait_for_function(
                "() => Array.from(document.querySelectorAll('.widget-dropdown select')[1]"
                ".options).some(o => (o.value || o.textContent) === '2x2x1')",
                timeout=30_000,
            )
            after = _topology_options(output)
            assert after != before and "2x2" not in after
            assert "tpu-v5p-slice" in output.inner_text()  # the facts followed the choice
            assert "Error displaying widget" not in page.content()
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            output.scroll_into_view_if_needed()
            page.screenshot(path=str(SCREENSHOTS / "quickstart_picker.png"))
        except Exception:
            SCREENSHOTS.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(Exception):
                page.screenshot(path=str(SCREENSHOTS / "quickstart_picker_failure.png"))
            raise
        finally:
            browser.close()
