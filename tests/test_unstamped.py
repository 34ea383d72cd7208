"""Long chunks of a cheap body run the chunk program without per-iteration
stamps (``rewrite.unstamped``), and lose nothing a stamp gave: the iteration an
error or a print belongs to, the count, the loop's locals."""

from __future__ import annotations

import io

import pytest

from gpucell.core.analysis import analyse
from gpucell.engine.chunk import UNSTAMPED_MIN, Where, run_chunk
from gpucell.engine.worker import _Tagged

N = UNSTAMPED_MIN + 1000


def _program(cell: str, known=()):
    return analyse(cell, known_names=known).engine_program()


def test_a_cheap_reduction_gets_an_unstamped_variant_and_a_del_does_not():
    assert _program("acc = 0\nfor i in range(10):\n    acc += i\n", ["acc"])[3]
    cell = "out = []\nfor i in range(10):\n    x = i\n    out.append(x)\n    del x\n"
    assert _program(cell, ["out"])[3] is None


def test_a_long_chunk_runs_unstamped_with_the_same_result():
    prog = _program(
        "acc = 0\nfor i in range(n):\n    x = i * 2\n    acc += x\n", ["acc", "n"]
    )
    where = Where({}, 5)
    r = run_chunk(prog, {"n": N}, ("range", range(5, 5 + N)), 5, where=where)
    assert where.unstamped and not where.stamps
    assert r.count == N
    assert r.reductions["acc"] == ("+", sum(2 * i for i in range(5, 5 + N)))
    assert r.last_values["x"] == (4 + N, "value", 2 * (4 + N))
    assert r.last_values["i"] == (4 + N, "value", 4 + N)


@pytest.mark.parametrize("items", ["range", "list", "tuple"])
def test_an_error_names_its_iteration_without_stamps(items):
    seq = {"range": range(N), "list": list(range(N)), "tuple": tuple(range(N))}
    prog = _program(
        "acc = 0\nfor i in xs:\n    if i == 123_456:\n        raise ValueError(i)\n"
        "    acc += i\n",
        ["acc", "xs"],
    )
    where = Where({}, 0)
    with pytest.raises(ValueError) as e:
        run_chunk(
            prog,
            {"xs": None},
            ("seq" if items != "range" else "range", seq[items]),
            0,
            where=where,
        )
    assert where.unstamped
    assert e.value.gpucell_iteration == 123_456
    assert where.current() == 123_456


def test_a_print_is_tagged_with_its_iteration_without_stamps():
    prog = _program(
        "acc = 0\nfor i in range(n):\n    if i % 100_000 == 7:\n        print(i)\n"
        "    acc += i\n",
        ["acc", "n"],
    )
    buf = io.StringIO()
    where = Where({}, 0)
    import contextlib

    with contextlib.redirect_stdout(_Tagged(buf, 3, where)):
        run_chunk(prog, {"n": N}, ("range", range(N)), 0, where=where)
    assert where.unstamped
    lines = buf.getvalue().splitlines()
    assert lines[:2] == [
        "[engine 3 | iteration 7] 7",
        "[engine 3 | iteration 100007] 100007",
    ]


def test_short_chunks_seeds_and_trials_keep_their_stamps():
    prog = _program("acc = 0\nfor i in range(n):\n    acc += i\n", ["acc", "n"])
    where = Where({}, 0)
    run_chunk(prog, {"n": 10}, ("range", range(10)), 0, where=where)
    assert not where.unstamped and len(where.stamps) == 10
    where = Where({}, 0)
    run_chunk(
        prog, {"n": N}, ("range", range(N)), 0, where=where, seed_fn=lambda i: None
    )
    assert not where.unstamped and len(where.stamps) == N


def test_cheap_iterations_run_unstamped_from_a_shorter_chunk():
    prog = _program("acc = 0\nfor i in range(n):\n    acc += i\n", ["acc", "n"])
    where = Where({}, 0)
    r = run_chunk(prog, {"n": 5000}, ("range", range(5000)), 0, where=where, cheap=True)
    assert where.unstamped and r.count == 5000


def _trial(cell: str, known, ns, seq, *, budget: float, start: int = 0, **kw):
    import time

    where = Where({}, start)
    kind = "range" if isinstance(seq, range) else "seq"
    deadline = time.perf_counter() + budget
    r = run_chunk(
        _program(cell, known),
        ns,
        (kind, seq),
        start,
        where=where,
        deadline=deadline,
        cheap=True,
        **kw,
    )
    return r, where


