"""GpuCell settings come from ipython_config.py, like any IPython configurable."""

from __future__ import annotations

import os
import subprocess
import sys


def test_ipython_config_file_sets_gpucell_defaults(tmp_path):
    ipdir = tmp_path / "ipython"
    profile = ipdir / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_config.py").write_text(
        "c.GpuCell.per_gpu = 3\nc.GpuCell.schedule = 'dynamic'\n"
    )
    ipython = os.path.join(os.path.dirname(sys.executable), "ipython")
    cell = (
        "%load_ext gpucell\n"
        "from gpucell.config import settings\n"
        "print('GOT', settings().per_gpu, settings().schedule)\n"
    )
    out = subprocess.run(
        [ipython, f"--ipython-dir={ipdir}", "--no-banner", "-c", cell],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "GOT 3 dynamic" in out, out
