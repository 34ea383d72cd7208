"""gpucell in Jupyter Notebook 7, driven through Chromium.

Notebook 7 is built from JupyterLab's components and loads the same prebuilt
lab extensions, with one document per page and no status bar.  Checked as a
user meets it:

- the ``%%gpu_parallel`` widget (core ipywidgets only) shows its overall row and
  one row per engine (2), ends at every iteration done, and the results are right;
- ``%gpu_cluster select``'s checkboxes work: unticking engine 1 makes the next
  cell run on engine 0 only;
- the panel: the View menu's "GPU cluster (gpucell)" opens it in the right side
  bar, where it shows the 2 engines, the last run and the charts; a click on
  its timeline opens it large in a dialog (Notebook 7's main area holds only
  the notebook).

Screenshots go to ``build/browser/nb7-*.png`` (gitignored).
"""

from __future__ import annotations

import time

import pytest
from lab_browser import ERROR_RE, Cells, dump, poll, shot, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]

NOTEBOOK = "gpucell_nb7.ipynb"
N_ITER, ITER_S = 20, 0.25

CELLS = {
    "start": "%load_ext gpucell\n%gpu_cluster start -n 2 --gpus none",
    "long": (
        "%%gpu_parallel\nimport time\nsquares = []\n"
        f"for i in range({N_ITER}):\n    time.sleep({ITER_S})\n"
        "    squares.append(i * i)"
    ),
    "check_long": (
        "import gpucell\n"
        f'print("RESULT", squares == [i * i for i in range({N_ITER})], '
        "sorted(gpucell.last_run.engines))"
    ),
    "select": "%gpu_cluster select",
    "short": "%%gpu_parallel\ncubes = []\nfor i in range(8):\n    cubes.append(i ** 3)",
    "check_short": (
        'print("ENGINES", sorted(gpucell.last_run.engines), '
        "cubes == [i ** 3 for i in range(8)])"
    ),
    "stop": "%gpu_cluster stop",
}

#: the widget's overall label, e.g. "12/20 it (60%) · 0:03 · ..."
OVERALL_RE = r"^[\d,]+/[\d,]+ it \(\d+%\)"

PROBE_WIDGET = """
([cell, overallRe]) => {
  const re = new RegExp(overallRe);
  const htmls = [...cell.querySelectorAll('.widget-html-content')];
  const label = htmls.find(h => re.test(h.textContent.trim()));
  if (!label) return null;
  const top = label.closest('.widget-hbox').parentElement.closest('.widget-vbox');
  const rows = [...top.querySelectorAll('.widget-hbox')].filter(b => {
    const first = b.querySelector('.widget-html-content');
    return first && /^\\d+ · /.test(first.textContent.trim());
  });
  return {
    label: label.textContent.trim(),
    rows: rows.map(r => [...r.querySelectorAll('.widget-html-content')]
                        .map(h => h.textContent.trim())),
  };
}
"""

PROBE_PANEL = """
() => {
  const root = document.querySelector('#gpucell-panel');
  if (!root) return {exists: false};
  return {
    exists: true,
    visible: root.offsetParent !== null,
    rows: [...root.querySelectorAll('.gpucell-device')]
      .map(r => r.getAttribute('data-engine')),
    last: [...root.querySelectorAll('.gpucell-last-line')]
      .map(l => l.textContent.trim()),
    charts: [...root.querySelectorAll('img.gpucell-chart')]
      .map(i => Number(i.getAttribute('data-points') || 0)),
  };
}
"""


@pytest.fixture(scope="module")
def lab(chromium: str, tmp_path_factory: pytest.TempPathFactory):
    """Jupyter Notebook 7 (this module's ``page`` fixture opens it)."""
    nb = pytest.importorskip("notebook", reason="needs notebook>=7 (test extra)")
    if int(nb.__version__.split(".")[0]) < 7:
        pytest.skip(f"needs Jupyter Notebook 7, not {nb.__version__}")
    from lab_server import LabServer

    server = LabServer(tmp_path_factory.mktemp("nb7"), app="notebook").start()
    try:
        yield server
    finally:
        stragglers = server.stop()
        assert not stragglers, (
            f"processes outlived the Notebook server's shutdown by 10 s: {stragglers}"
        )


