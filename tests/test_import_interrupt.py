"""An interrupt that lands while a chunk imports a module waits for the
import to finish (engine/runtime.imports_finish_first): cut in half, the
import left a package whose submodules were loaded but not attached, and every
later cell on that engine failed (`module 'sympy' has no attribute
'printing'`) until the cluster was restarted (issue 29)."""

from __future__ import annotations

import pytest

from gpucell.errors import CellTimeout

pytestmark = pytest.mark.cluster

CELL = (
    "out = []\nfor i in range(2):\n    import slowpkg\n"
    "    out.append(slowpkg.fast.X + slowpkg.slow.Y)\n"
)


def _on_engines(cluster, fn, *args):
    return cluster.client[:].apply_sync(fn, *args)


def _add_path(d):
    import sys

    sys.path.insert(0, d)


def _forget(d):
    import sys

    for name in [m for m in sys.modules if m.split(".")[0] == "slowpkg"]:
        del sys.modules[name]
    if d in sys.path:
        sys.path.remove(d)


def test_a_timeout_during_an_import_leaves_the_module_whole(
    ip, private_cluster, tmp_path
):
    pkg = tmp_path / "slowpkg"
    pkg.mkdir()
    # absolute imports: a submodule already in sys.modules is not attached to
    # a re-imported parent, which is how a cut import breaks later cells
    (pkg / "__init__.py").write_text(
        "from slowpkg.fast import X\nfrom slowpkg.slow import Y\n"
    )
    (pkg / "fast.py").write_text("X = 1\n")
    (pkg / "slow.py").write_text("import time\ntime.sleep(1.5)\nY = 2\n")
    _on_engines(private_cluster, _add_path, str(tmp_path))
    _add_path(str(tmp_path))  # the merge binds `slowpkg` in the kernel, as serially
    # (the engines must run it: a loop measured cheap would run in the kernel)
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        with pytest.raises(CellTimeout):
            ip.run_cell_magic("gpu_parallel", "--quiet --timeout 0.5", CELL)
        ip.run_cell_magic("gpu_parallel", "--quiet", CELL)
        assert ip.user_ns["out"] == [3, 3]
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")
        _on_engines(private_cluster, _forget, str(tmp_path))
        _forget(str(tmp_path))
        ip.user_ns.pop("slowpkg", None)
