"""%%gpu_parallel on a real 2-engine cluster in a real IPython shell.

The strongest check we have: after the magic, the namespace is exactly what the
same cell leaves when run serially.
"""

from __future__ import annotations

import copy
import io
import re
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import torch
from helpers import needs_shared_shm, shares_shm
from IPython.core.error import UsageError

import gpucell
from gpucell.errors import IterationError, NotParallelizable

pytestmark = pytest.mark.cluster


def run_both(ip, cell: str, ns: dict, line: str = "--quiet"):
    """Run ``cell`` serially (plain exec) and through the magic; return both."""
    cell = textwrap.dedent(cell)
    serial = copy.deepcopy(ns)
    exec(compile(cell, "<serial>", "exec"), serial)
    serial.pop("__builtins__", None)
    par = copy.deepcopy(ns)
    for k in list(ip.user_ns):
        if not k.startswith("_") and k not in (
            "In",
            "Out",
            "exit",
            "quit",
            "get_ipython",
        ):
            ip.user_ns.pop(k)
    ip.user_ns.update(par)
    ip.run_cell_magic("gpu_parallel", line, cell)
    got = {k: ip.user_ns[k] for k in serial if k in ip.user_ns}
    return serial, got


def same(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.allclose(a, b)
        )
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.allclose(a, b)
    if isinstance(a, float):
        if a != a:  # nan: the same when both are
            return isinstance(b, float) and b != b
        return a == b or abs(a - b) <= 1e-9 * max(1.0, abs(a))
    if type(a).__module__.startswith("pandas"):
        return type(a) is type(b) and a.equals(b)
    if isinstance(a, torch.nn.Module):
        sa, sb = a.state_dict(), b.state_dict()
        return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


def assert_serial_equivalent(ip, cell, ns, line="--quiet"):
    serial, got = run_both(ip, cell, ns, line)
    assert set(serial) <= set(got) | {"__builtins__"}, set(serial) - set(got)
    for k, v in serial.items():
        assert same(v, got[k]), f"{k}: serial {v!r} != parallel {got[k]!r}"
    return got


ROWS = {
    "input + local last value": (
        "for i in range(20):\n    y = i * scale\n    z = y + 1\n",
        {"scale": 3},
    ),
    "ordered gather": (
        "out = []\nfor x in xs:\n    out.append(x * 2)\n    out.extend([x, -x])\n",
        {"xs": list(range(37))},
    ),
    "gather onto existing list, += [..]": (
        "for x in xs:\n    out += [x]\n",
        {"xs": list(range(25)), "out": ["kept"]},
    ),
    "indexed writes: dict, list": (
        "for i, x in enumerate(xs):\n    d[x % 5] = i\n    w[i] = x * x\n",
        {"xs": list(range(30)), "d": {}, "w": [0] * 30},
    ),
    "reductions": (
        "for i in range(1, 40):\n    acc += i\n    neg -= i\n    prod *= 1 + i % 2\n"
        "    bits |= 1 << (i % 9)\n    mask &= ~(1 << (i % 5))\n    s = s + i\n"
        "    hi = max(hi, i * 7 % 13)\n    lo = min(lo, i * 7 % 13)\n",
        {
            "acc": 0,
            "neg": 0,
            "prod": 1,
            "bits": 0,
            "mask": 255,
            "s": 0,
            "hi": -1,
            "lo": 99,
        },
    ),
    "float reduction": (
        "for x in ys:\n    f += x * 0.1\n",
        {"ys": [0.1 * i for i in range(50)], "f": 0.0},
    ),
    "matmul reduction keeps order": (
        "for a in mats:\n    m = m @ a\n",
        {
            "mats": [np.array([[1.0, float(i)], [0.0, 1.0]]) for i in range(9)],
            "m": np.eye(2),
        },
    ),
    "keyed reduction": (
        "for x in xs:\n    counts[x % 4] += 1\n",
        {"xs": list(range(41)), "counts": {0: 0, 1: 0, 2: 0, 3: 0}},
    ),
    "set union": (
        "for x in xs:\n    seen.add(x % 7)\n    seen.update([x % 3 + 100])\n",
        {"xs": list(range(30)), "seen": {"a"}},
    ),
    "list comprehension": (
        "sq = [x * x for x in xs if x % 2]\n",
        {"xs": list(range(50))},
    ),
    "lists under a dict's keys, and counts beside them": (
        "for x in xs:\n    stats['n'] += x\n    stats['items'].append(x * 2)\n"
        "    groups[x % 3].append(x)\n    groups[x % 3].extend([-x])\n",
        {
            "xs": list(range(29)),
            "stats": {"n": 5, "items": ["kept"]},
            "groups": {0: [], 1: ["a"], 2: []},
        },
    ),
    "own element read and written (a list)": (
        "for i in range(len(a)):\n    a[i] = a[i] * 2 + 1\n",
        {"a": list(range(23))},
    ),
    "own row of a 2-D array, another column read": (
        "for i in range(len(m)):\n    m[i, 0] = m[i, 1] * 2 + m[i, 0]\n",
        {"m": np.arange(30.0).reshape(15, 2)},
    ),
    "own element of a numpy array, by enumerate": (
        "for i, x in enumerate(a):\n    a[i] = x + a[i] ** 2\n",
        {"a": np.arange(17.0)},
    ),
    "dict comprehension (later keys win, first-seen order)": (
        "d = {x % 7: x * x for x in xs if x % 2}\n",
        {"xs": list(range(50))},
    ),
    "set comprehension": (
        "s = {x % 9 for x in xs}\n",
        {"xs": list(range(50))},
    ),
    "sum of a generator (floats, bit for bit)": (
        "total = sum(x * 0.1 for x in xs)\n",
        {"xs": list(range(301))},
    ),
    "max, min and sorted of generators": (
        "hi = max((x * 37) % 101 for x in xs)\nlo = min((x * 37) % 101 for x in xs)\n",
        {"xs": list(range(80))},
    ),
    "sorted of a generator with a prelude": (
        "k = 3\nranked = sorted((x * k) % 17 for x in xs)\n",
        {"xs": list(range(60))},
    ),
    "prelude and epilogue": (
        "total = 0\nfor i in range(10):\n    total += i\ndone = total * 2\n",
        {},
    ),
    "conditionals and nested loops": (
        "hits = []\nfor i in range(30):\n    if i % 3 == 0:\n"
        "        for j in range(i % 4):\n"
        "            hits.append((i, j))\n    else:\n        last = i\n",
        {},
    ),
}


@pytest.mark.parametrize("row", list(ROWS))
def test_each_row_of_the_table_is_serial_equivalent(ip, cluster, row):
    cell, ns = ROWS[row]
    assert_serial_equivalent(ip, cell, ns)


def test_numpy_arrays_in_and_out(ip, cluster):
    ns = {
        "data": np.arange(4000, dtype=np.float32).reshape(100, 40),
        "table": np.zeros((100, 3)),
    }
    cell = (
        "rows = []\nfor i, r in enumerate(data):\n    rows.append(r * 2)\n"
        "    table[i] = (r.sum(), r.max(), i)\n    last = r\n"
    )
    got = assert_serial_equivalent(ip, cell, ns)
    assert got["rows"][5].flags.writeable


def test_torch_tensors_in_and_out_with_cuda_code(ip, cluster, capsys):
    torch.manual_seed(0)
    ns = {
        "model": torch.nn.Linear(8, 3),
        "batches": [torch.randn(4, 8) for _ in range(12)],
    }
    cell = (
        "outs = []\ntotal = torch.zeros(3)\nfor x in batches:\n"
        "    y = model.cuda()(x.cuda())\n    outs.append(y.detach().cpu())\n"
        "    total += y.detach().sum(0).cpu()\n"
    )
    ip.user_ns["torch"] = torch
    serial_cell = cell.replace("model.cuda()", "model").replace("x.cuda()", "x")
    serial = copy.deepcopy(ns)
    serial["torch"] = torch
    exec(serial_cell, serial)
    ip.user_ns.update(copy.deepcopy(ns))
    ip.run_cell_magic("gpu_parallel", "", cell)
    out = capsys.readouterr().out
    assert "run the CUDA code of line(s) 5" in out  # the magic's line is line 1
    assert len(ip.user_ns["outs"]) == 12
    for a, b in zip(serial["outs"], ip.user_ns["outs"], strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert torch.allclose(serial["total"], ip.user_ns["total"], atol=1e-5)


def test_tensor_indexed_write_and_dataset_slices(ip, cluster):
    ns = {"X": torch.arange(60.0).reshape(20, 3), "res": torch.zeros(20)}
    assert_serial_equivalent(
        ip, "for i, row in enumerate(X):\n    res[i] = row.sum()\n", ns
    )


def test_prints_are_forwarded_tagged_with_engine_and_iteration(ip, cluster, capsys):
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "for i in range(4):\n    print('hello', i)\n"
    )
    out = capsys.readouterr().out
    for i in range(4):
        assert f"| iteration {i}] hello {i}" in out


