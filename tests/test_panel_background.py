"""The JupyterLab panel's view of ``--background`` runs (issue 30): what the
kernel sends (pending runs with progress, the names they will write, when they
started; recent ones with their outcome), the status-bar text, and the panel's
cancel button going through the run's own ``cancel()``.

The pure part builds :class:`panel_state.BackgroundFacts` by hand; the rest
starts real background runs on the session's 2-engine CPU cluster in an
in-process IPython shell and reads the state a real :class:`PanelEndpoint`
would send (no comm needed to build it)."""

from __future__ import annotations

import time

import pytest

from gpucell.kernel import background
from gpucell.kernel import panel as kpanel
from gpucell.protocol import panel as schema
from gpucell.ui import panel_state
from gpucell.ui.panel_state import BackgroundFacts


def _facts(cell, state, pending, done=0, total=10, error=None, writes=("out",)):
    return BackgroundFacts(
        cell=cell,
        state=state,
        pending=pending,
        done=done,
        total=total,
        elapsed=2.25,
        started_at=1795000000.5,
        writes=writes,
        error=error,
    )


def test_pending_runs_in_start_order_and_ended_ones_newest_first():
    view = panel_state.background_view(
        [
            _facts(2, "cancelled", False, 3),
            _facts(3, "raised", False, 1, error="ValueError: bad row"),
            _facts(4, "merged", False, 10),
            _facts(5, "running", True, 37, 120, writes=("out", "total")),
            _facts(6, "finished", True, 8, 8),
        ]
    )
    assert view is not None
    p5, p6 = view["pending"]
    assert p5 == {
        "cell": 5,
        "state": "running",
        "done": 37,
        "total": 120,
        "elapsed": 2.2,  # 2.25 rounded half to even: what the kernel shows
        "started_at": 1795000000.5,
        "writes": ["out", "total"],
        "text": "cell [5]: 37 of 120 iterations (30%), 2.2 s, running",
        "note": "",
    }
    assert p6["cell"] == 6 and "merged when a later cell uses its names" in p6["note"]
    assert [(r["cell"], r["outcome"], r["error"]) for r in view["recent"]] == [
        (4, "merged", None),
        (3, "failed", "ValueError: bad row"),
        (2, "cancelled", None),
    ]
    assert view["recent"][1]["text"].startswith("cell [3]: failed: ValueError: bad row")
    msg = panel_state.state_message(1, None, None, None, view)
    assert schema.validate(msg) == []


def test_the_status_bar_counts_pending_runs_and_their_progress():
    assert panel_state.background_status(None) == ""
    one = panel_state.background_view([_facts(5, "running", True, 37, 100)])
    assert panel_state.background_status(one) == " · 1 background run 37%"
    two = panel_state.background_view(
        [
            _facts(5, "failed", True, 10, 100, error="KeyError: 'x'"),
            _facts(6, "running", True, 0, 100),
            _facts(4, "merged", False, 5, 5),
        ]
    )
    assert panel_state.background_status(two) == " · 2 background runs 5% · 1 failed"
    ended = panel_state.background_view([_facts(4, "merged", False, 5, 5)])
    assert panel_state.background_status(ended) == ""
    assert panel_state.background_view([]) is None
    cluster = {
        "connection": {"hosts": ["h"]},
        "devices": [
            {"state": "busy", "label": "0 · h · CPU", "util": 0.5},
            {"state": "busy", "label": "1 · h · CPU", "util": 0.5},
        ],
    }
    assert panel_state.status_text(cluster, one) == (
        "gpucell: 2 CPU engines · 1 host · 50% busy · 1 background run 37%"
    )


# ---------------------------------------------------------------- real runs


@pytest.fixture
def shell(ip, cluster):
    ip.run_cell("import time")
    ep = kpanel.PanelEndpoint(ip)  # not started: no comm, no thread
    yield ip, ep
    background.shutdown()
    ep.close()


