"""Engine output, relayed to the cell as it arrives: whole lines, none lost.

Reads each task's ipyparallel ``Metadata`` (stdout, stderr, rich outputs) that the
client fills from IOPub.  Only the dispatcher uses it.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["PARTIAL_LINE_WAIT", "OutputRelay"]


#: seconds an unfinished line from a running task waits for the rest of it
PARTIAL_LINE_WAIT = 1.0


def _whole_lines(text: str, final: bool) -> str:
    """``text`` up to its last newline (all of it when ``final``)."""
    return text if final else text[: text.rfind("\n") + 1]


class OutputRelay:
    """Forward engine output to the cell as it arrives, losing none.

    Reads each task's ipyparallel ``Metadata`` (stdout, stderr, rich outputs) that
    the client fills from IOPub; kept by reference from submission, so reading it
    is a dict lookup (``AsyncResult.stdout`` re-parses dates on every access).
    A task's result can arrive before its last output (they travel on different
    channels), so finished tasks stay here until ipyparallel says their output is
    complete; :meth:`flush` waits briefly for the stragglers at the end.
    """

    def __init__(self, client: Any, relay: Callable[[str], None]) -> None:
        self._client = client
        self._relay = relay
        self._md: dict[Any, Any] = {}
        self._printed: dict[Any, tuple[int, int]] = {}
        self._draining: list[Any] = []
        self._partial_since: dict[Any, float] = {}  # a line waiting for its end
        self._open_line: Any = None  # the task whose relayed line has no end yet

    def watch(self, ar: Any) -> None:
        # the task's own record, which its future holds: the client drops its
        # copy once a task has finished, and a one-iteration chunk can finish
        # before apply_async's caller runs again (output was lost that way)
        md = ar.metadata
        if isinstance(md, list):
            md = md[0] if md else None
        if md is not None:
            self._md[ar] = md
            self._printed[ar] = (0, 0)

    def _forward(self, ar: Any, final: bool = False) -> None:
        """Relay what ``ar`` wrote since the last call: whole lines only while it
        runs (a line can arrive in pieces, and another engine's line must not
        land inside it), the rest once it is complete or has waited
        :data:`PARTIAL_LINE_WAIT`."""
        md = self._md.get(ar)
        if md is None:
            return
        out, err = md.get("stdout") or "", md.get("stderr") or ""
        k_out, k_err = self._printed[ar]
        if not final and (out[-1:] not in ("", "\n") or err[-1:] not in ("", "\n")):
            # a progress line (dots, a \r counter) still shows, a second late
            since = self._partial_since.setdefault(ar, time.perf_counter())
            final = time.perf_counter() - since >= PARTIAL_LINE_WAIT
        new_out = _whole_lines(out[k_out:], final)
        new_err = _whole_lines(err[k_err:], final)
        if final:
            self._partial_since.pop(ar, None)
        if new_out:
            if self._open_line not in (None, ar):
                new_out = "\n" + new_out  # another task's line was left open
            self._open_line = None if new_out.endswith("\n") else ar
            self._relay(new_out)
        if new_err:
            sys.stderr.write(new_err)
            sys.stderr.flush()
        self._printed[ar] = (k_out + len(new_out), k_err + len(new_err))

    def _complete(self, ar: Any) -> None:
        self._forward(ar, final=True)
        md = self._md.pop(ar, None)
        self._printed.pop(ar, None)
        self._partial_since.pop(ar, None)
        if md is not None:
            _display_outputs(md.get("outputs") or [])

    def poll(self, running: Any) -> None:
        for ar in running:
            self._forward(ar)
        for ar in list(self._draining):
            if ar.wait_for_output(0):
                self._draining.remove(ar)
                self._complete(ar)
            else:
                self._forward(ar)

    def finished(self, ar: Any) -> None:
        self._draining.append(ar)

    def flush(self, running: Any, timeout: float = 1.0) -> None:
        end = time.perf_counter() + timeout
        for ar in [*self._draining, *running]:
            if ar.done():
                ar.wait_for_output(max(0.0, end - time.perf_counter()))
            self._complete(ar)
        self._draining.clear()


def _display_outputs(outputs: list[Any]) -> None:
    """Rich outputs (display()) from the chunk reach the cell's output."""
    if not outputs:
        return
    try:
        from IPython.display import publish_display_data
    except ImportError:
        return
    for out in outputs:
        if isinstance(out, dict) and "data" in out:
            publish_display_data(out["data"], out.get("metadata", {}))