def test_printed_lines_come_out_in_iteration_order(ip, cluster, capsys):
    """The first half is slow, the second fast: engine 1 finishes first, but its
    lines wait for the iterations before them, as serially."""
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --schedule static",
        "import time\nfor i in range(12):\n"
        "    time.sleep(0.15 if i < 6 else 0.0)\n    print('line', i)\n",
    )
    out = capsys.readouterr().out
    order = [int(x.split("line ")[1]) for x in out.splitlines() if "line " in x]
    assert order == list(range(12))


def test_a_line_left_open_by_one_chunk_goes_on_in_the_next(ip, cluster, capsys):
    """``print(i, end=" ")``: serially one line ``0 1 2 ... 7``; the chunks'
    pieces of it are joined in iteration order (one tag, no line break at a
    chunk's end)."""
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --chunksize 2",
        "for i in range(8):\n    print(i, end=' ')\nprint()\n",
    )
    out = capsys.readouterr().out
    lines = [x for x in out.splitlines() if x.strip()]
    assert len(lines) == 1, out
    assert lines[0].endswith("] 0 1 2 3 4 5 6 7 ") and lines[0].count("[engine") == 1


def test_every_print_arrives_from_many_small_chunks(ip, cluster, capsys):
    """Engines skip flushes with nothing written (engine_tuning): output written
    just before a chunk ends must still arrive, in full."""
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --schedule dynamic --chunksize 1",
        "for i in range(60):\n    print('line', i, 'x' * 50)\n",
    )
    out = capsys.readouterr().out
    for i in range(60):
        assert out.count(f"| iteration {i}] line {i} {'x' * 50}\n") == 1, i


def test_an_unfinished_line_shows_while_its_iteration_runs(ip, cluster, monkeypatch):
    """Progress written without a newline (dots, a counter) is held for whole
    lines, but not for longer than PARTIAL_LINE_WAIT: it shows while the
    iteration is still running."""
    from gpucell.kernel.relay import PARTIAL_LINE_WAIT

    arrivals: list[tuple[float, str]] = []

    class Recording(io.StringIO):
        def write(self, s: str) -> int:
            arrivals.append((time.perf_counter(), s))
            return super().write(s)

    monkeypatch.setattr(sys, "stdout", Recording())
    cell = (
        "import time\n"
        "for i in range(2):\n"
        "    print('working', end='', flush=True)\n"
        f"    time.sleep({PARTIAL_LINE_WAIT + 1.5})\n"
        "    print(' done')\n"
    )
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    end = time.perf_counter()
    text = "".join(s for _, s in arrivals)
    lines = text.splitlines()
    # each engine's line shows; one left open is ended before another's starts
    assert sum(line.count("working") for line in lines) == 2
    assert all(line.count("working") <= 1 for line in lines)
    assert text.count("done") == 2
    first = min(t for t, s in arrivals if "working" in s)
    assert end - first > 0.5  # shown before the iterations ended


def test_summary_line_and_last_run(ip, cluster, capsys):
    ip.run_cell_magic("gpu_parallel", "", "for i in range(50):\n    v = i\n")
    out = capsys.readouterr().out
    assert "gpucell: 50 iterations on 2 engines" in out
    lr = gpucell.last_run
    assert lr.status == "ok" and lr.iterations == 50
    rows = lr.rows()
    assert [r["iteration"] for r in rows] == list(range(50))
    assert {r["engine"] for r in rows} <= set(cluster.ids)
    assert all(r["end"] >= r["start"] for r in rows)
    assert set(lr.busy) == set(cluster.ids)


def test_exception_in_iteration_k_keeps_type_and_namespace(ip, cluster):
    ip.user_ns.update({"out": ["before"], "acc": 0})
    cell = "for i in range(30):\n    out.append(i)\n    acc += 1 / (i - 17)\n"
    with pytest.raises(ZeroDivisionError) as info:
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    note = "\n".join(getattr(info.value, "__notes__", []))
    assert "iteration 17" in note and "loop values 17" in note
    assert "engine" in note and "line 4" in note  # the magic's line is line 1
    assert ip.user_ns["out"] == ["before"] and ip.user_ns["acc"] == 0
    assert gpucell.last_run.status == "error"
    # the cluster is usable right after
    assert_serial_equivalent(ip, "for i in range(10):\n    acc += i\n", {"acc": 0})


def test_refusal_names_variable_and_line_and_runs_nothing(ip, cluster):
    ip.user_ns.update({"prev": 0, "out": []})
    cell = "out.append(1)\nfor i in range(5):\n    prev = prev + i\n    prev = i\n"
    with pytest.raises(gpucell.NotParallelizable, match=r"line \d.*`?prev"):
        ip.run_cell_magic("gpu_parallel", "", cell)
    assert ip.user_ns["out"] == []  # not even the prelude ran


def test_syntax_error_has_the_cells_line_numbers(ip, cluster):
    with pytest.raises(SyntaxError) as info:
        ip.run_cell_magic("gpu_parallel", "", "x = 1\nfor i in range(3):\n    y = (\n")
    assert info.value.lineno in (4, 5)  # the magic's line is line 1


def test_dry_run_shows_the_plan_and_runs_nothing(ip, cluster, capsys):
    ip.user_ns.update({"xs": [1, 2], "out": []})
    ip.run_cell_magic(
        "gpu_parallel", "--dry-run", "pre = 1\nfor x in xs:\n    out.append(x + pre)\n"
    )
    text = capsys.readouterr().out
    assert "out" in text and "xs" in text and "gather" in text
    assert "pre" not in ip.user_ns and ip.user_ns["out"] == []


def test_seed_gives_the_same_numbers_on_one_or_two_engines(ip, cluster):
    cell = (
        "import random\nimport numpy as np\ndraws = []\nfor i in range(16):\n"
        "    draws.append((random.random(), float(np.random.rand()), "
        "float(torch.rand(1))))\n"
    )
    ip.user_ns["torch"] = torch
    ip.run_cell_magic("gpu_parallel", "--quiet --seed 7", cell)
    two = list(ip.user_ns["draws"])
    ip.run_cell_magic(
        "gpu_parallel", f"--quiet --seed 7 --targets {cluster.ids[0]}", cell
    )
    one = list(ip.user_ns["draws"])
    assert one == two and len(set(two)) == 16
    ip.run_cell_magic("gpu_parallel", "--quiet --seed 8", cell)
    assert ip.user_ns["draws"] != two


@pytest.mark.parametrize("sched", ["static", "dynamic", "guided"])
def test_every_schedule_is_serial_equivalent(ip, cluster, sched):
    assert_serial_equivalent(
        ip,
        "out = []\nfor i in range(101):\n    out.append(i * i)\n    acc += i\n",
        {"acc": 5},
        f"--quiet --schedule {sched} --chunksize 7",
    )


def test_bad_options_are_usage_errors(ip, cluster):
    for line, msg in [
        ("--chunksize 0", "--chunksize 0"),
        ("--timeout -1", "--timeout"),
        ("--targets 99", "no live engine"),
        ("--devices 3", "no live engine on device '3'"),
        ("--devices cpu,99", "no live engine on device '99'"),
        ("--timeout nan", "--timeout nan: must be a number of seconds"),
        ("--timeout inf", "--timeout inf"),
        ("-t 0 -t 1", "-t given twice"),
        ("--retries -1", "must be 0 or more"),
        ("--schedule fast", "invalid choice"),
    ]:
        with pytest.raises(UsageError, match=msg):
            ip.run_cell_magic("gpu_parallel", line, "for i in range(3):\n    x = i\n")


