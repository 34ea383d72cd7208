"""`import gpucell` and `%load_ext gpucell` stay cheap: heavy deps load on use."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ["ipyparallel", "pynvml", "ipywidgets", "torch", "zmq"]


def _loaded_after(code: str) -> dict[str, bool]:
    probe = f"""
import sys, json
{code}
print(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))
"""
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def test_import_gpucell_imports_nothing_heavy():
    assert _loaded_after("import gpucell") == dict.fromkeys(HEAVY, False)


def test_load_ext_imports_nothing_heavy():
    code = """
from IPython.testing.globalipapp import start_ipython
ip = start_ipython()
ip.run_line_magic("load_ext", "gpucell")
assert "gpu_cluster" in ip.magics_manager.magics["line"]
"""
    loaded = _loaded_after(code)
    assert not loaded["ipyparallel"]
    assert not loaded["pynvml"]
    assert not loaded["ipywidgets"]
    assert not loaded["torch"]
