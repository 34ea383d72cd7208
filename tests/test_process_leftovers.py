"""The leftover-process check: a daemonized process a test forgets fails the session."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import process_leftovers as leftovers

TESTS = Path(__file__).resolve().parent

CONFTEST = f"""
import sys
sys.path.insert(0, {str(TESTS)!r})
from process_leftovers import pytest_sessionfinish  # noqa: F401
"""

FORGETS_A_DAEMON = """
import subprocess, sys

def test_starts_a_daemon(tmp_path):
    # detached from pytest (its own session, parent gone): only the marker finds it
    code = ("import os, time; open({pidfile!r}, 'w').write(str(os.getpid())); "
            "time.sleep(120)")
    subprocess.Popen([sys.executable, "-c", code], start_new_session=True,
                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import time, os
    for _ in range(100):
        if os.path.exists({pidfile!r}):
            break
        time.sleep(0.05)
"""

CLEAN = """
import subprocess, sys

def test_waits_for_its_child():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def _pytest(folder: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, GPUCELL_LEFTOVER_GRACE_S="1")
    env.pop("PYTEST_ADDOPTS", None)
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)],
        capture_output=True,
        text=True,
        env=env,
        cwd=folder,
        timeout=120,
    )


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def test_a_forgotten_daemon_fails_the_session_and_is_killed(tmp_path):
    pidfile = tmp_path / "daemon.pid"
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_daemon.py").write_text(
        textwrap.dedent(FORGETS_A_DAEMON.format(pidfile=str(pidfile)))
    )
    run = _pytest(tmp_path)
    pid = int(pidfile.read_text())
    try:
        assert run.returncode == 1, run.stdout + run.stderr
        assert "1 passed" in run.stdout
        assert "left behind by the tests" in run.stdout
        assert f"pid {pid}:" in run.stdout
        deadline = time.monotonic() + 10
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(pid), "the leftover was reported but not killed"
    finally:
        if _alive(pid):
            os.kill(pid, 9)


def test_a_clean_session_passes(tmp_path):
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_clean.py").write_text(CLEAN)
    run = _pytest(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "left behind" not in run.stdout


def test_the_outer_session_is_not_counted_by_an_inner_one(tmp_path):
    """A pytest run inside a test gets its own marker: the outer session's cluster
    (marked with the outer token) must not be killed as the inner one's leftover."""
    outer = os.environ[leftovers.MARKER]
    code = "import os, time; time.sleep(60)"
    sleeper = subprocess.Popen([sys.executable, "-c", code])
    try:
        (tmp_path / "conftest.py").write_text(CONFTEST)
        (tmp_path / "test_clean.py").write_text(CLEAN)
        run = _pytest(tmp_path)
        assert run.returncode == 0, run.stdout + run.stderr
        assert _alive(sleeper.pid)
        assert any(p.pid == sleeper.pid for p in leftovers.marked_processes(outer))
    finally:
        sleeper.kill()
        sleeper.wait()