def test_gpu_devices_on_a_cpu_cluster_use_the_stand_in_engines(ip, cluster, capsys):
    """A notebook written for a GPU node (`--devices 0`) runs on a laptop."""
    ip.user_ns["out"] = []
    first = sorted(cluster.live_ids())[0]
    ip.run_cell_magic(
        "gpu_parallel", "--devices 0", "for i in range(6):\n    out.append(i)\n"
    )
    assert ip.user_ns["out"] == list(range(6))
    assert "CPU engines stand in for the GPUs asked for (GPU 0 -> engine" in (
        capsys.readouterr().out
    )
    import gpucell

    assert gpucell.last_run.engines == (first,)


def test_ipythons_own_builtins_are_not_shipped_as_inputs(ip, cluster):
    from gpucell.kernel.session import using

    ip.user_ns["open"] = ip.user_ns_hidden["open"]  # other tests clear the namespace
    cell = "n = []\nfor i in range(3):\n    n.append(open is not None)\n"
    with using() as session:  # a fresh session: its plan cache holds this cell's
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert ip.user_ns["n"] == [True] * 3
    plans = [p for p in session.plans.plans() if "open is not None" in p.source]
    assert plans and all("open" not in p.inputs for p in plans)


def test_the_notebooks_warning_filters_apply_on_the_engines(ip, cluster, capsys):
    cell = (
        "import warnings\nfor i in range(4):\n"
        "    warnings.warn(f'noisy {i}', UserWarning)\n"
    )
    import warnings

    ip.run_cell("import warnings\nwarnings.simplefilter('ignore', UserWarning)")
    line = "--quiet --schedule static"  # on the engines (never inline)
    try:
        with warnings.catch_warnings(record=True) as caught:
            ip.run_cell_magic("gpu_parallel", line, cell)
        assert "noisy" not in capsys.readouterr().err and caught == []
    finally:
        ip.run_cell(
            "warnings.resetwarnings()\nwarnings.simplefilter('always', UserWarning)"
        )
    # shown: issued again in the kernel (tests/test_warnings_relay.py), where
    # pytest's own recorder would take them if this one did not
    with warnings.catch_warnings(record=True) as caught:
        ip.run_cell_magic("gpu_parallel", line, cell)
    assert sorted(str(w.message) for w in caught) == [f"noisy {i}" for i in range(4)]
    ip.run_cell("warnings.resetwarnings()")


def test_no_cluster_is_a_clear_error_or_a_serial_run(ip, no_active_cluster, capsys):
    ip.user_ns["out"] = []
    with pytest.raises(UsageError, match="No cluster.*%gpu_cluster start"):
        ip.run_cell_magic("gpu_parallel", "", "for i in range(3):\n    out.append(i)\n")
    assert ip.user_ns["out"] == []
    ip.run_line_magic("config", "GpuCell.serial_fallback = True")
    try:
        ip.run_cell_magic("gpu_parallel", "", "for i in range(3):\n    out.append(i)\n")
    finally:
        ip.run_line_magic("config", "GpuCell.serial_fallback = False")
    assert ip.user_ns["out"] == [0, 1, 2]
    assert "running the cell serially" in capsys.readouterr().out


def test_unchanged_big_input_is_sent_once(ip, cluster):
    ip.user_ns["big"] = np.ones(2_000_000)
    ip.user_ns["tot"] = 0.0
    cell = "for i in range(4):\n    tot += float(big[i])\n"
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    keys = {e: dict(c) for e, c in cluster.input_cache.items()}
    assert all("big" in c for c in keys.values())

    def cached_id():
        from gpucell.engine import worker

        return id(worker.cached("big"))

    before = cluster.client[:].apply_sync(cached_id)
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert cluster.client[:].apply_sync(cached_id) == before  # not re-sent
    ip.user_ns["big"][0] = 5.0  # changed in place: must be re-sent
    ip.user_ns["tot"] = 0.0
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert ip.user_ns["tot"] == 8.0


def test_cuda_oom_in_an_iteration_says_device_memory_and_what_to_change(ip, cluster):
    ip.user_ns["torch"] = torch
    cell = (
        "for i in range(6):\n    if i == 3:\n        raise torch.cuda.OutOfMemoryError("
        "'CUDA out of memory. Tried to allocate 1.50 GiB')\n"
    )
    with pytest.raises(torch.cuda.OutOfMemoryError) as info:
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    note = "\n".join(info.value.__notes__)
    assert "iteration 3" in note
    assert "CUDA out of memory on" in note and "asked for 1.50 GiB" in note
    assert "--per-gpu" in note


def test_rich_display_outputs_are_not_lost(ip, cluster, monkeypatch):
    shown = []
    monkeypatch.setattr(
        ip.display_pub, "publish", lambda data, metadata=None, **kw: shown.append(data)
    )
    cell = (
        "from IPython.display import display, Markdown\n"
        "for i in range(3):\n    display(Markdown(f'**item {i}**'))\n"
    )
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    md = sorted(d.get("text/markdown") for d in shown if "text/markdown" in d)
    assert md == [f"**item {i}**" for i in range(3)]


def test_selection_is_the_default_of_later_cells_and_shown_in_status(
    ip, cluster, capsys
):
    first = cluster.ids[0]
    try:
        ip.run_line_magic("gpu_cluster", f"select {first}")
        assert f"engines [{first}]" in capsys.readouterr().out
        ip.run_cell_magic("gpu_parallel", "--quiet", "for i in range(8):\n    v = i\n")
        assert gpucell.last_run.engines == (first,)
        ip.run_line_magic("gpu_cluster", "status")
        rows = capsys.readouterr().out.splitlines()[1:]
        marked = [r.split()[0] for r in rows]
        assert f"{first}*" in marked and all(
            "*" not in m for m in marked if m != f"{first}*"
        )
        with pytest.raises(UsageError, match="no live engine"):
            ip.run_line_magic("gpu_cluster", "select 99")
    finally:
        ip.run_line_magic("gpu_cluster", "select all")
    ip.run_cell_magic("gpu_parallel", "--quiet", "for i in range(8):\n    v = i\n")
    assert set(gpucell.last_run.engines) == set(cluster.ids)


def test_an_input_that_cannot_travel_is_named(ip, cluster):
    import threading

    ip.user_ns.update({"lock": threading.Lock(), "out": []})
    with pytest.raises(gpucell.GpucellError, match="`lock` \\(lock\\)"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "for i in range(4):\n    with lock:\n        out.append(i)\n",
        )
    assert ip.user_ns["out"] == []
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "for i in range(4):\n    out.append(i)\n"
    )
    assert ip.user_ns["out"] == [0, 1, 2, 3]


def test_a_cuda_device_held_in_a_variable_runs_on_cpu_engines(ip, cluster):
    """``dev = "cuda"`` from an earlier cell: the cell itself never says cuda."""
    ip.user_ns.update(
        dev="cuda", torch=torch, xs=[torch.full((3,), float(i)) for i in range(6)]
    )
    cell = "sums = []\nfor x in xs:\n    sums.append(float(x.to(dev).sum()))\n"
    for _ in range(2):  # the re-run must not be run in the kernel (no GPU here)
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert ip.user_ns["sums"] == [3.0 * i for i in range(6)]
        assert not gpucell.last_run.inline


def test_a_cheap_loops_first_run_takes_one_round_trip(ip, cluster):
    """Trial chunks: an unmeasured engine gets its whole part (one chunk when
    every engine hears the verdict on the trials, as here on one host; else
    two sent together) with a time budget, so a cheap loop needs no separate
    calibration round trip."""
    cluster.cost_history.clear()
    assert_serial_equivalent(
        ip, "out = []\nfor i in range(2000):\n    out.append(i * i)\n", {"out": []}
    )
    done = [c for c in gpucell.last_run.chunks if c.state == "done"]
    assert len(done) == (1 if shares_shm(cluster) else 2) * len(cluster.ids)
    assert {c.engine for c in done} == set(cluster.ids)


