"""The example notebooks (examples/make_examples.py) run headless on a real cluster of
CPU engines, and leave the names they list in their metadata as the serial run does.

The serial run is the same notebook with the cells tagged ``gpucell-only`` left out
and each ``%%gpu_parallel`` line dropped, executed in a kernel of its own.
"""

from __future__ import annotations

import json
import math
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbformat.v4 import new_code_cell

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "examples" / "notebooks"

sys.path.insert(0, str(ROOT / "examples"))
try:
    from make_examples import NOTEBOOKS as SPECS
    from make_examples import build
finally:
    sys.path.pop(0)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_example_notebook_is_generated_from_its_script(name):
    on_disk = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    built = build(name)
    assert [c.source for c in on_disk.cells] == [c.source for c in built.cells]
    assert on_disk.metadata["gpucell_example"] == built.metadata["gpucell_example"]


def _dump_cell(names: list[str], out: Path) -> nbformat.NotebookNode:
    return new_code_cell(
        "import pickle as _pickle\n"
        f"with open({str(out)!r}, 'wb') as _f:\n"
        f"    _pickle.dump({{_n: globals()[_n] for _n in {names!r}}}, _f)"
    )


def _serial(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook as the user would run it without gpucell."""
    nb = nbformat.from_dict(json.loads(json.dumps(nb)))
    keep = []
    for cell in nb.cells:
        if "gpucell-only" in cell.metadata.get("tags", []):
            continue
        if cell.cell_type == "code" and cell.source.startswith("%%gpu_parallel"):
            cell.source = cell.source.split("\n", 1)[1]
        keep.append(cell)
    nb.cells = keep
    return nb


def _start(nb: nbformat.NotebookNode, where: Path) -> subprocess.Popen:
    """Execute ``nb`` headless in a kernel of its own, in ``where``."""
    where.mkdir()
    path = where / "example.ipynb"
    nbformat.write(nb, path)
    return subprocess.Popen(
        [sys.executable, str(ROOT / "examples/run_quickstart.py"), str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _finish(proc: subprocess.Popen, where: Path) -> dict[str, Any]:
    """What the execution ``_start`` began in ``where`` says of itself."""
    try:
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, out + err[-3000:]
    summary = json.loads((where / "example.executed.summary.json").read_text())
    assert summary["error"] is None
    assert summary["cells_run"] == summary["code_cells"]
    return summary


def _same(a: Any, b: Any, where: str = "") -> None:
    """Equal as the serial run's, floats up to the engines' other thread counts."""
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        if a.is_floating_point():
            assert torch.allclose(a, b, rtol=1e-4, atol=1e-5), where
        else:
            assert torch.equal(a, b), where
    elif isinstance(a, float):
        assert isinstance(b, float) and math.isclose(a, b, rel_tol=1e-3), (where, a, b)
    elif isinstance(a, dict):
        assert isinstance(b, dict) and list(a) == list(b), where  # order too
        for k in a:
            _same(a[k], b[k], f"{where}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _same(x, y, f"{where}[{i}]")
    else:
        assert a == b, (where, a, b)


@pytest.mark.cluster
@pytest.mark.parametrize("name", sorted(SPECS))
def test_example_runs_on_engines_as_serially(name, tmp_path):
    nb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    compare = nb.metadata["gpucell_example"]["compare"]
    parallel = nbformat.from_dict(json.loads(json.dumps(nb)))
    parallel.cells.append(_dump_cell(compare, tmp_path / "parallel.pkl"))
    # the serial run, in a kernel of its own, meanwhile (its start-up, imports
    # and loops overlap the parallel run's instead of following it)
    serial = None
    if compare:  # (else the notebook compares its runs itself: --seed)
        serial = _serial(nb)
        serial.cells.append(_dump_cell(compare, tmp_path / "serial.pkl"))
        serial_run = _start(serial, tmp_path / "serial")
    try:
        summary = _finish(
            _start(parallel, tmp_path / "parallel"), tmp_path / "parallel"
        )
    finally:
        if serial is not None:
            _finish(serial_run, tmp_path / "serial")
    lines = summary["gpucell"]
    assert any("ready in" in line for line in lines), lines
    assert any(" ok" in line and "it (100%)" in line for line in lines), lines
    assert any("stopped" in line for line in lines), lines
    # each runs in about 10-20 s here; the bound leaves room for a loaded machine
    assert summary["wall_seconds"] < 90, summary
    if serial is None:
        return
    got = pickle.loads((tmp_path / "parallel.pkl").read_bytes())
    want = pickle.loads((tmp_path / "serial.pkl").read_bytes())
    for n in compare:
        _same(got[n], want[n], n)
