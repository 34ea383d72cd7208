"""A notebook function reading, as a global, a name the loop binds
(``def scaled(v): return v * factor`` in ``for factor in ...``): on an
engine it runs with the chunk's namespace as its globals, so each call sees
its own iteration's value (gpucell.engine.chunk._bind_readers); the kernel
lets that run only where it is exact (gpucell.kernel.preflight_functions)."""

from __future__ import annotations

import cloudpickle

from gpucell.core.analysis import analyse
from gpucell.engine.chunk import run_chunk

NOTEBOOK = """
def rate():
    return base * 2

def priced(q):
    return q * rate()

def untouched(q):
    return q + offset
"""


def _sent(names: list[str]) -> dict:
    """The notebook's functions as an engine gets them (by value, each with
    the globals cloudpickle gives it)."""
    ns: dict = {"__name__": "__main__", "offset": 100}
    exec(compile(NOTEBOOK, "<ipython-input-loopglobals>", "exec"), ns)
    return {n: cloudpickle.loads(cloudpickle.dumps(ns[n])) for n in names}


def test_each_call_sees_its_own_iterations_binding_through_other_functions():
    plan = analyse(
        "out = []\nfor base in [1, 2, 3]:\n    out.append(priced(10) + untouched(0))\n",
        known_names=["priced", "untouched"],
    )
    inputs = _sent(["priced", "untouched"])
    result = run_chunk(plan.engine_program(), inputs, ("seq", [2, 3]), 1)
    assert result.gathers["out"] == [140, 160]
    # the namespace handed in (cached across chunks) is left as it was
    assert inputs["priced"].__globals__ is not inputs
    assert "base" not in inputs


def test_a_comprehensions_variable_is_not_the_functions_global():
    """Serially ``[plus(i) for i in ...]`` calls ``plus`` reading the
    notebook's ``i``, not the comprehension's: the engine leaves it so."""
    plan = analyse("vals = [untouched(offset) for offset in range(3)]\n")
    result = run_chunk(plan.engine_program(), _sent(["untouched"]), ("seq", [1, 2]), 0)
    assert list(result.gathers.values()) == [[101, 102]]  # offset: 100