def test_a_trial_chunk_stopped_early_leaves_the_serial_result(ip, cluster):
    """Iterations of 20 ms overrun the 50 ms trial budget: the engines stop
    their first chunks early (each trial's rest, 37 iterations, would take
    over EXTEND_MAX_SECONDS) and the rest is scheduled from the measured pace."""
    from gpucell.kernel.dispatch import TRIAL_SECONDS

    cluster.cost_history.clear()
    cell = (
        "import time\n"
        "out, acc = [], 0\n"
        "for i in range(160):\n"
        "    time.sleep(0.02)\n"
        "    out.append(i)\n"
        "    acc += i\n"
        "    last = i\n"
    )
    assert_serial_equivalent(ip, cell, {})
    chunks = sorted(gpucell.last_run.chunks, key=lambda c: c.t_start)
    first = {}
    for c in chunks:
        first.setdefault(c.engine, c)
    assert all(c.stop - c.start <= TRIAL_SECONDS / 0.02 + 2 for c in first.values())
    assert len(chunks) > len(cluster.ids)


def test_a_uniform_loops_trials_run_whole_once_their_paces_agree(ip, cluster):
    """Iterations of 100 ms, 10 of them: each engine's part of 5 goes out as one
    trial (every engine hears the verdict), reaching its 50 ms budget after 1.
    There it publishes its pace in /dev/shm and runs on; the kernel reads the
    paces, finds them equal and writes the verdict, and every trial runs
    whole: 1 chunk per engine (a re-run's static split) instead of 4, the
    namespace as serial, and the verdict and pace files gone after."""
    import glob

    needs_shared_shm(cluster)
    cluster.cost_history.clear()
    cell = (
        "import time\n"
        "out = []\n"
        "for i in range(10):\n"
        "    time.sleep(0.1)\n"
        "    out.append(i)\n"
    )
    assert_serial_equivalent(ip, cell, {})
    chunks = [c for c in gpucell.last_run.chunks if c.state == "done"]
    assert len(chunks) == len(cluster.live_ids()), [
        (c.engine, c.start, c.stop) for c in chunks
    ]
    assert {c.stop - c.start for c in chunks} == {5}  # every trial, whole
    ch = cluster.results_channel()
    assert not glob.glob(f"{ch.directory}/gpucell-{ch.token}-verdict-*")
    assert not glob.glob(f"{ch.directory}/gpucell-{ch.token}-pace-*")


def test_an_uneven_loops_trials_are_told_to_stop(ip, cluster):
    """Iteration i sleeps i x 10 ms: the trials' published paces disagree, the
    verdict says stop, and the rests are shared out (more chunks than trials),
    the namespace as serial."""
    if cluster.results_channel() is None:
        pytest.skip("no shared /dev/shm between the kernel and its engines here")
    cluster.cost_history.clear()
    cell = (
        "import time\n"
        "out = []\n"
        "for i in range(24):\n"
        "    time.sleep(i * 0.01)\n"
        "    out.append(i)\n"
    )
    assert_serial_equivalent(ip, cell, {})
    chunks = [c for c in gpucell.last_run.chunks if c.state == "done"]
    assert len(chunks) > 2 * len(cluster.live_ids())
    assert max(c.stop - c.start for c in chunks) < 12


def test_a_chunk_held_up_by_a_costly_iteration_hands_its_rest_back(ip, cluster):
    """A first run where iteration 3 of 40 takes 0.6 s and the others 20 ms:
    the trials agree (uniform), so each engine's part runs whole, and the
    engine with iteration 3 would still hold 16 iterations when the other
    one is done.  The idle engine calls for them (a flag in /dev/shm), the
    chunk stops after iteration 3 and its rest is shared out: the namespace
    is the serial one (reductions, lists, dicts, last values), every
    iteration ran once, and the flag is gone after."""
    import glob

    needs_shared_shm(cluster)
    cluster.cost_history.clear()
    cell = (
        "import time\n"
        "out = []\n"
        "total = 0\n"
        "seen = {}\n"
        "for i in range(40):\n"
        "    time.sleep(0.6 if i == 3 else 0.02)\n"
        "    out.append(i * i)\n"
        "    total += i\n"
        "    seen[i] = str(i)\n"
        "    last = i\n"
    )
    assert_serial_equivalent(ip, cell, {})
    lr = gpucell.last_run
    assert lr.hand_backs >= 1, [(c.engine, c.start, c.stop) for c in lr.chunks]
    done = sorted((c.start, c.stop) for c in lr.chunks if c.state == "done")
    assert done[0][0] == 0 and done[-1][1] == 40
    assert all(a[1] == b[0] for a, b in zip(done, done[1:], strict=False))
    held = next(c for c in lr.chunks if c.start <= 3 < c.stop)
    assert held.stop < 20  # it stopped, instead of running its whole part
    ch = cluster.results_channel()
    assert not glob.glob(f"{ch.directory}/gpucell-{ch.token}-handback-*")


@pytest.mark.parametrize(
    ("line", "sizes"),
    [("--schedule static", {20}), ("--schedule dynamic --chunksize 5", {5})],
)
def test_first_runs_keep_the_chunks_asked_for(ip, cluster, line, sizes):
    """Trial chunks are guided's calibration only: a static split or a fixed
    chunk size is never cut short by a trial budget, even on a first run."""
    cluster.cost_history.clear()
    cell = (
        "import time\nout = []\n"
        "for i in range(40):\n    time.sleep(0.02)\n    out.append(i)\n"
    )
    assert_serial_equivalent(ip, cell, {}, line=f"--quiet {line}")
    done = [c for c in gpucell.last_run.chunks if c.state == "done"]
    assert {c.stop - c.start for c in done} == sizes


WITH_ROWS = {
    "torch.no_grad() around an evaluation loop": (
        "import torch\nouts = []\nwith torch.no_grad():\n    n_seen = 0\n"
        "    for x in batches:\n        outs.append(model(x))\n"
        "    n_seen = len(outs)\n",
        {
            "model": torch.nn.Linear(4, 2),
            "batches": [torch.ones(3, 4) * i for i in range(7)],
        },
    ),
    "two contexts in one with, and statements after it": (
        "import numpy as np\nimport torch\nlogs = []\n"
        "with np.errstate(divide='ignore'), torch.inference_mode():\n"
        "    for v in vals:\n        logs.append(float(np.log(v)))\n"
        "done = len(logs)\n",
        {"vals": [0.0, 1.0, 2.0, 0.0, 4.0]},
    ),
    "nested withs with a prelude inside": (
        "import torch\nout = []\nwith torch.no_grad():\n    k = 3\n"
        "    with torch.autocast('cpu', enabled=False):\n"
        "        for i in range(12):\n            out.append(i * k)\n"
        "        last = i\n",
        {},
    ),
}


@pytest.mark.parametrize("row", list(WITH_ROWS))
def test_loops_inside_with_blocks_give_the_serial_namespace(ip, cluster, row):
    cell, ns = WITH_ROWS[row]
    assert_serial_equivalent(ip, cell, dict(ns), "--quiet --schedule static")


def test_a_context_is_entered_on_the_engines_around_each_chunk(ip, cluster, capsys):
    ip.user_ns.update(np=np, vals=[0.0, 1.0, 0.0])
    cell = (
        "logs = []\nwith np.errstate(divide='ignore'):\n"
        "    for v in vals:\n        logs.append(float(np.log(v)))\n"
    )
    ip.run_cell_magic("gpu_parallel", "--quiet --schedule static", cell)
    assert ip.user_ns["logs"] == [float("-inf"), 0.0, float("-inf")]
    assert "divide by zero" not in capsys.readouterr().err  # errstate on the engines


def test_catch_warnings_and_a_filter_set_inside_the_with_reach_the_engines(
    ip, cluster, capsys
):
    import warnings

    cell = (
        "import warnings\nwith warnings.catch_warnings():\n"
        "    warnings.simplefilter('ignore')\n    for i in range(4):\n"
        "        warnings.warn(f'inside {i}')\n"
    )
    before = list(warnings.filters)
    ip.run_cell_magic("gpu_parallel", "--quiet --schedule static", cell)
    assert "inside" not in capsys.readouterr().err
    assert warnings.filters == before  # the kernel left the context


