"""The pure core and the protocol's data types pass strict mypy (STYLE.md).

The layout's import rules are ``tests/test_layout.py``.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

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


@pytest.mark.mypy
def test_pure_core_passes_strict_mypy() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", *STRICT],
        cwd=ROOT,  # picks up [tool.mypy] in pyproject.toml
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


#: the two ends of the kernel-engine conversation (protocol/conversation.py):
#: a reply field one side reads and the other does not write is a type error
CONVERSATION_ENDS = [
    "gpucell/kernel/dispatch.py",
    "gpucell/kernel/shipping.py",
    "gpucell/kernel/chunk_errors.py",
    "gpucell/engine/worker.py",
]


@pytest.mark.mypy
def test_both_ends_of_the_conversation_type_check() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", *CONVERSATION_ENDS],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