def _run_first(cells: Cells, name: str, timeout: float = 120.0) -> str:
    """Run the first cell once the kernel takes it: a Shift+Enter before the
    page is connected to its kernel is dropped without a word (the prompt stays
    empty), so it is pressed again until the prompt says it ran or runs."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cells.run(name)
        p = poll(lambda: cells.prompt(name), lambda p: p not in ("", "[ ]:"), 10)
        if p not in ("", "[ ]:"):
            return cells.wait_done(name, max(1.0, deadline - time.monotonic()))
    shot(cells.page, f"nb7-timeout-{name}")
    raise AssertionError(f"Notebook 7 never ran cell {name!r} in {timeout} s")


def _panel(page) -> dict:
    return page.evaluate(PROBE_PANEL)


def test_the_widget_and_the_panel_in_notebook_7(lab, page):
    write_notebook(lab.root / NOTEBOOK, CELLS)
    cells = Cells(page, CELLS)
    page.goto(lab.notebook_url(NOTEBOOK))
    cells.cell("stop").wait_for(timeout=60_000)
    shot(page, "nb7-00-opened")

    text = _run_first(cells, "start")
    assert not ERROR_RE.search(text), f"the cluster did not start:\n{text}"

    # ---- the panel: Notebook 7's View menu, right side bar
    page.locator(".lm-MenuBar-item", has_text="View").click()
    entry = page.locator(".lm-Menu-item", has_text="GPU cluster (gpucell)")
    entry.wait_for(timeout=15_000)
    entry.click()
    p = poll(
        lambda: _panel(page),
        lambda p: p.get("visible") and p.get("rows") == ["0", "1"],
        30,
    )
    shot(page, "nb7-01-panel")
    assert p.get("visible") and p.get("rows") == ["0", "1"], p

    # ---- the widget while a ~3 s cell runs, and at its end
    cells.run("long")
    text = cells.wait_done("long", 90)
    assert not ERROR_RE.search(text), text
    handle = cells.cell("long").element_handle()
    final = poll(
        lambda: page.evaluate(PROBE_WIDGET, [handle, OVERALL_RE]),
        lambda w: w is not None and w["label"].startswith(f"{N_ITER}/{N_ITER} it"),
        30,
    )
    shot(page, "nb7-02-widget", cells.cell("long"))
    dump(cells.cell("long"), "nb7-02-widget")
    assert final is not None, f"no gpucell widget in Notebook 7:\n{text}"
    assert final["label"].startswith(f"{N_ITER}/{N_ITER} it (100%)"), final
    assert len(final["rows"]) == 2 and all(r[-1] == "done" for r in final["rows"]), (
        final
    )
    text = cells.run_ok("check_long")
    assert "RESULT True [0, 1]" in text, text

    # the panel followed the run: its summary and charts
    p = poll(
        lambda: _panel(page),
        lambda p: (
            any(f"{N_ITER} iterations on 2 engines" in x for x in p["last"])
            and p["charts"]
            and min(p["charts"]) > 0
        ),
        30,
    )
    shot(page, "nb7-03-panel-after-run")
    assert any(f"{N_ITER} iterations on 2 engines" in x for x in p["last"]), p
    assert p["charts"] and min(p["charts"]) > 0, p

    # ---- the timeline opens large: Notebook 7's main area takes no second
    # widget, so a dialog shows it
    page.locator("#gpucell-panel img.gpucell-timeline").click()
    big = page.locator(".jp-Dialog img.gpucell-timeline-large")
    big.wait_for(timeout=15_000)
    size = poll(
        lambda: big.evaluate(
            "i => [i.naturalWidth, i.getBoundingClientRect().width,"
            " document.querySelector('#gpucell-panel img.gpucell-timeline')"
            ".getBoundingClientRect().width, i.getBoundingClientRect().right,"
            " i.closest('.jp-Dialog-content').getBoundingClientRect().right]"
        ),
        lambda s: s[0] > 0,
    )
    shot(page, "nb7-timeline-large")
    natural, shown, thumb, right, dialog_right = size
    assert natural >= 860 and shown >= natural and shown > 2 * thumb, size
    assert right <= dialog_right, f"the dialog cuts the timeline off: {size}"
    page.locator(".jp-Dialog .jp-mod-accept").click()
    big.wait_for(state="detached", timeout=15_000)

    # ---- the selector's checkboxes
    cells.run_ok("select")
    sel = cells.cell("select")
    sel.locator(".widget-checkbox").nth(1).wait_for()
    sel.locator(".widget-checkbox input[type=checkbox]").nth(1).click()
    sel.get_by_text("later cells run on engine 0").wait_for(timeout=15_000)
    cells.run_ok("short")
    text = cells.run_ok("check_short")
    assert "ENGINES [0] True" in text, text
    shot(page, "nb7-04-selected")

    cells.run_ok("stop")
    p = poll(lambda: _panel(page), lambda p: not p.get("rows"), 30)
    assert not p.get("rows"), p