def test_a_with_target_the_loop_reads_is_refused(ip, cluster, tmp_path):
    path = tmp_path / "lines.txt"
    path.write_text("a\nb\n")
    ip.user_ns.update(path=str(path), out=[])
    with pytest.raises(NotParallelizable, match="which a `with ... as fh` around it"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "with open(path) as fh:\n    for i in range(2):\n"
            "        out.append(fh.readline())\n",
        )
    assert ip.user_ns["out"] == []
    # iterating over the file itself is fine: its lines are read in the kernel
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "with open(path) as fh:\n"
        "    for line in fh:\n        out.append(line.strip())\n",
    )
    assert ip.user_ns["out"] == ["a", "b"]


def test_a_lock_around_the_loop_is_refused_by_name_and_released(ip, cluster):
    lock = threading.Lock()
    ip.user_ns.update(lock=lock, out=[])
    with pytest.raises(NotParallelizable, match=r"`with lock:` \(line 2\)") as info:
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "with lock:\n    for i in range(4):\n        out.append(i)\n",
        )
    assert "a lock guards only the kernel" in str(info.value)
    assert ip.user_ns["out"] == [] and not lock.locked()


def test_the_dry_run_shows_the_with_blocks_and_their_statements(ip, cluster, capsys):
    ip.run_cell_magic(
        "gpu_parallel",
        "--dry-run",
        "import torch\nouts = []\nwith torch.no_grad():\n    k = 2\n"
        "    for i in range(3):\n        outs.append(i * k)\n    n = len(outs)\n",
    )
    text = capsys.readouterr().out
    assert "with torch.no_grad() (line 4): entered in the kernel; engines" in text
    assert "inside it, before the loop (kernel): line 5" in text
    assert "inside it, after the loop (kernel):  line 8" in text


def test_an_error_a_with_would_suppress_stops_the_cell(ip, cluster):
    ip.user_ns.update(xs=[0, 1, 2, 3], out=[])  # serially: out == []
    cell = (
        "import contextlib\nwith contextlib.suppress(ZeroDivisionError):\n"
        "    for x in xs:\n        out.append(6 // x)\nafter = 1\n"
    )
    with pytest.raises(IterationError, match="a `with` around it suppressed the error"):
        ip.run_cell_magic("gpu_parallel", "--quiet --schedule static", cell)
    assert ip.user_ns["out"] == [] and "after" not in ip.user_ns


def test_a_loop_local_that_cannot_travel_back_does_not_fail_the_loop(
    ip, cluster, tmp_path, capsys
):
    """`g` (a generator) cannot come back from an engine: the loop's results
    still merge, `g` keeps its value from before the cell, and one note says
    so.  (A closed file comes back as an equal closed file.)"""
    path = tmp_path / "x.txt"
    path.write_text("data")
    ip.user_ns.update(path=str(path), sizes=[], g="before")
    cell = (
        "for i in range(6):\n    g = (c for c in open(path).read())\n"
        "    sizes.append(len(list(g)) + i)\n"
    )
    ip.run_cell_magic("gpu_parallel", "--schedule static", cell)
    assert ip.user_ns["sizes"] == [4 + i for i in range(6)]
    assert ip.user_ns["g"] == "before"
    out = capsys.readouterr().out
    assert "`g` keeps the value it had before the cell" in out
    assert "generator" in out


def test_reading_another_iterations_element_is_still_refused(ip, cluster):
    ip.user_ns["a"] = [1, 2, 3, 4]
    cell = "for i in range(len(a) - 1):\n    a[i + 1] = a[i] * 2\n"
    with pytest.raises(NotParallelizable, match="is combined across iterations"):
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert ip.user_ns["a"] == [1, 2, 3, 4]
    # two writes of the own element, the second reading the first: each engine
    # writes a private copy (an own-row write), so this one is accepted
    cell = "for i in range(len(a)):\n    a[i] = a[i] * 2\n    a[i] = a[i] + 1\n"
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert ip.user_ns["a"] == [3, 5, 7, 9]


PANDAS_ROWS = {
    ".at by label from iterrows": (
        "for idx, row in df.iterrows():\n    df.at[idx, 'c'] = row['a'] * 2\n",
        None,
    ),
    ".loc by label, two columns read": (
        "for idx, row in df.iterrows():\n    df.loc[idx, 'c'] = row['a'] + row['b']\n",
        None,
    ),
    ".iat by position": (
        "for i in range(len(df)):\n    df.iat[i, 2] = i * 10.0\n",
        None,
    ),
    ".at read and written on the row's own label": (
        "for idx, row in df.iterrows():\n    df.at[idx, 'c'] = df.at[idx, 'a'] * 2\n",
        None,
    ),
    ".loc over df.index, reading the own row": (
        "for idx in df.index:\n    df.loc[idx, 'c'] = df.loc[idx, 'a'] + 1\n",
        None,
    ),
    ".iloc by enumerate's position": (
        "for i, (idx, row) in enumerate(df.iterrows()):\n"
        "    df.iloc[i, 2] = row['a'] + i\n",
        None,
    ),
}


@pytest.mark.parametrize("row", list(PANDAS_ROWS))
def test_pandas_row_writes_give_the_serial_frame(ip, cluster, row):
    pd = pytest.importorskip("pandas")
    cell, _ = PANDAS_ROWS[row]
    df = pd.DataFrame(
        {"a": range(11), "b": [0.5 * i for i in range(11)], "c": [0.0] * 11},
        index=[f"r{i}" for i in range(11)],
    )
    got = assert_serial_equivalent(ip, cell, {"df": df}, "--quiet --schedule static")
    assert got["df"]["c"].abs().sum() > 0


def test_pandas_writes_to_other_rows_or_duplicate_labels_are_refused(ip, cluster):
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": [1, 2, 3], "c": [0.0] * 3}, index=["x", "y", "x"])
    ip.user_ns["df"] = df
    before = df.copy()
    with pytest.raises(NotParallelizable, match="duplicate labels"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "for idx, row in df.iterrows():\n    df.at[idx, 'c'] = row['a']\n",
        )
    ip.user_ns["df"] = df.reset_index(drop=True)
    with pytest.raises(
        NotParallelizable, match=r"iterates over `df.iterrows\(\)`, made from `df`"
    ):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "for idx, row in df.iterrows():\n    df.at[idx + 1, 'c'] = row['a']\n",
        )
    assert df.equals(before)


# -- what a loop's text does not show: helpers, objects, nan, the directory ----------


@pytest.mark.parametrize(
    ("helpers", "cell", "function", "name"),
    [
        (
            "uniq = []\ndef is_new(t):\n    return t not in uniq\n",
            "for t in tokens:\n    if is_new(t):\n        uniq.append(t)\n",
            "is_new",
            "uniq",
        ),
        (
            "prev = 0\ndef delta(v):\n    return v - prev\n",
            "diffs = []\nfor v in tokens:\n    diffs.append(delta(v))\n    prev = v\n",
            "delta",
            "prev",
        ),
        (  # read through a second function, from a notebook class's method
            "total = 0\ndef frac(v):\n    return v / (total or 1)\n"
            "class Scaler:\n    def __call__(self, v):\n        return frac(v)\n"
            "scale = Scaler()\n",
            "out = []\nfor v in tokens:\n    total += v\n    out.append(scale(v))\n",
            "scale",
            "total",
        ),
    ],
)
def test_a_helper_reading_a_global_the_loop_changes_is_refused(
    ip, cluster, helpers, cell, function, name
):
    """Serially a notebook function called in the loop sees what the iterations
    before it left in a global; on an engine it would read the value from
    before the loop (a silently different result, found by a sweep of real
    loops).  Refused before anything runs, naming the function, the global
    and the lines; the namespace is untouched."""
    ip.run_cell(helpers)
    ip.user_ns["tokens"] = [1, 2, 2, 3, 1, 4]
    before = {k: copy.copy(ip.user_ns.get(k)) for k in ("uniq", "prev", "total")}
    with pytest.raises(gpucell.NotParallelizable) as e:
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    msg = str(e.value)
    assert f"`{function}`" in msg and f"global `{name}`" in msg, msg
    assert "line" in msg and "argument" in msg
    assert {k: ip.user_ns.get(k) for k in before} == before


