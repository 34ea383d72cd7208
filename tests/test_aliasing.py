"""Inputs that alias what the loop changes: refused before anything runs.

The analysis sees names; ``y = out`` made in an earlier cell makes them one
object, which only the kernel can see.  Serially the loop would read its own
changes through ``y``; on engines it would not, so the namespace would differ.
"""

from __future__ import annotations

import cloudpickle
import numpy as np
import pytest
import torch

from gpucell.core.aliasing import shared_with_sinks
from gpucell.errors import NotParallelizable


def test_the_same_object_under_another_name_is_found():
    out = [1]
    (s,) = shared_with_sinks({"out": out}, {"y": out, "z": [1]})
    assert (s.input, s.sink, s.how) == ("y", "out", "is the same object as")


def test_an_input_holding_the_sink_one_level_down_is_found():
    out: list[int] = []

    class Box:
        def __init__(self):
            self.log = out

    (s,) = shared_with_sinks({"out": out}, {"cfg": {"log": out}})
    assert "cfg['log']" in s.how
    (s,) = shared_with_sinks({"out": out}, {"box": Box()})
    assert "box.log" in s.how


def test_views_and_shared_tensors_are_found_but_disjoint_strides_are_not():
    a = np.zeros(10)
    assert shared_with_sinks({"a": a}, {"v": a[2:5]})[0].how == "shares memory with"
    assert shared_with_sinks({"a": a}, {"t": torch.from_numpy(a)})
    assert not shared_with_sinks({"a": a[::2]}, {"b": a[1::2]})
    assert not shared_with_sinks({"a": a}, {"c": a.copy()})
    t = torch.zeros(6)
    assert shared_with_sinks({"t": t}, {"u": t[3:]})


def test_immutable_sinks_and_the_sink_itself_are_never_reported():
    assert not shared_with_sinks({"total": 0}, {"n": 0})
    out = [1]
    assert not shared_with_sinks({"out": out}, {"out": out})


def test_elements_of_a_sink_changed_in_place_count_only_when_deep():
    rows = [[0, 0], [0, 0]]
    assert not shared_with_sinks({"rows": rows}, {"r0": rows[0]})
    (s,) = shared_with_sinks({"rows": rows}, {"r0": rows[0]}, frozenset({"rows"}))
    assert "rows[0]" in s.how


@pytest.mark.cluster
@pytest.mark.parametrize(
    ("setup", "cell", "match"),
    [
        (
            "out = [0]\ny = out",
            "for i in range(4):\n    out.append(len(y) + i)\n",
            r"`y` is the same object as `out`",
        ),
        (
            "a = np.zeros(6)\nv = a[1:]",
            "for i in range(6):\n    a[i] = v[0] + i\n",
            r"`v` shares memory with `a`",
        ),
        (
            "log = []\ncfg = {'log': log}",
            "for i in range(4):\n    log.append(len(cfg['log']))\n",
            r"`cfg` holds \(as `cfg\['log'\]`\) `log`",
        ),
        (
            "out = [1, 2]\nsame = out",
            # serially this never ends: each item appended is iterated too
            "for x in same:\n    out.append(x)\n",
            r"the loop's iterable is the same object as `out`",
        ),
    ],
)
def test_a_loop_reading_an_alias_of_what_it_changes_is_refused(
    ip, cluster, setup, cell, match
):
    ip.run_cell("import numpy as np\n" + setup)
    names = [line.split(" = ")[0] for line in setup.splitlines()]
    before = {n: cloudpickle.dumps(ip.user_ns[n]) for n in names}
    with pytest.raises(NotParallelizable, match=match) as info:
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert "Nothing from the loop ran" in str(info.value)
    for n, data in before.items():
        assert cloudpickle.dumps(ip.user_ns[n]) == data


@pytest.mark.cluster
def test_a_copy_made_before_the_loop_runs_with_the_serial_result(ip, cluster):
    ip.run_cell("out = [0]\ny = list(out)")
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "for i in range(4):\n    out.append(len(y) + i)\n"
    )
    assert ip.user_ns["out"] == [0, 1, 2, 3, 4]
