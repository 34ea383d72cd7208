"""Widget pieces the progress display, the device selector and the monitor share.

ipywidgets is imported by the callers, on first display; nothing here imports it
(``SharedStyles`` takes the module), so ``import gpucell`` stays cheap.
"""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from typing import Any

from gpucell.ui import model

__all__ = [
    "GAP",
    "W_LABEL",
    "W_MEM",
    "W_MEM_FIG",
    "W_STATE",
    "W_STATS",
    "W_UTIL",
    "W_UTIL_FIG",
    "SharedStyles",
    "apply_changes",
    "fig_header",
    "px",
]


def apply_changes(
    changes: Sequence[tuple[Any, dict[str, Any]]],
    deadline: float | None = None,
    at_least: int = 1,
) -> int:
    """Set the trait values that differ, each widget's inside its ``hold_sync()``.

    Unchanged widgets cost a comparison and no message; a changed one sends its
    changed traits as one comm message (~0.2 ms each in a kernel, the cost that
    matters).  With a ``deadline`` (a ``time.perf_counter()`` value) it stops once
    the deadline has passed and ``at_least`` widgets were sent, so every call makes
    progress; the rest stay different and go out with a later call.  Returns how
    many entries were handled.
    """
    sent = 0
    for n, (w, attrs) in enumerate(changes):
        diff = {k: v for k, v in attrs.items() if getattr(w, k) != v}
        if not diff:
            continue
        with w.hold_sync():
            for k, v in diff.items():
                setattr(w, k, v)
        sent += 1
        if deadline is not None and sent >= at_least and time.perf_counter() > deadline:
            return n + 1
    return len(changes)


#: column widths in px, shared by the header and every row so they line up: the
#: device label, the utilisation column (its figure, then its bar), the memory
#: column (likewise), iterations and pace, the state
W_LABEL, W_UTIL, W_MEM, W_STATS, W_STATE = 250, 150, 210, 180, 80
#: the figure in front of each bar (right-aligned, as figures in a column are)
W_UTIL_FIG, W_MEM_FIG = 48, 100
#: the space between two columns
GAP = 12


def px(n: int) -> str:
    return f"{n}px"


def fig_header(title: str, fig_width: int) -> str:
    """A column header over a bar's description, right-aligned like the figures.

    ipywidgets draws a description as a ``text-align: right`` label of exactly
    ``description_width``; a block of that width, right-aligned, puts the header's
    last letter over the figures' last digit.
    """
    return (
        f'<div style="width:{fig_width}px;text-align:right;white-space:nowrap">'
        f"<b>{html.escape(title)}</b></div>"
    )


class SharedStyles:
    """Layouts and styles shared by every row.

    Each ``Layout`` or style is a widget model of its own; sharing them keeps a
    table of eight GPUs at ~45 models instead of ~130, which is what the front end
    creates and the notebook saves.
    """

    def __init__(self, w: Any) -> None:
        def lay(width: int) -> Any:
            return w.Layout(width=px(width), margin=f"0 {GAP}px 0 0")

        self.label, self.util, self.mem = lay(W_LABEL), lay(W_UTIL), lay(W_MEM)
        self.stats, self.state = lay(W_STATS), lay(W_STATE)
        from ipywidgets.widgets.widget_float import ProgressStyle
        from ipywidgets.widgets.widget_string import HTMLStyle

        self.html = HTMLStyle()
        self.util_style = ProgressStyle(description_width=px(W_UTIL_FIG))
        self.mem_style = ProgressStyle(description_width=px(W_MEM_FIG))

    def util_bar(self, w: Any) -> Any:
        """A device's utilisation bar (its figure is the description)."""
        return w.FloatProgress(
            min=0.0,
            max=1.0,
            description=model.NA,
            bar_style="info",
            style=self.util_style,
            layout=self.util,
            tooltip="",
        )

    def mem_bar(self, w: Any) -> Any:
        """A device's memory bar."""
        return w.FloatProgress(
            min=0.0,
            max=1.0,
            description=model.NA,
            style=self.mem_style,
            layout=self.mem,
            tooltip="",
        )