def test_a_helper_reading_only_what_the_loop_does_not_change_runs(ip, cluster):
    ip.run_cell("scale = 3\ndef times(v):\n    return v * scale\n")
    ip.user_ns["vals"] = list(range(9))
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "out = []\nfor v in vals:\n    out.append(times(v))\n",
    )
    assert ip.user_ns["out"] == [3 * v for v in range(9)]


def test_add_and_update_on_other_objects_are_refused_sets_dicts_counters_merge(
    ip, cluster
):
    """``.add``/``.update`` merge as a set union or dict update; on a notebook
    class (or a hash, a progress bar) the method does something else, which
    the merge replayed twice (a Bag of 7 items came back with 14).  Refused
    by name and type; sets, dicts and Counters still merge exactly."""
    ip.run_cell(
        "class Bag:\n    def __init__(self):\n        self.items = []\n"
        "    def add(self, x):\n        self.items.append(x)\n"
        "bag = Bag()\nimport hashlib\nh = hashlib.md5()\n"
    )
    for cell, name in (
        ("for i in range(7):\n    bag.add(i * 3)\n", "bag"),
        ("for c in [b'a', b'b']:\n    h.update(c)\ndigest = h.hexdigest()\n", "h"),
    ):
        with pytest.raises(gpucell.NotParallelizable, match=rf"`{name}\.add"):
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert ip.user_ns["bag"].items == [] and "digest" not in ip.user_ns
    ns = {"words": "a b a c b a".split()}
    cell = (
        "from collections import Counter\nseen = set()\nd = {}\nc = Counter()\n"
        "for w in words:\n    seen.add(w)\n    d.update({w: len(w)})\n"
        "    c.update([w])\n"
    )
    assert_serial_equivalent(ip, cell, ns, line="--quiet --chunksize 2")


def test_max_and_min_with_nan_are_the_serial_ones(ip, cluster):
    """``worst = max(worst, l)`` skips a nan serially (``nan > worst`` is
    false), but a chunk starting with nan kept nan as its partial and hid the
    rest of the chunk (1.2 came back as 0.6)."""
    nan = float("nan")
    ns = {"losses": [0.5, 0.3, 0.6, 0.2, nan, 0.9, 0.2, 1.2, nan, 0.4]}
    cell = (
        "worst = 0.0\nbest = 9.0\nfor l in losses:\n    worst = max(worst, l)\n"
        "    best = min(best, l)\n"
    )
    for line in ("--quiet --chunksize 2", "--quiet --chunksize 3"):
        got = assert_serial_equivalent(ip, cell, ns, line=line)
        assert got["worst"] == 1.2 and got["best"] == 0.2


def test_random_draws_are_named_even_with_quiet(ip, cluster, capsys):
    """A draw from a global generator makes the numbers differ from a serial
    run: said even with ``--quiet`` (it only drops the summary line), also
    when the draw is in a notebook function, or in a torch model's dropout
    left in training mode."""
    ip.run_cell(
        "import random\ndef coin():\n    return random.random() < 0.5\n"
        "import torch\nnet = torch.nn.Sequential(torch.nn.Linear(2, 2), "
        "torch.nn.Dropout(0.5))\n"
    )
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "flips = []\nfor i in range(6):\n    flips.append(coin())\n",
    )
    out = capsys.readouterr().out
    assert "`random.random` in `coin`" in out and "--seed" in out
    ip.user_ns["xs"] = [torch.ones(1, 2) * i for i in range(4)]
    cell = "outs = []\nfor x in xs:\n    outs.append(net(x))\n"
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert "`net`'s dropout in training mode" in capsys.readouterr().out
    ip.run_cell("net.eval()")
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert "warning" not in capsys.readouterr().out


def test_relative_paths_name_the_kernels_files(ip, cluster, tmp_path):
    """After ``%cd data`` (``os.chdir``) in the kernel, ``open("f1.txt")`` in
    the loop reads the kernel's ``data/f1.txt`` on the engines of its host,
    not a file of that name where the engines started."""
    import os

    (tmp_path / "f1.txt").write_text("x" * 10)
    (tmp_path / "f2.txt").write_text("y" * 20)
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        ns = {"names": ["f1.txt", "f2.txt"]}
        cell = (
            "import os\nsizes = {}\nfor n in names:\n"
            "    sizes[n] = os.path.getsize(n)\n"
        )
        got = assert_serial_equivalent(ip, cell, ns, line="--quiet --chunksize 1")
        assert got["sizes"] == {"f1.txt": 10, "f2.txt": 20}
    finally:
        os.chdir(here)


def test_column_writes_with_duplicate_column_labels_are_refused(ip, cluster):
    """``for col, s in df.items(): df[col] = ...`` writes each iteration's own
    column only when no two columns share a label (serially ``items()``
    reads columns as it goes)."""
    import pandas as pd

    cell = "for col, s in df.items():\n    df[col] = s * 2\n"
    ok = pd.DataFrame({"a": [1, 2], "b": [3, 4]})
    assert_serial_equivalent(ip, cell, {"df": ok})
    dup = pd.DataFrame([[1, 2], [3, 4]], columns=["a", "a"])
    ip.user_ns["df"] = dup
    with pytest.raises(gpucell.NotParallelizable, match="columns has duplicate"):
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert ip.user_ns["df"].values.tolist() == [[1, 2], [3, 4]]


def test_the_loop_variable_is_the_kernels_own_last_item(ip, cluster):
    """Serially ``for xb in batches`` leaves ``xb`` the very object
    ``batches[-1]`` (a numpy row a view of its array); an engine's value is an
    equal copy.  Unless the body rebinds it, the kernel binds its own."""
    import numpy as np

    X = np.arange(12.0).reshape(4, 3)
    batches = [[i, i + 1] for i in range(5)]
    ip.user_ns.update({"X": X, "batches": batches, "out": []})
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "for i, (xb, row) in enumerate(zip(batches, X)):\n    out.append(sum(xb))\n",
    )
    ns = ip.user_ns
    assert ns["xb"] is batches[3] and ns["i"] == 3  # (zip stops at X's 4 rows)
    assert np.shares_memory(ns["row"], X) and ns["row"].flags.writeable
    ns["row"][0] = -1.0
    assert X[3, 0] == -1.0
    # an item of an object the loop changes is not what the last iteration
    # saw; a body that rebinds the name keeps the body's last value
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "for xb in batches:\n    xb = xb + [0]\n"
    )
    assert ns["xb"] == batches[-1] + [0]


def test_a_loop_that_reseeds_every_iteration_is_noted_not_warned(ip, cluster, capsys):
    """``torch.manual_seed(0)`` at the top of each iteration (a sweep that
    gives every model the same initial weights) makes each iteration's
    numbers the serial ones; only the kernel's generator is left where it
    was, which a note says.  A seed under an ``if`` still warns."""
    import torch

    ns = {"lrs": [0.1, 0.2, 0.3]}
    cell = (
        "import torch\nw = {}\nfor lr in lrs:\n    torch.manual_seed(0)\n"
        "    w[lr] = torch.randn(3) * lr\n"
    )
    assert_serial_equivalent(ip, cell, ns)
    out = capsys.readouterr().out
    assert "note: each iteration seeds" in out and "warning" not in out
    ip.user_ns["lrs"] = [0.1, 0.2, 0.3]
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "w = {}\nfor lr in lrs:\n    if lr < 0.15:\n        torch.manual_seed(0)\n"
        "    w[lr] = torch.randn(3)\n",
    )
    assert "warning" in capsys.readouterr().out
    del torch


