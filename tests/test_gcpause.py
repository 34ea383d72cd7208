"""gpucell.kernel.gcpause: the kernel's heap is out of the collector's sight
while a run's chunks are in flight, and back (nothing lost) after."""

from __future__ import annotations

import gc
import weakref

import pytest

from gpucell.kernel.gcpause import kernel_heap_frozen


class Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the collector frees it


def test_frozen_inside_and_back_after_even_on_error():
    assert gc.get_freeze_count() == 0
    with kernel_heap_frozen() as did:
        assert did and gc.get_freeze_count() > 0
    assert gc.get_freeze_count() == 0
    with pytest.raises(KeyError), kernel_heap_frozen():
        raise KeyError("x")
    assert gc.get_freeze_count() == 0


def test_a_cycle_dropped_during_the_run_is_collected_after():
    n = Node()
    gone = weakref.ref(n)
    with kernel_heap_frozen():
        del n
        gc.collect()  # scans only what the run made: the frozen cycle stays
        assert gone() is not None
    gc.collect()
    assert gone() is None


def test_the_notebooks_own_freeze_and_disable_are_left_alone():
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with kernel_heap_frozen() as did:
            assert not did
        assert gc.get_freeze_count() == frozen  # not unfrozen by gpucell
    finally:
        gc.unfreeze()
    gc.disable()
    try:
        with kernel_heap_frozen() as did:
            assert not did and gc.get_freeze_count() == 0
    finally:
        gc.enable()
