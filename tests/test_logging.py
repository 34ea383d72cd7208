"""The loop's logging reaches the notebook's handlers as serially (issue 35).

Each engine makes the records the kernel's levels allow, keeps them instead of
printing them, and sends them with its chunk; the kernel hands them to its own
loggers in iteration order after the merge.  Compared here with the same cell
run serially in the same shell, on a real cluster.
"""

from __future__ import annotations

import logging
import os
import re

import pytest

pytestmark = pytest.mark.cluster

SETUP = """
import logging
logging.basicConfig(filename={path!r}, level=logging.INFO, force=True,
                    format="%(levelname)s %(name)s %(process)d %(message)s %(tag)s")
class Keep(logging.Handler):
    def __init__(self):
        super().__init__()
        self.records = []
    def emit(self, record):
        self.records.append((record.name, record.levelname, record.getMessage(),
                             getattr(record, "tag", None),
                             record.exc_info and repr(record.exc_info[1])))
keep = Keep()
log = logging.getLogger("sweep")
log.addHandler(keep)
quiet = logging.getLogger("sweep.quiet")
quiet.setLevel(logging.WARNING)
"""

CELL = """out = []
for i in range(14):
    log.info("item %d of %s", i, [i, i * i], extra={{"tag": "t%d" % i}})
    log.debug("never made: below INFO")
    quiet.info("never made: quiet is at WARNING")
    quiet.warning("warned %d", i, extra={{"tag": "q"}})
    if i % 5 == 0:
        try:
            1 / 0
        except ZeroDivisionError:
            log.exception("failed at %d", i, extra={{"tag": "x"}})
    out.append(i)
"""


@pytest.fixture
def logged(ip, tmp_path):
    """Run the setup into a fresh log file; give back its lines and the
    records the list handler kept.  Logging is put back afterwards."""
    saved = logging.getLogger().handlers[:]

    def run(magic: str | None, name: str):
        path = os.path.join(tmp_path, name)
        ip.run_cell(SETUP.format(path=path)).raise_error()
        if magic is None:
            # the magic's line counts in the lines a traceback names (as the
            # notebook's editor numbers them): the serial cell has it too
            ip.run_cell("# %%gpu_parallel\n" + CELL.format()).raise_error()
        else:
            ip.run_cell_magic("gpu_parallel", magic, CELL.format())
        logging.shutdown()  # flush the file handler
        with open(path) as f:
            # a traceback names the cell by its run's number: two runs differ
            text = re.sub(r"<ipython-input-\d+-\w+>", "<cell>", f.read())
        return text.splitlines(), list(ip.user_ns["keep"].records)

    yield run
    root = logging.getLogger()
    for h in root.handlers:
        h.close()
    root.handlers[:] = saved
    for name in ("sweep", "sweep.quiet"):
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).setLevel(logging.NOTSET)


def test_records_reach_the_file_and_handlers_as_serially(ip, cluster, logged):
    serial_lines, serial_kept = logged(None, "serial.log")
    lines, kept = logged("--quiet --chunksize 3", "parallel.log")
    assert lines == serial_lines  # same lines, same order, the kernel's pid
    assert kept == serial_kept
    assert str(os.getpid()) in lines[0]
    assert any("ZeroDivisionError" in line for line in lines)  # tracebacks as text
    assert not any("never made" in line for line in lines)
    assert sum("warned" in line for line in lines) == 14


def test_logging_disable_applies_on_the_engines(ip, cluster, logged):
    try:
        logging.disable(logging.WARNING)
        serial_lines, _ = logged(None, "serial.log")
        lines, _ = logged("--quiet", "parallel.log")
    finally:
        logging.disable(logging.NOTSET)
    assert lines == serial_lines
    assert all(
        line.startswith("ERROR") or not line.startswith(("INFO", "WARNING"))
        for line in lines
    )


def test_engine_and_gpucell_records_stay_on_the_engine_but_lookalike_names_travel():
    """gpucell's own loggers (and the engine process's) are not the loop's: their
    records are not relayed; a user's logger that merely starts with the same
    letters (``gpucell_runs``, ``tornadoes``) is the loop's and is."""
    from gpucell.engine.logs import Capture

    with Capture({"root": logging.INFO, "disable": 0, "named": {}}) as cap:
        logging.getLogger("gpucell").warning("decision")
        logging.getLogger("gpucell.kernel.dispatch").warning("decision")
        logging.getLogger("ipyparallel.engine").warning("engine's own")
        logging.getLogger("gpucell_runs").warning("the loop's")
        logging.getLogger("tornadoes").warning("the loop's too")
    assert [r.name for r in cap.records] == ["gpucell_runs", "tornadoes"]


def test_gpucell_logger_says_where_a_loop_runs_and_only_when_asked(ip, cluster):
    """The ``gpucell`` logger: silent by default (a NullHandler, no last-resort
    stderr line, nothing propagated to the notebook's root handlers), and a
    handler the user puts on it hears where each loop ran and why."""
    gl = logging.getLogger("gpucell")
    assert any(isinstance(h, logging.NullHandler) for h in gl.handlers)
    assert gl.propagate is False  # the notebook's own log holds the serial lines

    class Keep(logging.Handler):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def emit(self, record: logging.LogRecord) -> None:
            self.lines.append(f"{record.name}: {record.getMessage()}")

    keep = Keep()
    gl.addHandler(keep)
    gl.setLevel(logging.INFO)
    try:
        cell = "logged_sq = []\nfor i in range(6):\n    logged_sq.append(i * i)\n"
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert ip.user_ns["logged_sq"] == [i * i for i in range(6)]
    finally:
        gl.removeHandler(keep)
        gl.setLevel(logging.NOTSET)
    ran = [line for line in keep.lines if line.startswith("gpucell.kernel.execute")]
    assert ran, keep.lines
    # numbered as the notebook shows the cell: the magic's line is line 1
    assert "the loop on lines 3-4: 6 iterations" in ran[0]
    assert "engines" in ran[0] or "in the kernel" in ran[0]