@pytest.mark.parametrize("kind", [lambda r: r, list, tuple])
def test_a_cheap_trial_runs_unstamped_in_blocks_and_stops_between_them(kind):
    """A trial chunk of iterations measured cheap: no stamps, the deadline met at
    a block's end, and what ran is exactly the first ``count`` iterations."""
    n = 3_000_000
    cell = "acc = 0\nfor i in xs:\n    x = i * 3\n    acc += x\n"
    seq = kind(range(7, 7 + n))
    r, where = _trial(cell, ["acc", "xs"], {"xs": None}, seq, budget=0.02, start=7)
    assert where.unstamped and not where.stamps
    assert 0 < r.count < n  # stopped by the budget (3e6 iterations take ~0.2 s)
    assert where.done() == r.count
    assert r.reductions["acc"] == ("+", sum(3 * i for i in range(7, 7 + r.count)))
    last = 7 + r.count - 1
    assert r.last_values["x"] == (last, "value", 3 * last)
    assert r.last_values["i"] == (last, "value", last)


def test_a_cheap_trial_runs_whole_within_its_budget_and_names_a_failing_iteration():
    cell = "acc = 0\nfor i in range(n):\n    acc += i\n"
    r, where = _trial(cell, ["acc", "n"], {"n": 5000}, range(5000), budget=10.0)
    assert where.unstamped and r.count == 5000
    assert r.reductions["acc"] == ("+", sum(range(5000)))
    bad = (
        "acc = 0\nfor i in range(n):\n    if i == 4321:\n        raise ValueError(i)\n"
        "    acc += i\n"
    )
    with pytest.raises(ValueError) as e:
        _trial(bad, ["acc", "n"], {"n": 5000}, range(5000), budget=10.0)
    assert e.value.gpucell_iteration == 4321


def test_a_trial_not_known_cheap_or_seeded_keeps_its_stamps():
    import time

    prog = _program("acc = 0\nfor i in range(n):\n    acc += i\n", ["acc", "n"])
    for kw in ({"cheap": False}, {"cheap": True, "seed_fn": lambda i: None}):
        where = Where({}, 0)
        deadline = time.perf_counter() + 10
        r = run_chunk(
            prog,
            {"n": 5000},
            ("range", range(5000)),
            0,
            where=where,
            deadline=deadline,
            **kw,
        )
        assert not where.unstamped and len(where.stamps) == r.count == 5000


@pytest.mark.cluster
def test_a_cheap_loop_on_the_cluster_equals_the_serial_one(ip, cluster):
    cell = (
        "acc = 0\nlast = None\nfor i in range(600_000):\n    last = i % 7\n"
        "    acc += i * last\n"
    )
    ip.run_cell(cell, store_history=False).raise_error()
    serial = (ip.user_ns["acc"], ip.user_ns["last"], ip.user_ns["i"])
    for _ in range(2):  # the second run knows its iterations are cheap
        ip.user_ns.update(acc=None, last=None, i=None)
        ip.run_cell(
            "%%gpu_parallel --quiet --schedule dynamic --chunksize 50000\n" + cell,
            store_history=False,
        ).raise_error()
        assert (ip.user_ns["acc"], ip.user_ns["last"], ip.user_ns["i"]) == serial
    import gpucell

    chunks = gpucell.last_run.chunks
    assert sum(c.stop - c.start for c in chunks) == 600_000
    # each engine's first chunk of a cell is stamped (it measures), later ones not
    assert 0 < sum(1 for c in chunks if not c.iteration_starts) < len(chunks)


