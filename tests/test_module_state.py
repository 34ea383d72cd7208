"""Functions of the user's own modules that change their module's state
(issue 28 §3, silently different): such a function travels to the engines by
name, each engine imports the module afresh, and the changes stayed there: the
notebook's ``helpers.LOG`` was left empty where serially it holds every
iteration's entry.  Now refused by name before anything runs; a pure function
of the same module, and an installed library's functions, still run as
serially.  On a real cluster, each compared with the serial cell.
"""

from __future__ import annotations

import logging
import sys
import textwrap

import pytest
from test_parallel import same

import gpucell
from gpucell.core.modulewrites import module_writes, user_module

pytestmark = pytest.mark.cluster

MODULE = """
LOG = []
TOTALS = {}
total = 0
class Counter:
    n = 0
def record(x):
    LOG.append(x)
    return x * 2
def bump(x):
    Counter.n += 1
    return x
def tally(k, v):
    TOTALS[k] = TOTALS.get(k, 0) + v
    return v
def accumulate(x):
    global total
    total += x
    return total
def pure(x):
    out = []
    out.append(x * 3)
    return out
def via_pure(x):
    return pure(x)
def via_record(x):
    return record(x)
class Model:
    def step(self, x):
        Counter.n += x
        return x
"""


@pytest.fixture
def helpers(cluster, tmp_path):
    """A module ``p1helpers`` of the user's, importable in the kernel and on
    the engines, imported afresh for each run."""
    folder = tmp_path / "mods"
    folder.mkdir()
    (folder / "p1helpers.py").write_text(MODULE)
    d = str(folder)
    view = cluster.client[:]
    sys.path.insert(0, d)
    view.execute(f"import sys; sys.path.insert(0, {d!r})", block=True)
    forget = "import sys; sys.modules.pop('p1helpers', None)"

    def fresh() -> None:
        sys.modules.pop("p1helpers", None)
        view.execute(forget, block=True)

    fresh()
    yield fresh
    sys.path.remove(d)
    view.execute(f"import sys; sys.path.remove({d!r})", block=True)
    fresh()


def serial_then_parallel(ip, fresh, cell: str) -> tuple[dict, dict]:
    serial: dict = {}
    exec(compile(cell, "<serial>", "exec"), serial)
    fresh()
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    return serial, ip.user_ns


