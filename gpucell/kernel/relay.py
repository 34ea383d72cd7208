"""Engine output, relayed to the cell as it arrives: whole lines, none lost, in
iteration order.

Reads each task's ipyparallel ``Metadata`` (stdout, stderr, rich outputs) that the
client fills from IOPub.  Only the dispatcher uses it.

Order: serially line k of the output comes from the iterations before it.  Here
only the chunk at the *frontier* (the lowest iteration whose output is not yet
all relayed) streams live; a chunk further on keeps its lines until every chunk
before it has finished and been relayed, then releases them at once and streams
in turn.  A line waits at most for the iterations before it.
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any

__all__ = ["PARTIAL_LINE_WAIT", "OutputRelay"]


#: seconds an unfinished line from a running task waits for the rest of it
PARTIAL_LINE_WAIT = 1.0


#: the tag an engine puts at the start of each line (``worker._Tagged``)
_TAG = re.compile(r"\A\[engine \d+(?: \| iteration \d+)?\] ")


def _whole_lines(text: str, final: bool) -> str:
    """``text`` up to its last newline (all of it when ``final``)."""
    return text if final else text[: text.rfind("\n") + 1]


class OutputRelay:
    """Forward engine output to the cell as it arrives, losing none, in
    iteration order.

    Reads each task's ipyparallel ``Metadata`` (stdout, stderr, rich outputs) that
    the client fills from IOPub; kept by reference from submission, so reading it
    is a dict lookup (``AsyncResult.stdout`` re-parses dates on every access).
    A task's result can arrive before its last output (they travel on different
    channels), so finished tasks stay here until ipyparallel says their output is
    complete; :meth:`flush` waits briefly for the stragglers at the end.

    ``kept``: iteration ranges whose output an earlier run printed (``--resume``).
    """

    def __init__(
        self,
        client: Any,
        relay: Callable[[str], None],
        kept: Any = (),
    ) -> None:
        self._client = client
        self._relay = relay
        self._md: dict[Any, Any] = {}
        self._chunk: dict[Any, Any] = {}  # task -> its Chunk (start, stop)
        self._printed: dict[Any, tuple[int, int]] = {}
        self._draining: list[Any] = []
        self._complete_ok: set[Any] = set()  # finished, output all arrived
        self._partial_since: dict[Any, float] = {}  # a line waiting for its end
        self._open_line: Any = None  # the task whose relayed line has no end yet
        # relayed ranges not yet passed by the frontier: start -> stop (ranges
        # are disjoint: chunks and kept ranges partition the iterations)
        self._done: dict[int, int] = {int(a): int(b) for a, b in kept}
        self._frontier = 0
        self._advance()

    def watch(self, ar: Any, chunk: Any = None) -> None:
        # the task's own record, which its future holds: the client drops its
        # copy once a task has finished, and a one-iteration chunk can finish
        # before apply_async's caller runs again (output was lost that way)
        md = ar.metadata
        if isinstance(md, list):
            md = md[0] if md else None
        self._chunk[ar] = chunk
        if md is not None:
            self._md[ar] = md
            self._printed[ar] = (0, 0)

    # -- order -------------------------------------------------------------------

    def _advance(self) -> None:
        """Move the frontier past every range whose output is all relayed."""
        while self._frontier in self._done:
            self._frontier = self._done.pop(self._frontier)

    def _at_frontier(self, ar: Any) -> bool:
        c = self._chunk.get(ar)
        return c is None or c.start <= self._frontier

    def _release(self) -> None:
        """Relay the tasks at the frontier, in order, as far as they are done."""
        progress = True
        while progress:
            progress = False
            for ar in sorted(self._chunk, key=self._start):
                if not self._at_frontier(ar):
                    break
                if ar in self._complete_ok:
                    self._complete(ar)
                    progress = True
                    break
                self._forward(ar)

    @staticmethod
    def _start_of(chunk: Any) -> int:
        return -1 if chunk is None else int(chunk.start)

    def _start(self, ar: Any) -> int:
        return self._start_of(self._chunk.get(ar))

    # -- relaying ------------------------------------------------------------------

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
                # the task before it in iteration order left its last line
                # open (`print(i, end=" ")`): serially this output goes on
                # on that line, so it does here, without a second tag
                new_out = _TAG.sub("", new_out, count=1)
            self._open_line = None if new_out.endswith("\n") else ar
            self._relay(new_out)
        if new_err:
            sys.stderr.write(new_err)
            sys.stderr.flush()
        self._printed[ar] = (k_out + len(new_out), k_err + len(new_err))

    def _complete(self, ar: Any) -> None:
        self._forward(ar, final=True)
        md = self._md.pop(ar, None)
        chunk = self._chunk.pop(ar, None)
        self._printed.pop(ar, None)
        self._partial_since.pop(ar, None)
        self._complete_ok.discard(ar)
        if chunk is not None and getattr(chunk, "state", "done") == "done":
            self._done[int(chunk.start)] = int(chunk.stop)
            self._advance()
        if md is not None:
            _display_outputs(md.get("outputs") or [])

    def poll(self, running: Any) -> None:
        for ar in list(self._draining):
            if ar.wait_for_output(0):
                self._draining.remove(ar)
                self._complete_ok.add(ar)
        self._release()

    def finished(self, ar: Any) -> None:
        self._draining.append(ar)

    def lost(self, ar: Any) -> None:
        """The task's engine died: what it printed was relayed (or is dropped
        with it); its iterations run again in another task."""
        if self._at_frontier(ar):
            self._forward(ar, final=True)
        for d in (self._md, self._chunk, self._printed, self._partial_since):
            d.pop(ar, None)
        self._complete_ok.discard(ar)
        if ar in self._draining:
            self._draining.remove(ar)

    def flush(self, running: Any, timeout: float = 1.0) -> None:
        """The run is over: everything left, in iteration order."""
        end = time.perf_counter() + timeout
        for ar in sorted({*self._draining, *running, *self._chunk}, key=self._start):
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