def test_a_result_holding_the_loops_own_items_holds_the_kernels_objects(ip, cluster):
    """Serially ``adults.append(p)`` for ``p in people`` makes ``adults[0]``
    the very dict ``people[k]`` (a later change through one shows in the
    other); from an engine it was an equal copy.  Results that hold the
    loop's own items (gathered, in tuples, as a best-so-far, as dict values,
    through enumerate and zip) hold the kernel's objects."""
    people = [{"name": n, "age": a} for n, a in [("a", 30), ("b", 12), ("c", 45)]]
    rows = [[1, 2], [3, 4], [5, 6]]
    ip.user_ns.update({"people": people, "rows": rows, "adults": [], "by": {}})
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --chunksize 1",
        "pairs = []\n"
        "for i, (p, r) in enumerate(zip(people, rows)):\n"
        "    if p['age'] > 18:\n"
        "        adults.append(p)\n"
        "    pairs.append((i, r))\n"
        "    by[p['name']] = r\n",
    )
    ns = ip.user_ns
    assert [a is people[k] for a, k in zip(ns["adults"], (0, 2), strict=True)] == [
        True,
        True,
    ]
    assert all(pair[1] is rows[k] for k, pair in enumerate(ns["pairs"]))
    assert ns["by"]["b"] is rows[1] and ns["p"] is people[2]
    people[0]["age"] = 31
    assert ns["adults"][0]["age"] == 31  # as serially: one object


def test_with_open_in_the_body_leaves_a_closed_file_as_serially(ip, cluster, tmp_path):
    """``with open(p) as fh:`` in the body leaves ``fh`` a closed file
    serially; a file cannot travel, so the kernel stands in an equal closed
    one (type, name, mode, encoding) instead of leaving the name unbound."""
    import io

    for k in range(4):
        (tmp_path / f"f{k}.txt").write_text("x" * k)
    ns = {"paths": [str(tmp_path / f"f{k}.txt") for k in range(4)]}
    cell = (
        "sizes = []\nfor p in paths:\n    with open(p) as fh:\n"
        "        sizes.append(len(fh.read()))\n"
        "    with open(p + '.out', 'wb') as out:\n        out.write(b'1')\n"
    )
    ip.user_ns.update(ns)
    ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    fh, out = ip.user_ns["fh"], ip.user_ns["out"]
    assert ip.user_ns["sizes"] == [0, 1, 2, 3]
    assert type(fh) is io.TextIOWrapper and fh.closed
    assert fh.name == ns["paths"][-1] and fh.mode == "r"
    assert type(out) is io.BufferedWriter and out.closed
    assert out.name == ns["paths"][-1] + ".out"
    with pytest.raises(ValueError, match="closed file"):
        fh.read()


def test_one_file_written_by_every_iteration_is_refused(ip, cluster, tmp_path):
    """``open("log.txt", "a")`` (or ``"w"``) with the same path in every
    iteration: serially the lines end in iteration order (the last
    iteration's content for "w"); engines writing at once would not.
    Refused by line and path; a path built from the loop variable runs."""
    log = tmp_path / "log.txt"
    ip.user_ns["LOG"] = str(log)
    for mode in ("a", "w"):
        cell = (
            f"for i in range(6):\n    with open(LOG, '{mode}') as f:\n"
            "        f.write(str(i))\n"
        )
        with pytest.raises(gpucell.NotParallelizable, match="line 3 opens `LOG`"):
            ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    assert not log.exists()
    ip.user_ns["DIR"] = str(tmp_path)
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "for i in range(4):\n    with open(f'{DIR}/part{i}.txt', 'w') as f:\n"
        "        f.write(str(i))\n",
    )
    assert sorted(p.name for p in tmp_path.glob("part*")) == [
        f"part{i}.txt" for i in range(4)
    ]


def test_one_file_written_from_a_nested_loop_or_a_helper_is_refused(
    ip, cluster, tmp_path
):
    """The same file written from a loop inside the body, or by a notebook
    function the body calls: engines' writes would interleave (issue 28)."""
    log = tmp_path / "log.txt"
    ip.user_ns["LOG"] = str(log)
    nested = (
        "for i in range(6):\n    for j in range(2):\n        if j >= 0:\n"
        "            with open(LOG, 'a') as f:\n                f.write(str(i))\n"
    )
    with pytest.raises(gpucell.NotParallelizable, match="line 5 opens `LOG`"):
        ip.run_cell_magic("gpu_parallel", "--quiet", nested)
    ip.run_cell(
        "def note(msg):\n    with open(LOG, 'a') as f:\n        f.write(msg)\n"
        "    return len(msg)\n"
    )
    with pytest.raises(
        gpucell.NotParallelizable, match=r"`note`, which the loop calls, opens `LOG`"
    ):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "sizes = []\nfor i in range(6):\n    sizes.append(note(str(i)))\n",
        )
    assert not log.exists()
    # a helper writing a file named by its argument runs
    ip.user_ns["DIR"] = str(tmp_path)
    ip.run_cell(
        "def save(i):\n    with open(f'{DIR}/out{i}.txt', 'w') as f:\n"
        "        f.write(str(i))\n    return i\n"
    )
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "done = []\nfor i in range(4):\n    done.append(save(i))\n",
    )
    assert ip.user_ns["done"] == [0, 1, 2, 3]


def test_a_generator_that_changes_what_the_body_reads_is_refused(ip, cluster):
    """Drawing the items (all first, here) changes a name the body reads:
    serially each iteration sees only the items drawn before it."""
    ip.run_cell(
        "log = []\ndef gen():\n    for i in range(6):\n        log.append(i)\n"
        "        yield i\n"
    )
    with pytest.raises(
        gpucell.NotParallelizable, match=r"from the generator `gen` changed `log`"
    ):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "seen = []\nfor x in gen():\n    seen.append(len(log))\n",
        )
    ip.run_cell(
        "data = [1, 2, 3]\ndef twice():\n    for x in data:\n        yield 2 * x\n"
    )
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "out = []\nfor x in twice():\n    out.append(x + len(data))\n",
    )
    assert ip.user_ns["out"] == [5, 7, 9]


def test_functions_the_loop_makes_read_the_notebooks_globals(ip, cluster):
    """``fns.append(lambda: i * 10)``: serially every lambda reads the
    notebook's ``i`` when called (40 after the loop, the classic late
    binding); from an engine each read that engine's last ``i``.  Functions
    the loop's code makes come back on the notebook's globals; their
    defaults and closures travel as they are."""
    cell = (
        "fns = []\nbound = []\nfor i in range(5):\n"
        "    fns.append(lambda: i * 10)\n    bound.append(lambda i=i: i * 10)\n"
        "    def named(x):\n        return x + i\n"
        "post = [f() for f in fns]\npre = [f() for f in bound]\nlast = named(1)\n"
    )
    serial, got = run_both(ip, cell, {}, "--quiet --chunksize 2")
    for k in ("post", "pre", "last"):
        assert got[k] == serial[k], k
    assert got["post"] == [40] * 5 and got["pre"] == [0, 10, 20, 30, 40]
    assert got["last"] == 5
    assert ip.user_ns["fns"][0].__globals__ is ip.user_ns


@pytest.mark.parametrize(
    ("setup", "cell", "what"),
    [
        (  # __init__ bumps a class counter: the ids depend on the order
            "class Item:\n    count = 0\n    def __init__(self, v):\n"
            "        Item.count += 1\n        self.id = Item.count\n",
            "objs = []\nfor v in range(6):\n    objs.append(Item(v))\n",
            "class attribute(s) `count` changed",
        ),
        (  # a mutable default keeps state across calls
            "def add(x, acc=[]):\n    acc.append(x)\n    return len(acc)\n",
            "sizes = []\nfor v in range(6):\n    sizes.append(add(v))\n",
            "a default argument it keeps state in",
        ),
    ],
)
def test_state_a_call_keeps_across_iterations_fails_the_cell(
    ip, cluster, setup, cell, what
):
    """A notebook class whose attributes an iteration changes (through
    ``__init__``), or a function whose mutable default grows: serially later
    iterations see the earlier ones' changes; on engines each saw its own
    (ids 1, 2, 3 twice; and the returning instances overwrote the class's
    attributes with one engine's).  The run-time check fails the cell,
    nothing merged, naming what changed."""
    ip.run_cell(setup)
    from gpucell.errors import InputChanged

    with pytest.raises(InputChanged, match=re.escape(what)):
        ip.run_cell_magic("gpu_parallel", "--quiet --chunksize 2", cell)
    # (the line before the loop ran, as serially; nothing from the loop merged)
    assert ip.user_ns.get("objs", []) == [] and ip.user_ns.get("sizes", []) == []


