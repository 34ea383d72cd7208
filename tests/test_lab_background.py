"""``%%gpu_parallel --background`` in a real JupyterLab, driven through Chromium
(issue 30's browser test).

- the background cell returns at once; its widget keeps updating while
  another (unrelated) cell runs: at least 3 different counts seen during it;
- the GPU cluster panel shows the pending run (its cell, progress that moves,
  the names it writes, when it started, a Cancel button) and the status bar
  says "1 background run N%";
- a cell that reads the run's result waits, merges, sees the serial value;
  the panel then lists the run as merged and the status bar no longer counts it;
- the panel's Cancel button cancels a second pending run through its own
  ``cancel()`` (the reply is the line ``run.cancel()`` prints), and the panel
  lists it as cancelled.

Screenshots go to ``build/browser/lab-bg-*.png`` (gitignored).
"""

from __future__ import annotations

import json
import re
import time

from lab_browser import (
    LAB_EXTENSION_MARKS,
    SHOTS,
    Cells,
    dump,
    poll,
    shot,
    write_notebook,
)

pytestmark = list(LAB_EXTENSION_MARKS)

NOTEBOOK = "gpucell_background.ipynb"
N_ITER, ITER_S = 48, 0.5  # 2 engines: about 12 s
OTHER_S = 5.0

CELLS = {
    "start": "%load_ext gpucell\n%gpu_cluster start -n 2 --gpus none\nimport time",
    "bg": (
        "%%gpu_parallel -b\nsquares = []\n"
        f"for i in range({N_ITER}):\n    time.sleep({ITER_S})\n"
        "    squares.append(i * i)"
    ),
    "other": (
        "t0 = time.time()\n"
        f"while time.time() - t0 < {OTHER_S}:\n    time.sleep(0.05)\n"
        "print('OTHER DONE')"
    ),
    "check": f"print('RESULT', squares == [i * i for i in range({N_ITER})])",
    "bg2": (
        "%%gpu_parallel -b\ncubes = []\nfor i in range(40):\n"
        "    time.sleep(1.0)\n    cubes.append(i ** 3)"
    ),
    "stop": "%gpu_cluster stop",
}

STATUS = "#jp-main-statusbar .gpucell-status"
PANEL = "#gpucell-panel"
OVERALL_RE = r"^[\d,]+/[\d,]+ it \(\d+%\)"

PROBE = """
([cell, overallRe]) => {
  const re = new RegExp(overallRe);
  const label = [...cell.querySelectorAll('.widget-html-content')]
    .map(h => h.textContent.trim()).find(t => re.test(t));
  const root = document.querySelector('#gpucell-panel');
  const status = document.querySelector('#jp-main-statusbar .gpucell-status');
  const box = root && root.querySelector('.gpucell-background');
  const text = (e, sel) => {
    const x = e.querySelector(sel);
    return x && x.offsetParent !== null ? x.textContent.trim() : null;
  };
  return {
    widget: label || null,
    status: status ? status.textContent.trim() : null,
    shown: !!box && box.offsetParent !== null,
    title: box ? text(box, '.gpucell-background-title') : null,
    pending: box ? [...box.querySelectorAll('.gpucell-bg-run')].map(r => ({
      cell: r.getAttribute('data-cell'),
      state: r.getAttribute('data-state'),
      text: text(r, '.gpucell-bg-text'),
      writes: text(r, '.gpucell-bg-writes'),
      started: text(r, '.gpucell-bg-started'),
      cancel: !!r.querySelector('button.gpucell-bg-cancel'),
    })) : [],
    recent: box ? [...box.querySelectorAll('.gpucell-bg-ended')].map(r => ({
      cell: r.getAttribute('data-cell'),
      outcome: r.getAttribute('data-outcome'),
      text: r.textContent.trim(),
    })) : [],
    reply: root ? text(root, '.gpucell-reply') : null,
  };
}
"""


def _count(label: str | None) -> int | None:
    return None if label is None else int(label.split("/", 1)[0].replace(",", ""))


def _done_of(row: dict) -> int:
    m = re.search(r": (\d+) of \d+ iterations", row.get("text") or "")
    return int(m.group(1)) if m else -1


def _cell_no(cells: Cells, name: str) -> str:
    m = re.fullmatch(r"\[(\d+)\]:", cells.prompt(name))
    assert m, cells.prompt(name)
    return m.group(1)


