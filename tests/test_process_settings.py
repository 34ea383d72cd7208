"""Process-wide settings changed behind a call (``engine/processstate.py``):
a notebook function the loop calls sets ``os.environ[k]``, ``os.chdir``s,
adds to ``sys.path`` or calls ``np.seterr``.  Serially the notebook's process
keeps the change; on the engines it would stay there, so the run fails with
the setting named and nothing merged, and the engine's own settings are put
back.  A change that leaves the engine as the kernel already is (an import
setting a variable the kernel has) is no change."""

from __future__ import annotations

import os

import pytest

from gpucell.errors import InputChanged

pytestmark = pytest.mark.cluster

HELPERS = """
import os, sys
import numpy as np
def set_env(w):
    os.environ["GPUCELL_TEST_WORD"] = w
def go_to(d):
    os.chdir(d)
def add_path(d):
    sys.path.append(d)
def quiet():
    np.seterr(divide="ignore")
out = []
"""

CELLS = {
    "os.environ": "for w in ['a', 'b', 'c']:\n    out.append(w)\n    set_env(w)\n",
    "os.getcwd()": "for k in range(3):\n    out.append(k)\n    go_to(folder)\n",
    "sys.path": (
        "for k in range(3):\n    out.append(k)\n    add_path(folder + '/lib')\n"
    ),
    "np.seterr": "for k in range(3):\n    out.append(k)\n    quiet()\n",
}


@pytest.fixture
def shell(ip, cluster, tmp_path):
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    ip.run_cell(HELPERS).raise_error()
    ip.user_ns["folder"] = str(tmp_path)
    yield ip
    ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


@pytest.mark.parametrize("setting", list(CELLS))
def test_a_setting_changed_behind_a_call_fails_the_run_unmerged(shell, setting):
    cwd = os.getcwd()
    with pytest.raises(InputChanged, match="a setting of the whole process") as err:
        shell.run_cell_magic("gpu_parallel", "--quiet", CELLS[setting])
    assert setting.split("(")[0].split(".")[-1] in str(err.value)
    assert shell.user_ns["out"] == [] and os.getcwd() == cwd
    assert "GPUCELL_TEST_WORD" not in os.environ
    # the engines' own settings were put back: a later cell does not see them
    shell.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "for k in range(4):\n    out.append((os.environ.get('GPUCELL_TEST_WORD'),"
        " folder + '/lib' in sys.path))\n",
    )
    assert set(shell.user_ns["out"]) == {(None, False)}


def test_setting_what_the_kernel_already_has_runs(shell, monkeypatch):
    # (as scikit-learn's import setting KMP_DUPLICATE_LIB_OK on an engine,
    # where the kernel imported it before: serially nothing changes)
    monkeypatch.setenv("GPUCELL_TEST_WORD", "b")
    cell = "for w in ['b', 'b']:\n    out.append(w)\n    set_env(w)\n"
    shell.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert shell.user_ns["out"] == ["b", "b"]