def test_changing_a_modules_list_is_refused(ip, cluster):
    """``sys.path.append(d)`` in the body changes the engines' own ``sys``
    only: refused before the loop runs (the notebook's sys.path was left
    without the paths)."""
    import sys

    before = list(sys.path)
    ip.user_ns["ds"] = ["/tmp/gpucell-a", "/tmp/gpucell-b"]
    with pytest.raises(gpucell.NotParallelizable, match=r"sys\.path\.append"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "import sys\nfor d in ds:\n    if d not in sys.path:\n"
            "        sys.path.append(d)\n",
        )
    assert sys.path == before


def test_a_draw_after_a_reseeding_loop_is_warned(ip, cluster, capsys):
    """Each iteration reseeds, so the loop's numbers are the serial ones, but
    the kernel's generator is where it was before the cell: a draw after the
    loop in the same cell would differ, which a warning says."""
    ip.user_ns["ids"] = [1, 2, 3]
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "import random\ndraws = []\nfor i in ids:\n    random.seed(i)\n"
        "    draws.append(random.random())\nafter = random.random()\n",
    )
    out = capsys.readouterr().out
    assert "warning" in out and "`random.random` after the loop (line 7)" in out


def test_draws_inside_library_calls_are_warned(ip, cluster, capsys):
    """A loop that draws from a global generator no line of it names (an
    unseeded shuffling DataLoader): the engines see the generator's state
    change and the kernel warns; with --seed it does not."""
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        ip.run_cell(
            "import torch\nfrom torch.utils.data import DataLoader, TensorDataset\n"
            "X = torch.randn(32, 3)\n"
            "loader = DataLoader(TensorDataset(X), batch_size=8, shuffle=True)\n"
        )
        cell = (
            "firsts = []\nfor k in range(4):\n    for (xb,) in loader:\n"
            "        firsts.append(float(xb[0, 0]))\n        break\n"
        )
        capsys.readouterr()
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
        assert "drew from torch's global random generator" in capsys.readouterr().out
        ip.run_cell_magic("gpu_parallel", "--quiet --seed 1", cell)
        plain = "sums = []\nfor k in range(4):\n    sums.append(float(X[k].sum()))\n"
        ip.run_cell_magic("gpu_parallel", "--quiet", plain)
        assert "random generator" not in capsys.readouterr().out
    finally:
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")


@pytest.mark.parametrize(
    "call",
    [
        "os.chdir(d)",
        "pd.set_option('display.width', 100)",
        "np.seterr(all='ignore')",
        "torch.set_default_dtype(torch.float64)",
        "torch.set_float32_matmul_precision('medium')",
        "torch.nn.modules.module.register_module_forward_hook(lambda m, a, o: None)",
        "os.environ['X'] = str(i)",
    ],
)
def test_process_wide_state_changed_in_the_body_is_refused(ip, cluster, call):
    ip.run_cell("import os, numpy as np, pandas as pd, torch\nd = os.getcwd()")
    # (os.environ[...] = is an outer object's change, refused as such)
    with pytest.raises(
        gpucell.NotParallelizable, match="state of the whole process|`os` exists"
    ):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            f"out = []\nfor i in range(3):\n    {call}\n    out.append(i)\n",
        )


def test_a_setter_inside_a_with_that_puts_it_back_runs_as_serially(ip, cluster):
    """Within one iteration, a ``with`` that restores the state undoes the
    setter before the next iteration: nothing leaks (an "always" or "default"
    warnings filter stays refused: the kernel issues the warnings again under
    its own filters)."""
    import warnings

    ip.run_cell("import warnings, numpy as np, pandas as pd")
    cell = (
        "out = []\nfor i in range(4):\n"
        "    with warnings.catch_warnings():\n"
        "        warnings.simplefilter('ignore')\n"
        "        warnings.warn(f'hidden {i}')\n"
        "    with np.errstate(all='ignore'):\n"
        "        np.seterr(divide='ignore')\n"
        "        out.append(float(np.log(np.float64(i))))\n"
        "    with pd.option_context('display.width', 50):\n"
        "        pd.set_option('display.width', 60)\n"
        "        out.append(pd.get_option('display.width'))\n"
        "    warnings.warn(f'shown {i}')\n"
    )
    runs = []
    for magic in (False, True):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if magic:
                ip.run_cell_magic("gpu_parallel", "--quiet --schedule static", cell)
            else:
                assert ip.run_cell(cell).success
        runs.append((list(ip.user_ns["out"]), sorted(str(w.message) for w in caught)))
    assert runs[1] == runs[0]
    assert runs[0][1] == [f"shown {i}" for i in range(4)]
    with pytest.raises(gpucell.NotParallelizable, match="state of the whole process"):
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            "for i in range(3):\n    with warnings.catch_warnings():\n"
            "        warnings.simplefilter('always')\n        warnings.warn('x')\n",
        )


def test_run_time_refusals_are_listed_together(ip, cluster, tmp_path):
    """Every problem the pre-flight checks find after the prelude is named in
    one message, as the static analysis names its own, so the cell is fixed
    in one edit; the prelude ran (as serially), nothing of the loop did."""
    ip.run_cell(f"import os\nd = {str(tmp_path)!r}")
    cell = (
        "out = []\nfor i in range(3):\n    os.chdir(d)\n"
        "    with open(os.path.join(d, 'log.txt'), 'a') as f:\n"
        "        f.write(str(i))\n    out.append(i)\n"
    )
    with pytest.raises(gpucell.NotParallelizable) as e:
        ip.run_cell_magic("gpu_parallel", "--quiet", cell)
    msg = str(e.value)
    assert "(2 problems):" in msg
    assert "  - line 4: line 4 calls `os.chdir`" in msg
    assert "  - line 5: line 5 opens `os.path.join(d, 'log.txt')`" in msg
    assert "Nothing from the loop ran" in msg
    assert [d.kind for d in e.value.diagnostics] == ["process-state", "shared-file"]
    assert ip.user_ns["out"] == [] and not (tmp_path / "log.txt").exists()


SIZES = (
    "sizes = []\nfor i in range(4):\n    sizes.append(torch.zeros(2).element_size())\n"
)


def test_the_kernels_default_dtype_and_numpy_error_modes_apply_on_the_engines(
    ip, cluster
):
    """Set in an earlier cell, they change what the loop computes: serially
    ``torch.zeros`` is float64 after ``set_default_dtype(float64)``, and a
    division by zero raises under ``np.seterr(all="raise")``."""
    ip.run_cell("import numpy as np, torch")
    ip.run_line_magic("config", "GpuCell.inline_below = 0")
    try:
        ip.run_cell("torch.set_default_dtype(torch.float64)")
        ip.run_cell_magic(
            "gpu_parallel",
            "--quiet",
            SIZES,
        )
        assert ip.user_ns["sizes"] == [8] * 4
        ip.run_cell(
            "torch.set_default_dtype(torch.float32)\nold = np.seterr(all='raise')"
        )
        with pytest.raises(FloatingPointError):
            ip.run_cell_magic(
                "gpu_parallel",
                "--quiet",
                "qs = []\nfor i in range(4):\n"
                "    qs.append(np.float64(1.0) / np.float64(i))\n",
            )
    finally:
        ip.run_cell("torch.set_default_dtype(torch.float32)\nnp.seterr(**old)")
        ip.run_line_magic("config", "GpuCell.inline_below = 0.005")
    # the engines are back to their own settings for later cells
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        SIZES,
    )
    assert ip.user_ns["sizes"] == [4] * 4


def test_a_sets_order_given_to_a_list_is_warned(ip, cluster, capsys):
    """list(set(words)): for strings the order follows each process's hash
    seed, so engines may differ from the kernel; sorted(...) is not warned."""
    ip.user_ns["docs"] = ["b a c", "d e"]
    capsys.readouterr()
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "t = []\nfor d in docs:\n    t.append(list(set(d.split())))\n",
    )
    assert "follows each process's hash seed" in capsys.readouterr().out
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet",
        "t = []\nfor d in docs:\n    t.append(sorted(set(d.split())))\n",
    )
    assert "hash seed" not in capsys.readouterr().out
