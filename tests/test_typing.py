"""The pure core and the protocol's data types pass strict mypy (STYLE.md).

The layout's import rules are ``tests/test_layout.py``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: the pure core and the protocol's data types (wire, shm and fingerprint handle
#: buffers of numpy/torch objects duck-typed as Any, and are checked by tests)
STRICT = [
    "gpucell/core",
    "gpucell/protocol/program.py",
    "gpucell/protocol/chunks.py",
    "gpucell/protocol/conversation.py",
    "gpucell/protocol/fold.py",
    "gpucell/protocol/telemetry.py",
    "gpucell/protocol/devices.py",
    "gpucell/protocol/panel.py",
    "gpucell/protocol/warned.py",
    "gpucell/ui/panel_state.py",
]


#: the two ends of the kernel-engine conversation (protocol/conversation.py):
#: a reply field one side reads and the other does not write is a type error
CONVERSATION_ENDS = [
    "gpucell/kernel/dispatch.py",
    "gpucell/kernel/shipping.py",
    "gpucell/kernel/chunk_errors.py",
    "gpucell/engine/worker.py",
]


@pytest.fixture(scope="module")
def mypy_runs() -> Iterator[dict[str, tuple[subprocess.Popen, Any]]]:
    """Both mypy runs, started at once: two single-threaded processes of some
    seconds each run side by side (the suite itself keeps one core busy), not
    one after the other; each test waits for its own.  The second has a cache
    of its own (its options are not strict)."""
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    runs = {}
    try:
        for name, args in (
            ("strict", ["--strict", *STRICT]),
            ("ends", ["--cache-dir", ".mypy_cache/ends", *CONVERSATION_ENDS]),
        ):
            out = tempfile.TemporaryFile("w+")
            runs[name] = (
                subprocess.Popen(
                    [sys.executable, "-m", "mypy", *args],
                    cwd=ROOT,  # picks up [tool.mypy] in pyproject.toml
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    text=True,
                ),
                out,
            )
        yield runs
    finally:
        for proc, out in runs.values():
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            out.close()


def _finished(run: tuple[subprocess.Popen, Any]) -> tuple[int, str]:
    proc, out = run
    proc.wait(timeout=600)
    out.seek(0)
    return proc.returncode, out.read()


@pytest.mark.mypy
def test_pure_core_passes_strict_mypy(mypy_runs) -> None:
    code, said = _finished(mypy_runs["strict"])
    assert code == 0, said


@pytest.mark.mypy
def test_both_ends_of_the_conversation_type_check(mypy_runs) -> None:
    code, said = _finished(mypy_runs["ends"])
    assert code == 0, said