REFUSED = {
    "a module list appended to": (
        "import p1helpers\nout = []\nfor i in range(6):\n"
        "    out.append(p1helpers.record(i))\nseen = list(p1helpers.LOG)\n",
        "`p1helpers.record`, which the loop calls, changes `LOG`",
    ),
    "a class attribute of the module": (
        "import p1helpers\nout = []\nfor i in range(6):\n"
        "    out.append(p1helpers.bump(i))\nseen = p1helpers.Counter.n\n",
        "changes `Counter.n`",
    ),
    "a function imported by name": (
        "from p1helpers import record, LOG\nout = []\nfor i in range(6):\n"
        "    out.append(record(i))\nseen = list(LOG)\n",
        "`record`, which the loop calls, changes `LOG`",
    ),
    "a dict item of the module": (
        "from p1helpers import tally\nfor i in range(6):\n    tally(i % 2, i)\n",
        "changes `TOTALS\\[k\\]`",
    ),
    "a global it declares": (
        "import p1helpers\nfor i in range(6):\n    p1helpers.accumulate(i)\n",
        "changes `total`",
    ),
    "through another function of the module": (
        "from p1helpers import via_record\nfor i in range(6):\n    via_record(i)\n",
        r"`via_record` \(through `record`\)",
    ),
    "a method of the module's class": (
        "from p1helpers import Model\nstep = Model().step\nfor i in range(6):\n"
        "    step(i)\n",
        r"`step` \(through `Model.step`\)",
    ),
    "a notebook function calling it": (
        "import p1helpers\ndef go(x):\n    return p1helpers.record(x) + 1\n"
        "out = []\nfor i in range(6):\n    out.append(go(i))\n",
        r"`go` \(through `record`\)",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_user_module_function_changing_its_module_is_refused(
    ip, cluster, helpers, case
) -> None:
    cell, message = REFUSED[case]
    ip.user_ns.pop("out", None)
    with pytest.raises(gpucell.NotParallelizable, match=message) as err:
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert "import `p1helpers` afresh" in str(err.value)
    mod = sys.modules["p1helpers"]  # (the prelude imported it: as serially)
    assert mod.LOG == [] and mod.Counter.n == 0 and mod.TOTALS == {}
    assert "out" not in ip.user_ns or ip.user_ns["out"] == []


RUNS = {
    "a pure function of the module": (
        "import p1helpers\nout = []\nfor i in range(6):\n"
        "    out.append(p1helpers.pure(i))\n"
    ),
    "a pure function reached by name": (
        "from p1helpers import via_pure\nout = []\nfor i in range(6):\n"
        "    out.append(via_pure(i))\n"
    ),
    "a library's functions": (
        "import numpy as np\nout = []\nfor i in range(6):\n"
        "    out.append(np.append(np.arange(i), i))\n"
    ),
}


@pytest.mark.parametrize("case", list(RUNS))
def test_pure_functions_of_user_modules_run_as_serially(
    ip, cluster, helpers, case
) -> None:
    serial, got = serial_then_parallel(ip, helpers, RUNS[case])
    for k in ("out", "i"):
        assert same(serial[k], got[k]), k


def test_a_logger_handler_appending_to_a_notebook_list_sees_every_record(
    ip, cluster
) -> None:
    """A logger travels by name; its records come back to the notebook's
    handlers in iteration order, so a handler keeping them in a list fills
    as serially (the other pickled-by-name object of the category)."""
    cell = textwrap.dedent(
        """
        import logging
        class Keep(logging.Handler):
            def emit(self, record):
                sink.append(record.getMessage())
        sink = []
        lg = logging.getLogger("p1.keep")
        lg.handlers[:] = [Keep()]
        lg.propagate = False
        lg.setLevel(logging.INFO)
        for i in range(6):
            lg.info("item %d", i)
        seen = list(sink)
        """
    )
    try:
        serial: dict = {}
        exec(compile(cell, "<serial>", "exec"), serial)
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert ip.user_ns["seen"] == serial["seen"] == [f"item {i}" for i in range(6)]
    finally:
        logging.getLogger("p1.keep").handlers[:] = []


def test_installed_libraries_and_gpucell_are_not_user_modules() -> None:
    import numpy

    assert user_module("numpy") is None
    assert user_module("json") is None
    assert user_module("gpucell.core.modulewrites") is None
    assert user_module("__main__") is None
    assert (
        module_writes({"np": numpy, "append": numpy.append}, frozenset({"append"}))
        == []
    )


@pytest.mark.parametrize("folder", ["site-packages", "dist-packages"])
def test_packages_from_any_installed_packages_folder_are_libraries(
    tmp_path, monkeypatch, folder
) -> None:
    """A library found in a packages folder outside the interpreter's prefix (the
    user site of `pip install --user`, a borrowed environment's site-packages on
    a .pth line or PYTHONPATH) is not the user's module: torch found so made the
    quickstart refuse its loop ("changes ... of your module torch._dynamo")."""
    import importlib
    import sys

    for where, name in (
        (tmp_path / "lib" / folder, "gc_lib_mod"),
        (tmp_path / "proj", "gc_own_mod"),
    ):
        where.mkdir(parents=True)
        (where / f"{name}.py").write_text(
            "count = 0\ndef bump():\n    global count\n    count += 1\n"
        )
        monkeypatch.syspath_prepend(str(where))
    try:
        importlib.import_module("gc_lib_mod")
        importlib.import_module("gc_own_mod")
        assert user_module("gc_lib_mod") is None
        assert user_module("gc_own_mod") is not None
    finally:
        sys.modules.pop("gc_lib_mod", None)
        sys.modules.pop("gc_own_mod", None)