def test_a_background_cell_in_lab_its_widget_and_the_panel(lab, page):
    write_notebook(lab.root / NOTEBOOK, CELLS)
    cells = Cells(page, CELLS)
    page.goto(lab.lab_url(NOTEBOOK))
    page.locator(".jp-Notebook .jp-CodeCell").nth(len(CELLS) - 1).wait_for()
    page.locator("#jp-main-statusbar").get_by_text("Idle").first.wait_for(
        timeout=60_000
    )
    cells.run_ok("start", timeout=120)
    page.locator(STATUS).click()  # opens the panel
    handle = cells.cell("bg").element_handle()

    def probe() -> dict:
        return page.evaluate(PROBE, [handle, OVERALL_RE])

    # ---- the background cell returns at once; the panel shows the pending run
    t0 = time.monotonic()
    out = cells.run_ok("bg", timeout=30)
    returned_s = time.monotonic() - t0
    assert "runs in the background" in out, out
    bg_cell = _cell_no(cells, "bg")
    p = poll(probe, lambda p: p["pending"] and _done_of(p["pending"][0]) >= 0, 20)
    shot(page, "lab-bg-00-pending")
    assert p["shown"] and p["title"] == "1 background run pending", p
    (row,) = p["pending"]
    assert row["cell"] == bg_cell and row["state"] == "running", row
    assert row["writes"] == "writes i, squares", row
    assert re.fullmatch(r"started \d\d:\d\d:\d\d", row["started"] or ""), row
    assert row["cancel"], row
    assert re.search(r" · 1 background run \d+%$", p["status"] or ""), p

    # ---- another cell runs: the widget and the panel keep moving meanwhile
    cells.run("other")
    during: list[dict] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        running = cells.prompt("other") == "[*]:"
        if running:
            got = probe()
            got["t"] = round(time.monotonic() - t0, 2)
            during.append(got)
            if len(during) == 10:
                shot(page, "lab-bg-01-other-running")
        elif re.fullmatch(r"\[\d+\]:", cells.prompt("other")):
            break
        time.sleep(0.2)
    text = cells.wait_done("other", 30)
    assert "OTHER DONE" in text, text
    (SHOTS / "lab-bg-polls.json").write_text(
        json.dumps({"returned_s": round(returned_s, 2), "polls": during}, indent=1)
    )
    widget = [c for c in (_count(d["widget"]) for d in during) if c is not None]
    panel = [_done_of(d["pending"][0]) for d in during if d["pending"]]
    assert len(set(widget)) >= 3, f"widget counts during the other cell: {widget}"
    assert widget == sorted(widget), widget
    assert len(set(panel)) >= 3, f"panel counts during the other cell: {panel}"
    assert panel == sorted(panel), panel

    # ---- a cell that reads the result waits, merges, gets the serial value
    text = cells.run_ok("check", timeout=60)
    assert "RESULT True" in text, text
    assert f"background run of cell [{bg_cell}]" in text, text
    p = poll(probe, lambda p: not p["pending"] and p["recent"], 20)
    shot(page, "lab-bg-02-merged")
    assert p["recent"][0]["cell"] == bg_cell, p
    assert p["recent"][0]["outcome"] == "merged", p
    assert f"{N_ITER} of {N_ITER} iterations" in p["recent"][0]["text"], p
    assert "background run" not in (p["status"] or ""), p
    assert p["title"] == "Background runs", p
    final = poll(probe, lambda p: _count(p["widget"]) == N_ITER, 10)
    assert _count(final["widget"]) == N_ITER, final

    # ---- the panel's Cancel button cancels a pending run
    cells.run_ok("bg2", timeout=30)
    bg2 = _cell_no(cells, "bg2")
    poll(probe, lambda p: any(r["cell"] == bg2 for r in p["pending"]), 20)
    page.locator(
        f"{PANEL} .gpucell-bg-run[data-cell='{bg2}'] button.gpucell-bg-cancel"
    ).click()
    p = poll(
        probe,
        lambda p: (
            not p["pending"]
            and p["recent"]
            and p["recent"][0]["outcome"] == "cancelled"
        ),
        20,
    )
    shot(page, "lab-bg-03-cancelled")
    if p["pending"] or not p["recent"]:
        dump(page.locator(PANEL), "lab-bg-03-cancelled")
    assert p["recent"][0]["cell"] == bg2 and p["recent"][0]["outcome"] == "cancelled", p
    assert f"the background run of cell [{bg2}] was cancelled" in (p["reply"] or ""), p
    assert "nothing was merged" in p["reply"], p

    cells.run_ok("stop", timeout=60)
