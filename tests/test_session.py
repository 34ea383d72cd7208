"""The kernel's state between cells is one Session (kernel/session.py): tests
build their own instead of swapping module globals, and the public names
(``gpucell.last_run``) read the kernel's."""

from __future__ import annotations

import gpucell
from gpucell.core.provenance import LastRun
from gpucell.core.resume import Kept
from gpucell.kernel import keep
from gpucell.kernel.session import Session, current, using


def test_last_run_is_the_sessions():
    with using() as session:
        assert gpucell.last_run is None
        record = LastRun(plan=None)
        session.last_run = record
        assert gpucell.last_run is record
    assert current() is not session  # the kernel's own is back
    assert gpucell.last_run is current().last_run


def test_a_session_of_its_own_keeps_its_own_cells():
    with using() as outer:
        keep.remember("cell a", Kept(None))
        with using(Session()) as inner:
            assert keep.kept_for("cell a") is None and not inner.kept
            keep.remember("cell b", Kept(None))
        assert keep.kept_for("cell b") is None
        assert list(outer.kept) == [keep.cell_digest("cell a")]


def test_the_plan_cache_holds_plans_of_this_session_only():
    src = "out = []\nfor i in range(3):\n    out.append(i)\n"
    with using() as session:
        prep = session.plans.get(src, "<cell>", {}, for_cpu=False, dry_run=False)
        again = session.plans.get(src, "<cell>", {}, for_cpu=False, dry_run=False)
        assert again is prep and len(session.plans) == 1
        assert [p.source for p in session.plans.plans()] == [src]
    assert Session().plans.plans() == []


def test_the_package_still_pickles_by_reference():
    """A cell may name ``gpucell``: it travels by name (a module subclass for
    ``last_run`` would not, cloudpickle dispatches on the exact type)."""
    import cloudpickle

    assert cloudpickle.loads(cloudpickle.dumps(gpucell)) is gpucell
