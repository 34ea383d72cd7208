"""The in-cell widgets in a real front end: JupyterLab driven through Chromium.

The test starts its own JupyterLab on loopback (:mod:`tests.lab_server`), opens a
notebook in Debian's ``chromium`` through Playwright, and runs the cells with Lab's
own keyboard commands, as a user would.  It then reads what ipywidgets rendered:

- the ``%%gpu_parallel`` widget shows the overall row and one row per engine (2);
- its overall label advances at least 3 times while the ~10 s cell runs;
- at the end it shows every iteration done, and the cell's results are right;
- the saved notebook holds the summary as that output's ``text/plain`` (the
  fallback nbconvert and GitHub show), and Lab shows no printed copy of it;
- unticking an engine in ``%gpu_cluster select`` makes the next cell run on the
  other engine only (``gpucell.last_run.engines``).

Screenshots go to ``build/browser/`` (gitignored) for a person to look at.  The test
skips, saying why, where Chromium or Playwright is missing; CI installs both.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
from lab_browser import ERROR_RE, SHOTS, Cells, dump, poll, shot, write_notebook

pytestmark = [pytest.mark.browser, pytest.mark.timeout(240)]

NOTEBOOK = "gpucell_browser.ipynb"

#: iterations of the long cell, and seconds each: 2 engines -> about 6 s (the
#: widget redraws about once a second: 6-7 distinct counts, 3 needed)
N_ITER, ITER_S = 24, 0.5
#: DOM poll period while the long cell runs
POLL_S = 0.2

# The notebook, one entry per cell; the test refers to cells by these names.
CELLS = {
    "start": "%load_ext gpucell\n%gpu_cluster start -n 2 --gpus none",
    "setup": f"import time\nimport gpucell\nN = {N_ITER}",
    "long": (
        "%%gpu_parallel\n"
        "squares = []\n"
        "for i in range(N):\n"
        f"    time.sleep({ITER_S})\n"
        "    squares.append(i * i)"
    ),
    "check_long": (
        'print("RESULT", squares == [i * i for i in range(N)], '
        "sorted(gpucell.last_run.engines))"
    ),
    "select": "%gpu_cluster select",
    "short": (
        "%%gpu_parallel\ncubes = []\nfor i in range(8):\n    cubes.append(i ** 3)"
    ),
    "check_short": (
        'print("ENGINES", sorted(gpucell.last_run.engines), '
        "cubes == [i ** 3 for i in range(8)])"
    ),
    "stop": "%gpu_cluster stop",
}
INDEX = {name: i for i, name in enumerate(CELLS)}

# --------------------------------------------------------------- DOM probes
#
# What JupyterLab 4 + ipywidgets 8 render: each widget view is an element with
# class ``jupyter-widgets`` plus its kind (``widget-vbox``, ``widget-hbox``,
# ``widget-html`` whose text is in ``.widget-html-content``, ``widget-hprogress``
# with a ``.progress-bar`` child sized by ``width: x%``, ``widget-checkbox`` with
# an ``input[type=checkbox]``).  The probes look for gpucell's widget by its own
# texts rather than by position, so a reordered layout still passes.

#: the overall label, e.g. "12/40 it (30%) · 0:03 · ETA 0:07 · 4.00 it/s"
OVERALL_RE = r"^[\d,]+/[\d,]+ it \(\d+%\)"

PROBE_PROGRESS = """
([cell, overallRe]) => {
  const re = new RegExp(overallRe);
  const htmls = [...cell.querySelectorAll('.widget-html-content')];
  const label = htmls.find(h => re.test(h.textContent.trim()));
  if (!label) return null;
  const overall = label.closest('.widget-hbox');
  const bar = overall.querySelector('.progress .progress-bar');
  const top = overall.parentElement.closest('.widget-vbox');
  // device rows: an hbox whose first cell reads "<engine id> · <host> · <device>"
  const rows = [...top.querySelectorAll('.widget-hbox')].filter(b => {
    const first = b.querySelector('.widget-html-content');
    return first && /^\\d+ · /.test(first.textContent.trim());
  });
  return {
    label: label.textContent.trim(),
    bar: bar ? bar.style.width : null,
    barClass: bar ? bar.className : null,
    rows: rows.map(r => [...r.querySelectorAll('.widget-html-content')]
                        .map(h => h.textContent.trim())),
  };
}
"""

PROBE_SELECTOR = """
(cell) => {
  const boxes = [...cell.querySelectorAll('.widget-checkbox')];
  const notes = [...cell.querySelectorAll('.widget-html-content')]
    .map(h => h.textContent.trim()).filter(t => t.startsWith('later cells'));
  return {
    boxes: boxes.map(b => ({
      // ipywidgets puts a zero-width space before a checkbox's description
      label: b.textContent.replace(/\u200b/g, '').trim(),
      checked: b.querySelector('input[type=checkbox]').checked,
    })),
    note: notes.length ? notes[0] : null,
  };
}
"""


# ------------------------------------------------------------------ helpers


def _write_notebook(root: Path) -> None:
    write_notebook(root / NOTEBOOK, CELLS)


def _cell(page, name: str):
    return Cells(page, CELLS).cell(name)


def _prompt(page, name: str) -> str:
    return Cells(page, CELLS).prompt(name)


def _run(page, name: str) -> None:
    Cells(page, CELLS).run(name)


def _wait_done(page, name: str, timeout: float = 60.0) -> str:
    return Cells(page, CELLS).wait_done(name, timeout)


def _output_text(page, name: str) -> str:
    return Cells(page, CELLS).output_text(name)


def _assert_no_error(name: str, text: str) -> None:
    assert not ERROR_RE.search(text), f"cell {name!r} failed:\n{text}"


_shot, _poll, _dump = shot, poll, dump


def _saved_outputs(root: Path, name: str) -> list[str]:
    """The text of cell ``name``'s outputs in the notebook file Lab saved: a
    widget's display data by its ``text/plain`` (only where it comes with the
    widget view), a stream by its text."""
    try:
        nb = json.loads((root / NOTEBOOK).read_text())
        outputs = nb["cells"][INDEX[name]]["outputs"]
    except (OSError, ValueError, KeyError, IndexError):
        return []
    texts = []
    for o in outputs:
        data = o.get("data", {})
        if "application/vnd.jupyter.widget-view+json" in data:
            texts.append("".join(data.get("text/plain", "")))
        elif o.get("output_type") == "stream":
            texts.append("".join(o.get("text", "")))
    return texts


# --------------------------------------------------------------------- test


def test_progress_widget_and_device_selector_in_jupyterlab(lab, page):
    _write_notebook(lab.root)
    page.goto(lab.lab_url(NOTEBOOK))
    page.locator(".jp-Notebook .jp-CodeCell").nth(len(CELLS) - 1).wait_for()
    # the kernel is up once the status bar names it idle
    page.locator("#jp-main-statusbar").get_by_text("Idle").first.wait_for(
        timeout=60_000
    )
    _shot(page, "00-opened")

    for name in ("start", "setup"):
        _run(page, name)
        text = _wait_done(page, name, timeout=90)
        _assert_no_error(name, text)

    # ---- the long cell: poll the widget while it runs
    long_cell = _cell(page, "long")
    _run(page, "long")
    handle = long_cell.element_handle()
    seen: list[dict] = []
    mid_shot = False
    t0 = time.monotonic()
    while time.monotonic() - t0 < 60:
        running = _prompt(page, "long") == "[*]:"
        probe = page.evaluate(PROBE_PROGRESS, [handle, OVERALL_RE])
        if probe is not None and running:
            probe["t"] = round(time.monotonic() - t0, 2)
            seen.append(probe)
            done = int(probe["label"].split("/", 1)[0].replace(",", ""))
            if not mid_shot and 0 < done < N_ITER:
                _shot(page, "01-progress-running")
                _shot(page, "01-progress-running-widget", long_cell)
                mid_shot = True
        if not running and re.fullmatch(r"\[\d+\]:", _prompt(page, "long")):
            break
        time.sleep(POLL_S)
    elapsed = time.monotonic() - t0
    text = _wait_done(page, "long")
    _assert_no_error("long", text)
    # the widget's last comm messages may trail the execute reply by a moment
    final = _poll(
        lambda: page.evaluate(PROBE_PROGRESS, [handle, OVERALL_RE]),
        lambda p: p is not None and p["label"].startswith(f"{N_ITER}/"),
    )
    _shot(page, "02-progress-final")
    _shot(page, "02-progress-final-widget", long_cell)
    _dump(long_cell, "02-progress-final-widget")
    (SHOTS / "progress-polls.json").write_text(
        json.dumps({"elapsed_s": round(elapsed, 2), "polls": seen}, indent=1)
    )

    assert seen, f"no progress widget appeared while the cell ran; output:\n{text}"
    assert all(len(p["rows"]) == 2 for p in seen), [p["rows"] for p in seen[:3]]
    labels = [p["label"] for p in seen]
    counts = [int(lb.split("/", 1)[0].replace(",", "")) for lb in labels]
    assert counts == sorted(counts), f"progress went backwards: {counts}"
    advances = len(set(counts)) - 1
    assert advances >= 3, (
        f"the progress advanced {advances} times in {elapsed:.1f} s "
        f"({len(seen)} polls): {sorted(set(labels))}"
    )
    assert len({p["bar"] for p in seen}) >= 3, {p["bar"] for p in seen}

    assert final is not None, f"the widget vanished after the run:\n{text}"
    assert final["label"].startswith(f"{N_ITER}/{N_ITER} it (100%)"), final
    assert "ok" in final["label"], final
    assert final["bar"] == "100%", final
    assert len(final["rows"]) == 2, final["rows"]
    assert all(r[-1] == "done" for r in final["rows"]), final["rows"]
    per_engine = [int(r[1].split(" it", 1)[0].replace(",", "")) for r in final["rows"]]
    assert sum(per_engine) == N_ITER, final["rows"]
    # the summary is the widget output's own text/plain (what nbconvert and
    # GitHub show), updated in place when the run ends; Lab draws the widget
    # alone, with no printed copy of the same figures under it
    assert "engine  host  device" not in text, text
    page.keyboard.press("Control+s")
    saved = _poll(
        lambda: _saved_outputs(lab.root, "long"),
        lambda outs: any(f"gpucell: {N_ITER}/{N_ITER} it (100%)" in t for t in outs),
    )
    summary = [t for t in saved if t.startswith(f"gpucell: {N_ITER}/{N_ITER} it")]
    assert len(summary) == 1, saved
    assert summary[0].splitlines()[1].split()[:3] == ["engine", "host", "device"]
    assert len(summary[0].splitlines()) == 4, summary  # the overall line + 2 rows
    assert all(r[-1] == "done" for r in map(str.split, summary[0].splitlines()[2:]))

    _run(page, "check_long")
    text = _wait_done(page, "check_long")
    assert "RESULT True [0, 1]" in text, text

    # ---- the selector: untick engine 1, the next cell runs on engine 0 only
    _run(page, "select")
    _wait_done(page, "select")
    sel_cell = _cell(page, "select")
    sel_handle = sel_cell.element_handle()
    sel_cell.locator(".widget-checkbox").nth(1).wait_for()
    before = page.evaluate(PROBE_SELECTOR, sel_handle)
    _shot(page, "03-select-before", sel_cell)
    assert len(before["boxes"]) == 2, before
    assert all(b["checked"] for b in before["boxes"]), before
    assert before["boxes"][1]["label"].startswith("1 · "), before
    sel_cell.locator(".widget-checkbox input[type=checkbox]").nth(1).click()
    sel_cell.get_by_text("later cells run on engine 0").wait_for(timeout=10_000)
    after = page.evaluate(PROBE_SELECTOR, sel_handle)
    _shot(page, "04-select-after", sel_cell)
    assert [b["checked"] for b in after["boxes"]] == [True, False], after

    _run(page, "short")
    text = _wait_done(page, "short")
    _assert_no_error("short", text)
    short = _poll(
        lambda: page.evaluate(
            PROBE_PROGRESS, [_cell(page, "short").element_handle(), OVERALL_RE]
        ),
        lambda p: p is not None and p["label"].startswith("8/8 it (100%)"),
    )
    assert [r[0].split(" · ", 1)[0] for r in short["rows"]] == ["0"], short
    _run(page, "check_short")
    text = _wait_done(page, "check_short")
    assert "ENGINES [0] True" in text, text
    _shot(page, "05-after-selection")

    _run(page, "stop")
    _wait_done(page, "stop")
    _shot(page, "06-stopped")
