"""Which globals the notebook's own functions read (gpucell.core.globalreads):
functions are defined here by exec into a namespace standing in for the
notebook's, as IPython does."""

from __future__ import annotations

import functools
import linecache
import random

from gpucell.core.globalreads import global_random_calls, global_reads, plain_reads

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

def given(g, n):
    return torch.randn(n, generator=g) + np.random.default_rng(n).normal()
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


def test_a_helper_held_as_data_is_found():
    """A function held in a dict, a list of pairs or an object's attribute
    (``ops["s"](10)``, a library's ``FunctionTransformer(func=frac)``) is
    called as surely as one named: its reads are found (they once were not,
    and a loop changing ``total`` ran with the engines' stale value)."""
    from types import SimpleNamespace

    ns = _notebook()

    def read(**inputs):
        return {
            (r.via, r.function, r.name) for r in global_reads(inputs, ns, {"total"})
        }

    assert read(ops={"f": ns["frac"]}) == {("ops", "frac", "total")}
    assert read(pairs=[("a", ns["twice"])]) == {("pairs", "frac", "total")}
    assert read(t=SimpleNamespace(func=ns["frac"])) == {("t", "frac", "total")}
    assert read(nested={"k": [{"j": ns["Meter"]().add}]}) == {
        ("nested", "Meter.add", "total")
    }
    # data with no function in it, or deeper than it is looked into
    assert read(rows=[[1.0, 2.0]] * 5000, text={"a": "frac"}) == set()


def test_plain_reads_are_reads_through_plain_functions_only():
    """What an engine can give each iteration's value: reads through plain
    notebook functions; a closure's, a class's or a store is not that."""
    ns = _notebook()
    names = {"uniq", "total"}
    assert plain_reads(ns["frac"], ns, names) == {"total"}
    assert plain_reads(ns["twice"], ns, names) == {"total"}  # through frac
    assert plain_reads(ns["attr_only"], ns, names) == set()
    assert plain_reads(ns["closure"], ns, names) == {"uniq"}  # nested code
    assert plain_reads(ns["Meter"](), ns, names) is None  # a method's read
    assert plain_reads(functools.partial(ns["frac"], 1.0), ns, names) is None
    exec("def keep(v):\n    global total\n    total = v\n", ns)
    assert plain_reads(ns["keep"], ns, names) is None  # it stores the name
    exec("def via_cls(v):\n    return Meter().add(v)\n", ns)
    assert plain_reads(ns["via_cls"], ns, names) is None  # read in a method


def test_random_draws_in_notebook_functions_are_found_not_own_generators():
    ns = _notebook()
    inputs = {k: ns[k] for k in ("flip", "noise", "own_rng", "is_new")}
    found = {(via, call) for via, _fn, call in global_random_calls(inputs, ns)}
    assert found == {("flip", "random.random"), ("noise", "np.random.rand")}


GENERATORS = """
out = []
total = 1.0
xs = [1.0, 2.0, 3.0]

def counts():
    for _ in range(3):
        yield len(out)              # the global the body appends to

def batches(data):
    for i in range(0, 4, 2):
        yield data[i : i + 2]       # the object it was given

def labelled(frame):
    for k in frame.index:           # an attribute named like a loop variable
        yield k, frame.loc[k]

def plain(n):
    k = 0
    for j in range(n):
        yield j + k                 # holds 0, as the loop's `index` may

class Rows:
    def __init__(self):
        self.index = [0, 1]

    def each(self):
        for i in self.index:        # self.index: an attribute, not a global
            yield i
"""

LIBRARY = """
def gen_map(fn, items):
    for x in items:
        yield fn(x)
"""


def _generators() -> tuple[dict, dict]:
    ns: dict = {"__name__": "__main__"}
    exec(compile(GENERATORS, "<ipython-input-generators>", "exec"), ns)
    exec(compile(NOTEBOOK, "<ipython-input-globalreads>", "exec"), ns)
    lib: dict = {"__name__": "somelib"}
    exec(compile(LIBRARY, "<somelib>", "exec"), lib)
    return ns, lib


def _names(reads) -> set[str]:
    return {r.name for r in reads}


def test_a_library_generator_reading_attributes_reads_no_global():
    import pandas as pd

    from gpucell.core.globalreads import generator_reads

    ns, _lib = _generators()
    df = pd.DataFrame({"a": [1, 2]})
    ns["df"] = df
    changed = {"index", "row", "out", "df", "a", "values", "columns"}
    # pandas' iterrows reads self.index, self.values: attributes of its own
    # frame, in its own module; the loop's `index` and `row` are no concern
    assert generator_reads(df.iterrows(), ns, changed) == []
    assert generator_reads(df.items(), ns, changed) == []
    # a notebook class's generator method reading self.index: an attribute
    assert generator_reads(ns["Rows"]().each(), ns, {"index", "i"}) == []
    assert generator_reads(ns["labelled"](df), ns, {"index", "k"}) == []


def test_a_notebook_generator_reading_what_the_loop_changes_is_found():
    from gpucell.core.globalreads import generator_reads

    ns, lib = _generators()
    assert _names(generator_reads(ns["counts"](), ns, {"out", "i"})) == {"out"}
    # the object it was given, which the body appends to
    found = generator_reads(ns["batches"](ns["out"]), ns, {"out"})
    assert [(r.via, r.name) for r in found] == [("batches", "out")]
    # a value it holds is no such object (small ints are shared)
    ns["index"] = 0
    assert generator_reads(ns["plain"](3), ns, {"index", "k"}) == []
    # a generator expression written in the notebook
    gen = eval("(x + total for x in xs)", ns)
    assert _names(generator_reads(gen, ns, {"total", "x"})) == {"total"}
    # a library generator given a notebook callback that reads a global
    found = generator_reads(lib["gen_map"](ns["frac"], [1.0]), ns, {"total"})
    assert [(r.function, r.name) for r in found] == [("frac", "total")]
    # only names the loop changes
    assert generator_reads(ns["counts"](), ns, {"other"}) == []


def test_a_finished_generator_makes_no_more_items():
    from gpucell.core.globalreads import generator_reads

    ns, _lib = _generators()
    gen = ns["counts"]()
    list(gen)
    assert generator_reads(gen, ns, {"out"}) == []


def test_a_draw_given_its_own_generator_is_not_a_global_draw():
    """``torch.randn(3, generator=g)`` draws from ``g``, and a method of a
    call's result from that result: neither is a process-wide draw, in the
    loop's text or in a notebook function; ``generator=None`` is one."""
    from gpucell.core.analysis import analyse

    cell = (
        "for s in range(4):\n"
        "    g = torch.Generator().manual_seed(s)\n"
        "    a.append(torch.randn(3, generator=g))\n"
        "    b.append(np.random.default_rng(s).normal(size=2))\n"
        "    c.append(torch.rand(2, generator=None))\n"
    )
    plan = analyse(cell, known_names={"torch", "np", "a", "b", "c"})
    assert plan.random_calls == ((5, "torch.rand"),)
    ns = _notebook()
    assert global_random_calls({"given": ns["given"]}, ns) == []