class _Told:
    """A trial's line to the kernel, as a test plays the kernel: the paces the
    trial published, and the verdicts it asked for (``answers`` in turn, the
    last one repeated)."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.published: list[tuple[int, float, bool]] = []
        self.polls = 0

    def publish(self, done, seconds, stamped):
        self.published.append((done, seconds, stamped))

    def poll(self):
        self.polls += 1
        return self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]


@pytest.mark.parametrize("cheap", [False, True])
def test_a_trial_told_to_run_whole_at_its_deadline_does(cheap, monkeypatch):
    """The kernel found the loop uniform while this trial ran (shm.verdict_path):
    at its deadline the trial publishes its pace, asks, and runs to the
    chunk's end; told no, it stops.  (The bound on how long the rest may take
    is the next test's: lifted here, so a slow first iteration on a loaded
    machine cannot decide it.)"""
    import time

    from gpucell.engine import chunk

    monkeypatch.setattr(chunk, "EXTEND_MAX_SECONDS", 1e9)

    prog = _program("acc = 0\nfor i in range(n):\n    acc += i\n", ["acc", "n"])

    def trial(told):
        return run_chunk(
            prog,
            {"n": 50_000},
            ("range", range(50_000)),
            0,
            where=Where({}, 0),
            deadline=time.perf_counter() - 1,  # passed: stops at once unless told
            cheap=cheap,
            verdict=told,
        )

    yes = _Told(True)
    r = trial(yes)
    assert r.count == 50_000 and yes.polls == 1
    assert len(yes.published) == 1 and yes.published[0][2] is not cheap
    assert r.reductions["acc"] == ("+", sum(range(50_000)))
    no = _Told(False)
    assert 0 < trial(no).count < 50_000 and no.polls == 1


def test_a_trial_runs_on_while_the_verdict_is_out_then_follows_it(monkeypatch):
    """No verdict yet at the deadline: the trial runs its own next iterations
    (nothing wasted) and asks again; the verdict decides then.  Never told:
    it stops once ``VERDICT_WAIT`` is over, as a trial without a line does."""
    import time

    from gpucell.engine import chunk

    monkeypatch.setattr(chunk, "EXTEND_MAX_SECONDS", 1e9)
    monkeypatch.setattr(chunk, "VERDICT_POLL", 0.0)
    prog = _program(
        "out = []\nfor i in range(n):\n    time.sleep(0.002)\n    out.append(i)\n",
        ["out", "n", "time"],
    )

    def trial(told, n=40):
        return run_chunk(
            prog,
            {"n": n, "time": time},
            ("range", range(n)),
            0,
            where=Where({}, 0),
            deadline=time.perf_counter() - 1,
            verdict=told,
        )

    monkeypatch.setattr(chunk, "VERDICT_WAIT", 30.0)  # a loaded host: no give-up
    late = _Told(None, None, None, True)  # the verdict comes at the 4th ask
    r = trial(late)
    assert r.count == 40 and late.polls == 4 and len(late.published) == 1
    assert r.gathers["out"] == list(range(40))
    stop = _Told(None, None, False)
    assert trial(stop).count == 3
    monkeypatch.setattr(chunk, "VERDICT_WAIT", 0.02)
    silent = _Told(None)
    r = trial(silent, n=1000)  # 2 ms iterations: ~10 run before it gives up
    assert 2 <= r.count < 200 and silent.polls == r.count


def test_a_trial_with_a_long_rest_goes_back_even_when_told_to_run_whole():
    """What is left would take ~2 s at the trial's pace (over EXTEND_MAX_SECONDS):
    the trial stops as usual, so progress and kept work stay fine-grained; it
    publishes its pace (the kernel judges the loop by it) but does not wait
    for, nor read, a verdict."""
    import time

    prog = _program(
        "out = []\nfor i in range(n):\n    time.sleep(0.02)\n    out.append(i)\n",
        ["out", "n", "time"],
    )
    told = _Told(True)
    r = run_chunk(
        prog,
        {"n": 100, "time": time},
        ("range", range(100)),
        0,
        where=Where({}, 0),
        deadline=time.perf_counter() + 0.01,
        verdict=told,
    )
    assert r.count == 1 and told.polls == 0 and len(told.published) == 1


class _Flag:
    """A hand-back flag raised from the start (the kernel's file, in memory)."""

    def __init__(self, threshold: float | None) -> None:
        self._threshold = threshold
        self.stopped = False
        self.asked = 0

    def threshold(self) -> float | None:
        self.asked += 1
        return self._threshold


def test_a_chunk_hands_its_rest_back_when_idle_engines_call_for_it():
    """Raised with a threshold below the rest's time at the chunk's pace, the
    flag stops the chunk after its current iteration (at least one runs) and
    the result covers what ran, as a trial stopped early does: stamped or
    unstamped, and a trial running whole after its verdict too."""
    import time

    prog = _program(
        "import time\nout = []\nfor i in range(n):\n    time.sleep(0.002)\n"
        "    out.append(i)\n",
        ["out", "n", "time"],
    )
    flag = _Flag(0.001)
    r = run_chunk(
        prog, {"n": 20, "time": time}, ("range", range(0, 20)), 0, hand_back=flag
    )
    assert flag.stopped and 1 <= r.count <= 18
    # a threshold the rest never exceeds, or no flag raised: the chunk runs whole
    for quiet in (_Flag(60.0), _Flag(None)):
        r = run_chunk(
            prog, {"n": 20, "time": time}, ("range", range(0, 20)), 0, hand_back=quiet
        )
        assert r.count == 20 and not quiet.stopped and quiet.asked >= 1
    # the unstamped program of a long cheap chunk stops at a block's end
    cheap = _program("acc = 0\nfor i in range(n):\n    acc += i\n", ["acc", "n"])
    where = Where({}, 0)
    big = UNSTAMPED_MIN * 50
    flag = _Flag(0.0)
    r = run_chunk(
        cheap, {"n": big}, ("range", range(big)), 0, where=where, hand_back=flag
    )
    assert where.unstamped and flag.stopped and 0 < r.count < big
    assert r.reductions["acc"] == ("+", sum(range(r.count)))


def test_a_chunk_never_hands_back_a_last_iteration():
    """A rest of one iteration would only move it: a two-item chunk stops for
    nothing, whatever the flag says."""
    prog = _program("out = []\nfor i in range(n):\n    out.append(i)\n", ["out", "n"])
    flag = _Flag(0.0)
    r = run_chunk(prog, {"n": 2}, ("range", range(2)), 0, hand_back=flag)
    assert r.count == 2 and not flag.stopped
