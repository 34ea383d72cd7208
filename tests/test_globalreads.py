"""Which globals the notebook's own functions read (gpucell.core.globalreads):
functions are defined here by exec into a namespace standing in for the
notebook's, as IPython does."""

from __future__ import annotations

import functools
import linecache
import random

from gpucell.core.globalreads import global_random_calls, global_reads

NOTEBOOK = """
import random
import numpy as np

uniq = []
total = 0

def is_new(t):
    return t not in uniq

def frac(v):
    return v / total

def twice(v):
    return frac(v) * 2          # reads `total` through frac

def attr_only(o):
    return o.total              # an attribute, not the global

def local_only(x):
    total = x                   # a local, not the global
    return total

def closure():
    inner = lambda: uniq        # noqa: E731  (nested code)
    return inner()

class Meter:
    def add(self, x):
        return x + total

    @staticmethod
    def scale(x):
        return x * total

def flip():
    return random.random() < 0.5

def noise(n):
    return np.random.rand(n)

def own_rng(n):
    rng = np.random.default_rng(0)
    return rng.random(n)
"""


def _notebook() -> dict:
    filename = "<ipython-input-globalreads>"
    linecache.cache[filename] = (
        len(NOTEBOOK),
        None,
        NOTEBOOK.splitlines(True),
        filename,
    )
    ns: dict = {"__name__": "__main__"}
    exec(compile(NOTEBOOK, filename, "exec"), ns)
    return ns


def test_a_helper_reading_a_changed_global_is_found_through_calls_and_closures():
    ns = _notebook()
    changed = {"uniq", "total"}

    def read(**inputs):
        return {(r.via, r.function, r.name) for r in global_reads(inputs, ns, changed)}

    assert read(is_new=ns["is_new"]) == {("is_new", "is_new", "uniq")}
    assert read(twice=ns["twice"]) == {("twice", "frac", "total")}
    assert read(closure=ns["closure"]) == {("closure", "closure", "uniq")}
    # attributes and locals of the same name are not the global
    assert read(attr_only=ns["attr_only"], local_only=ns["local_only"]) == set()
    # a notebook class's methods, from an instance, and a partial's function
    assert ("m", "Meter.add", "total") in read(m=ns["Meter"]())
    assert ("m", "Meter.scale", "total") in read(m=ns["Meter"]())
    assert read(p=functools.partial(ns["frac"], 1.0)) == {("p", "frac", "total")}
    # names the loop does not change, and library functions, are no concern
    assert global_reads({"is_new": ns["is_new"]}, ns, {"other"}) == []
    assert global_reads({"choice": random.choice}, ns, {"uniq"}) == []


def test_random_draws_in_notebook_functions_are_found_not_own_generators():
    ns = _notebook()
    inputs = {k: ns[k] for k in ("flip", "noise", "own_rng", "is_new")}
    found = {(via, call) for via, _fn, call in global_random_calls(inputs, ns)}
    assert found == {("flip", "random.random"), ("noise", "np.random.rand")}