def _state(ep) -> dict:
    msg = ep.state()
    assert schema.validate(msg) == [], msg
    return msg


def _until(get, ok, timeout=20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = get()
        if ok(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


SLOW = (
    "%%gpu_parallel -b --quiet --schedule dynamic --chunksize 1\nacc = []\n"
    "for v in range(12):\n    time.sleep(0.25)\n    acc.append(v)\n"
)


@pytest.mark.cluster
def test_the_panel_shows_a_pending_run_and_cancels_it_as_run_cancel_does(shell, capsys):
    ip, ep = shell
    assert _state(ep)["background"] is None or not _state(ep)["background"]["pending"]
    before = time.time()
    assert ip.run_cell(SLOW, store_history=True).success
    bg = background.runs[-1]
    msg = _until(
        lambda: _state(ep),
        lambda m: m["background"]["pending"] and m["background"]["pending"][0]["done"],
    )
    (p,) = msg["background"]["pending"]
    assert p["cell"] == bg.cell and p["state"] == "running"
    assert p["writes"] == ["acc", "v"] and p["total"] == 12 and 0 < p["done"] < 12
    assert before - 1 <= p["started_at"] <= time.time()
    assert " · 1 background run " in msg["status"] and msg["status"].endswith("%")
    assert msg["run"] is None  # the run's progress is shown in its own row

    capsys.readouterr()
    ok, text = ep._serve("cancel", {"type": "cancel", "cell": bg.cell})
    assert ok, text
    # what run.cancel() prints: the chunks kept for --resume, then the line
    last = text.splitlines()[-1]
    assert last.startswith(
        f"gpucell: the background run of cell [{bg.cell}] was cancelled"
    )
    assert last.endswith("nothing was merged.") and "--resume" in text
    assert bg.state == "cancelled" and not bg.pending
    assert ip.user_ns["acc"] == []
    msg = _state(ep)
    assert msg["background"]["pending"] == []
    assert msg["background"]["recent"][0]["cell"] == bg.cell
    assert msg["background"]["recent"][0]["outcome"] == "cancelled"
    assert "background run" not in msg["status"]

    ok, text = ep._serve("cancel", {"type": "cancel", "cell": bg.cell})
    assert not ok and f"no pending background run of cell [{bg.cell}]" in text


@pytest.mark.cluster
def test_the_panel_shows_a_merged_and_a_failed_run_with_its_first_line(shell):
    ip, ep = shell
    quick = (
        "%%gpu_parallel -b --quiet\nsq = []\nfor v in range(6):\n    sq.append(v * v)\n"
    )
    assert ip.run_cell(quick, store_history=True).success
    ok_run = background.runs[-1]
    ip.run_cell("n = len(sq)", store_history=True)  # waits and merges
    assert ip.user_ns["n"] == 6 and ok_run.state == "merged"
    bad = (
        "%%gpu_parallel -b --quiet\nres = []\nfor v in range(6):\n"
        "    if v == 4:\n        raise ValueError(f'bad row {v}\\nmore text')\n"
        "    res.append(v)\n"
    )
    assert ip.run_cell(bad, store_history=True).success
    bad_run = background.runs[-1]
    msg = _until(
        lambda: _state(ep),
        lambda m: (
            m["background"]["pending"]
            and m["background"]["pending"][0]["state"] == "failed"
        ),
    )
    (p,) = msg["background"]["pending"]
    assert p["cell"] == bad_run.cell and "failed: ValueError: bad row 4" in p["note"]
    assert msg["status"].endswith("· 1 failed")
    ip.run_cell("print(res)", store_history=True)  # raises the run's error
    assert bad_run.state == "raised"
    recent = _state(ep)["background"]["recent"]
    assert [(r["cell"], r["outcome"]) for r in recent[:2]] == [
        (bad_run.cell, "failed"),
        (ok_run.cell, "merged"),
    ]
    assert recent[0]["error"] == "ValueError: bad row 4"
    assert "6 of 6 iterations" in recent[1]["text"]
