"""The kernel's gpucell state, in one object instead of module globals.

One :class:`Session` per kernel holds what outlives a cell: the plans of the
cells run lately, the record of the last run (``gpucell.last_run``), the chunks
kept for ``--resume``, the Lab panel's endpoint, and the background runs.  Tests
build a fresh one with :func:`using` instead of swapping module globals.

What describes a cluster's engines (what inputs their memory holds, how fast a
cell ran on them) stays on the cluster object: it is true of those engines
only, and goes when they go.
"""

from __future__ import annotations

import contextlib
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpucell.kernel.plans import PlanCache

if TYPE_CHECKING:
    from gpucell.core.provenance import LastRun
    from gpucell.core.resume import Kept
    from gpucell.kernel.panel import PanelEndpoint

__all__ = ["Session", "current", "using"]


@dataclass
class Session:
    """Everything gpucell keeps between the cells of one kernel."""

    #: analysed plans and their compiled code, by cell text and known names
    plans: PlanCache = field(default_factory=PlanCache)
    #: the record of the last ``%%gpu_parallel`` cell (``gpucell.last_run``)
    last_run: LastRun | None = None
    #: the last few cells that did not finish, by their text's digest (keep.py)
    kept: OrderedDict[str, Kept] = field(default_factory=OrderedDict)
    #: the Lab panel's comm endpoint (``None`` in a terminal or before install)
    panel: PanelEndpoint | None = None
    #: background runs not yet merged, raised or cancelled (start order), and
    #: the recent ones (``gpucell.runs``): kernel/background.py's lists
    pending: list[Any] = field(default_factory=list)
    recent: list[Any] = field(default_factory=list)

    @property
    def cluster(self) -> Any:
        """The active cluster, or ``None`` (kept by gpucell.cluster, which the
        Python API shares with the magics)."""
        from gpucell.cluster.lifecycle import current_or_none

        return current_or_none()


_session = Session()


def current() -> Session:
    """This kernel's session."""
    return _session


@contextlib.contextmanager
def using(session: Session | None = None) -> Iterator[Session]:
    """Make ``session`` (a fresh one by default) the kernel's for a while."""
    global _session
    before, _session = _session, session if session is not None else Session()
    try:
        yield _session
    finally:
        _session = before
