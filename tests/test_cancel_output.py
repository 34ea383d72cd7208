"""A cancelled run leaves every engine's output intact for later cells.

A cancelled run signals its engines (SIGINT) at any moment.  One that landed
between ``worker.run``'s swap of ``sys.stdout`` for its tagging wrapper and
the ``try`` that puts the stream back left the wrapper installed for good;
ipykernel tags output with its request through ``sys.stdout.set_parent``, and
skips a stream without one, so every later chunk's output on that engine was
filed under the interrupted request and never reached a cell (found by a
sweep of real loops: 1 in 800 cancelled cells; here the window is widened
on purpose, on one engine, by slowing the input check that runs inside it).
"""

from __future__ import annotations

import re

import pytest


def _widen_window() -> None:  # runs on an engine
    import time

    from gpucell.engine import checkin

    orig = checkin.snapshot

    def slow(*a, **k):
        time.sleep(0.5)
        return orig(*a, **k)

    checkin.snapshot = slow  # (worker reads checkin.snapshot at call time)


def _stream_types() -> tuple[str, str]:  # runs on an engine
    import sys

    return type(sys.stdout).__name__, type(sys.stderr).__name__


def test_a_cancel_during_a_chunks_setup_loses_no_later_output(
    ip, private_cluster, capsys
):
    c = private_cluster
    c.client[c.client.ids[0]].apply_sync(_widen_window)
    # (cells this cheap would run in the kernel: the engines must run them)
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    ip.run_cell("import time")
    try:
        for _ in range(2):
            with pytest.raises(ValueError):
                ip.run_cell_magic(
                    "gpu_parallel",
                    "--quiet --chunksize 4",
                    "for i in range(8):\n    time.sleep(0.002)\n    if i == 4:\n"
                    "        raise ValueError('boom')\n    print('fail-cell', i)\n",
                )
            capsys.readouterr()
            ip.run_cell_magic(
                "gpu_parallel",
                "--quiet --chunksize 3",
                "for i in range(6):\n    print(f'[log] item {i}')\n",
            )
            out = capsys.readouterr().out
            assert re.findall(r"\[log\] item (\d)", out) == list("012345"), out
            types = c.client[:].apply_sync(_stream_types)
            assert types == [("OutStream", "OutStream")] * 2
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")
