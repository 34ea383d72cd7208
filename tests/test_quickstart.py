"""The example notebook executes end to end on a real kernel and a real cluster."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

pytestmark = pytest.mark.cluster


def test_quickstart_notebook_runs_headless(tmp_path):
    src = ROOT / "examples/notebooks/quickstart.ipynb"
    nb = tmp_path / "quickstart.ipynb"
    nb.write_bytes(src.read_bytes())
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples/run_quickstart.py"), str(nb)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((tmp_path / "quickstart.executed.summary.json").read_text())
    assert summary["error"] is None
    assert summary["cells_run"] == summary["code_cells"]
    assert any("ready in" in line for line in summary["gpucell"])
    assert any("stopped" in line for line in summary["gpucell"])
