"""What the browser tests share: Debian's chromium through Playwright, a private
JupyterLab (:mod:`tests.lab_server`), and a notebook whose cells are run by name
with Lab's own keyboard commands, as a user runs them.

Fixtures ``chromium``, ``lab`` and ``page`` are module-scoped: each browser test
module gets its own Lab server and browser.  Screenshots go to ``build/browser/``
(gitignored).
"""

from __future__ import annotations

import re
import shutil
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHOTS = ROOT / "build" / "browser"

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-background-networking",
    "--disable-component-update",
]

#: the marks of a test of the Lab extension: a browser test, skipped where the
#: extension was not built into this environment
LAB_EXTENSION_MARKS = [pytest.mark.browser, pytest.mark.timeout(300)]
if not (Path(sys.prefix) / "share/jupyter/labextensions/gpucell/package.json").exists():
    LAB_EXTENSION_MARKS.append(
        pytest.mark.skip(
            reason="the Lab extension is not built into this environment (pip "
            "install -e . without Node >= 20.19; .ci/run checks it is there)"
        )
    )

#: how IPython's tracebacks and usage errors start, as Lab renders them
ERROR_RE = re.compile(r"Traceback \(most recent call last\)|^\w*Error: ", re.M)


@pytest.fixture(scope="module")
def chromium() -> str:
    """Debian's chromium and Playwright, or a skip saying which is missing.

    Checked before the Lab server starts, so a machine without them skips at once.
    """
    pytest.importorskip("playwright.sync_api", reason="needs playwright (test extra)")
    pytest.importorskip("jupyterlab", reason="needs jupyterlab (test extra)")
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip(
        "needs Debian's chromium on PATH (apt-get install chromium; .ci/run does); "
        "Playwright's own browser downloads are not used"
    )


@pytest.fixture(scope="module")
def lab(chromium: str, tmp_path_factory: pytest.TempPathFactory):
    from lab_server import LabServer

    server = LabServer(tmp_path_factory.mktemp("lab")).start()
    try:
        yield server
    finally:
        stragglers = server.stop()
        assert not stragglers, (
            f"processes outlived the Lab server's shutdown by 10 s: {stragglers}"
        )


@pytest.fixture(scope="module")
def page(chromium: str, lab):
    from playwright.sync_api import sync_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(
            executable_path=chromium,
            headless=True,
            # Playwright gives each launch a fresh --user-data-dir of its own
            args=CHROMIUM_FLAGS,
        )
        try:
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            pg = ctx.new_page()
            pg.set_default_timeout(30_000)
            yield pg
        finally:
            browser.close()


def write_notebook(path: Path, cells: dict[str, str]) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3 (ipykernel)",
        "language": "python",
    }
    nb.cells = [nbformat.v4.new_code_cell(src) for src in cells.values()]
    nbformat.write(nb, path)


def shot(page, stem: str, locator=None) -> None:
    try:
        (locator or page).screenshot(path=str(SHOTS / f"{stem}.png"))
    except Exception:  # a screenshot is evidence, never the failure itself
        pass


def dump(locator, stem: str) -> None:
    """The rendered DOM beside the screenshot: what the selectors were run on."""
    try:
        (SHOTS / f"{stem}.html").write_text(locator.evaluate("e => e.outerHTML"))
    except Exception:
        pass


def poll(get, ok, timeout: float = 10.0):
    """``get()`` until ``ok`` of it holds (then return it) or ``timeout`` passes
    (then return the last value, for the assertion that follows to show)."""
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


class Cells:
    """The open notebook's cells, by the names of the dict it was written from."""

    def __init__(self, page, cells: dict[str, str]) -> None:
        self.page = page
        self.index = {name: i for i, name in enumerate(cells)}

    def cell(self, name: str):
        return self.page.locator(".jp-Notebook .jp-CodeCell").nth(self.index[name])

    def prompt(self, name: str) -> str:
        return self.cell(name).locator(".jp-InputPrompt").inner_text().strip()

    def run(self, name: str) -> None:
        """Select the cell (command mode) and run it with Shift+Enter."""
        cell = self.cell(name)
        cell.scroll_into_view_if_needed()
        cell.locator(".jp-InputPrompt").click()
        self.page.keyboard.press("Escape")  # command mode, whatever had focus
        self.page.keyboard.press("Shift+Enter")

    def output_text(self, name: str) -> str:
        out = self.cell(name).locator(".jp-OutputArea")
        return out.inner_text() if out.count() else ""

    def wait_done(self, name: str, timeout: float = 60.0) -> str:
        """Wait for the cell's prompt to show an execution count; return its text."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if re.fullmatch(r"\[\d+\]:", self.prompt(name)):
                return self.output_text(name)
            time.sleep(0.1)
        shot(self.page, f"timeout-{name}")
        raise AssertionError(
            f"cell {name!r} still not done after {timeout} s; prompt "
            f"{self.prompt(name)!r}; output:\n{self.output_text(name)}"
        )

    def run_ok(self, name: str, timeout: float = 60.0) -> str:
        self.run(name)
        text = self.wait_done(name, timeout)
        assert not ERROR_RE.search(text), f"cell {name!r} failed:\n{text}"
        return text
