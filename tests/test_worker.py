"""Engine-side helpers that can be checked without an engine."""

from __future__ import annotations

import io

import pytest
import torch

from gpucell.engine.failure import _oom_note, describe_oom
from gpucell.engine.streams import Tagged as _Tagged
from gpucell.engine.where import Where


def test_oom_note_names_device_memory_request_and_fix():
    note = describe_oom(
        "CUDA out of memory. Tried to allocate 2.50 GiB (GPU 0; 79.15 GiB total)",
        "NVIDIA A100 (GPU 0)",
        total=80 * 2**30,
        free=1 * 2**30,
        held=70 * 2**30,
    )
    assert "NVIDIA A100 (GPU 0)" in note
    assert "80.0 GiB total" in note and "1.00 GiB free" in note
    assert "asked for 2.50 GiB" in note
    assert "--per-gpu" in note


def test_oom_note_is_only_for_cuda_oom(monkeypatch):
    monkeypatch.setenv("GPUCELL_DEVICE_NAME", "Fake GPU")
    assert _oom_note(ValueError("x")) is None
    note = _oom_note(torch.cuda.OutOfMemoryError("Tried to allocate 20.00 MiB"))
    assert note is not None and "Fake GPU" in note and "20.00 MiB" in note


def test_tagged_stream_prefixes_every_line():
    buf = io.StringIO()
    stamps = {3: 0.0}
    s = _Tagged(buf, 0, Where(stamps, 3))
    s.write("a\nb")
    s.write("c\n")
    stamps[4] = 0.1
    s.write("d\n")
    assert buf.getvalue() == (
        "[engine 0 | iteration 3] a\n[engine 0 | iteration 3] bc\n"
        "[engine 0 | iteration 4] d\n"
    )


def test_each_kernel_has_its_own_state_on_an_engine_and_old_ones_are_dropped():
    """Several notebooks may share engines: programs and cached inputs are kept
    per kernel, and a dead kernel's state cannot grow without bound."""
    from gpucell.engine import sessions, worker

    saved = dict(worker._sessions)
    worker._sessions.clear()
    try:
        worker.load("a", "prog-a", ["x"], {"x": "k1"}, wire_frames({"x": 1}), None, "A")
        worker.load("b", "prog-b", ["x"], {"x": "k2"}, wire_frames({"x": 2}), None, "B")
        a, b = sessions.session("A"), sessions.session("B")
        assert (a.cell, a.inputs, b.cell, b.inputs) == ("a", {"x": 1}, "b", {"x": 2})
        worker.tidy(["x"], "A")
        assert "x" not in a.cache and b.cache["x"] == ("k2", 2)
        worker.leave("A")
        assert list(worker._sessions) == ["B"]
        for i in range(sessions.MAX_SESSIONS + 3):
            sessions.session(f"k{i}")
        assert len(worker._sessions) == sessions.MAX_SESSIONS
        assert "B" not in worker._sessions  # the least recently used went first
    finally:
        worker._sessions.clear()
        worker._sessions.update(saved)


def wire_frames(value):
    from gpucell.protocol import wire

    return wire.dumps(value)


def test_a_full_collection_waits_until_the_engine_is_idle(monkeypatch):
    """Every FULL_EVERY-th collection scans frozen survivors too, but on the
    engine's event loop only once no chunk started for IDLE_FULL seconds: a
    cycle among frozen objects survives while chunks keep coming, and is freed
    once the engine is idle."""
    import asyncio
    import gc
    import weakref

    from gpucell.engine import runtime

    monkeypatch.setattr(runtime, "IDLE_FULL", 0.1)

    class Node:
        pass

    async def scenario() -> tuple[bool, bool, bool]:
        a, b = Node(), Node()
        a.other, b.other = b, a
        gone = weakref.ref(a)
        gc.collect()
        gc.freeze()  # the cycle is a frozen survivor now
        del a, b
        while runtime._collections % runtime.FULL_EVERY != runtime.FULL_EVERY - 1:
            runtime.collect()
        runtime.collect()  # the one that asks for a full collection
        waiting = "full collection" in runtime._idle_waiting
        for _ in range(3):  # chunks keep coming: it waits on
            await asyncio.sleep(0.06)
            runtime.busy()
        alive_while_busy = gone() is not None
        await asyncio.sleep(0.5)
        return waiting, alive_while_busy, gone() is None

    try:
        waiting, alive_while_busy, freed = asyncio.run(scenario())
    finally:
        gc.unfreeze()
    assert waiting and alive_while_busy and freed
    assert "full collection" not in runtime._idle_waiting


def test_worker_functions_travel_by_name():
    """The functions sent for every chunk pickle as a module path and a name
    (a plain function travels as its code, rebuilt per message), and still
    call the module's function of that name, as ipyparallel labels it."""
    import pickle

    import ipyparallel.serialize as ser

    from gpucell.engine import worker

    for f in (worker.RUN, worker.RUN_EACH, worker.TIDY, worker.TIDY_EACH):
        data = pickle.dumps(f, protocol=5)
        assert len(data) < 100 and b"co_code" not in data
        back = pickle.loads(data)
        assert back.name == f.name and back.__name__ == f.name
        # what ipyparallel sends: canned, then pickled, then the other way
        bufs = ser.pack_apply_message(f, (), {})
        g, args, kwargs = ser.unpack_apply_message(bufs)
        assert type(g) is worker.ByName and g.name == f.name
    seen = []
    orig = worker.tidy
    try:
        worker.tidy = lambda *a, **k: seen.append((a, k))  # type: ignore[assignment]
        worker.TIDY(["x"], kernel="K")
    finally:
        worker.tidy = orig  # type: ignore[assignment]
    assert seen == [((["x"],), {"kernel": "K"})]
    with pytest.raises(ValueError, match="no function 'nope'"):
        worker.ByName("nope")


def test_seeding_torch_draws_what_torch_manual_seed_draws() -> None:
    """--seed seeds torch's CPU generator directly (torch.manual_seed walks
    every backend: ~70 us per iteration); the numbers are the same."""
    import torch

    from gpucell.engine.reseed import seed_torch as _seed_torch

    torch.manual_seed(1234)
    want = torch.rand(5)
    torch.manual_seed(99)
    _seed_torch(torch, 1234)
    assert torch.equal(torch.rand(5), want)


def test_the_envelope_puts_streams_cwd_and_filters_back_however_a_chunk_ends(
    tmp_path,
):
    """Output tagged, the kernel's directory and warnings filters while the
    chunk runs; the engine's own back after an error and after an interrupt."""
    import os
    import sys
    import warnings

    from gpucell.engine.envelope import Envelope
    from gpucell.engine.sessions import Session
    from gpucell.protocol.conversation import ChunkTask

    st = Session(cwd=str(tmp_path), warning_filters=[])
    task = ChunkTask("c", [], 0, 1, None, None, None, None, None, "k", False)
    out, err, here = sys.stdout, sys.stderr, os.getcwd()
    filters = list(warnings.filters)
    for exc in (ValueError("x"), KeyboardInterrupt()):
        with pytest.raises(type(exc)):
            with Envelope(st, task, ("range", range(3)), Where({}, 0), "cpu") as env:
                assert os.getcwd() == str(tmp_path)
                assert isinstance(sys.stdout, _Tagged) and warnings.filters == []
                raise exc
        assert (sys.stdout, sys.stderr, os.getcwd()) == (out, err, here)
        assert warnings.filters == filters and env.compute >= 0
        assert env.drew() == []  # no --seed: generators watched, none drawn from
