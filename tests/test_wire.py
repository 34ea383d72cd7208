"""protocol.wire: round trips, zero-copy, fingerprints, and a real 2-engine cluster."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
import torch

from gpucell.protocol import wire
from gpucell.protocol.fingerprint import FP_MAX_ITEMS, fingerprint

MiB = 1 << 20


@dataclass
class Nested:
    """Stands for ``ChunkResult``: user values nested in a dataclass."""

    values: dict[str, Any] = field(default_factory=dict)
    items: list[Any] = field(default_factory=list)


def _addr(buf: Any) -> int:
    """Address of the first byte of a buffer (bytes, memoryview, array)."""
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


def _ro(frames: list[Any]) -> list[Any]:
    """Frames as a receiver sees them: read-only copies, as from zmq."""
    return [bytes(f) for f in frames]


def rt(obj: Any, **kw: Any) -> Any:
    return wire.loads(_ro(wire.dumps(obj)), **kw)


# --------------------------------------------------------------------------------------
# round trips
# --------------------------------------------------------------------------------------

NP_CASES = {
    "f32": np.arange(100_000, dtype=np.float32),
    "f16": np.linspace(0, 1, 70_000).astype(np.float16),
    "bool": np.arange(100_000) % 3 == 0,
    "complex": (np.arange(50_000) * (1 + 2j)).astype(np.complex128),
    "0d": np.array(3.5),
    "empty": np.zeros((0, 7), dtype=np.int64),
    "fortran": np.asfortranarray(np.arange(120_000.0).reshape(300, 400)),
    "noncontig_big": np.arange(400_000.0).reshape(400, 1000)[:, ::3],
    "noncontig_small": np.arange(100.0).reshape(10, 10)[::2, 1::3],
    "structured": np.zeros(5, dtype=[("a", "i4"), ("b", "f8")]),
    "object": np.array([1, "x", None], dtype=object),
    "u8_small": np.arange(10, dtype=np.uint8),
}


@pytest.mark.parametrize("name", list(NP_CASES))
def test_numpy_round_trip(name: str) -> None:
    a = NP_CASES[name]
    b = rt(a)
    assert type(b) is np.ndarray
    assert b.dtype == a.dtype and b.shape == a.shape
    if a.dtype.hasobject:
        assert list(b) == list(a)
    else:
        np.testing.assert_array_equal(b, a)
    assert b.flags.writeable
    if a.size and (a.flags.c_contiguous or a.flags.f_contiguous):
        assert b.strides == a.strides
    else:
        assert b.flags.c_contiguous  # as pickle does: views do not survive a process


TORCH_CASES = {
    "f32": lambda: torch.randn(300, 200),
    "bf16": lambda: torch.randn(300, 300).to(torch.bfloat16),
    "bf16_small": lambda: torch.randn(3, 5).to(torch.bfloat16),
    "f16": lambda: torch.randn(200, 200).half(),
    "bool": lambda: torch.rand(300, 300) > 0.5,
    "complex": lambda: torch.randn(100, 100, dtype=torch.complex64),
    "complex32": lambda: torch.view_as_complex(torch.randn(100, 100, 2).half()),
    "int8": lambda: torch.arange(-100, 100, dtype=torch.int8),
    "0d": lambda: torch.tensor(2.5),
    "0d_bf16": lambda: torch.tensor(2.5, dtype=torch.bfloat16),
    "empty": lambda: torch.empty(0, 5),
    "noncontig": lambda: torch.randn(300, 400).t(),
    "sliced": lambda: torch.arange(100_000.0)[::7],
    "conj": lambda: torch.randn(50, dtype=torch.complex64).conj(),
    "requires_grad": lambda: torch.randn(200, 200, requires_grad=True),
    "nonleaf": lambda: torch.randn(10, requires_grad=True) * 2,
}


@pytest.mark.parametrize("name", list(TORCH_CASES))
def test_torch_round_trip(name: str) -> None:
    t = TORCH_CASES[name]()
    u = rt(t)
    assert type(u) is torch.Tensor
    assert u.dtype == t.dtype and u.shape == t.shape and u.device.type == "cpu"
    assert u.requires_grad == t.requires_grad
    assert u.is_leaf
    expected = t.detach().resolve_conj()
    if t.dtype == torch.complex32:  # no equal() for it: compare the bits
        u, expected = u.view(torch.int32), expected.view(torch.int32)
    assert torch.equal(u.detach(), expected)
    assert u.is_contiguous()
    u.detach().zero_() if u.numel() else None  # writable: no segfault, no warning


def test_torch_sparse_falls_back_to_torch_pickling() -> None:
    s = torch.eye(4).to_sparse()
    u = rt(s)
    assert u.is_sparse and torch.equal(u.to_dense(), s.to_dense())


def test_parameter_and_module_round_trip() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.ReLU())
    m[0].register_buffer("stat", torch.arange(5.0))
    m.eval()
    u = rt(m)
    assert isinstance(u[0].weight, torch.nn.Parameter)
    assert u[0].weight.requires_grad and not u.training
    x = torch.randn(2, 64)
    assert torch.equal(u(x), m(x))
    assert torch.equal(u[0].stat, m[0].stat)


def test_shared_tensor_object_stays_shared() -> None:
    t = torch.randn(300, 300)
    u = rt({"a": t, "b": t, "l": [t]})
    assert u["a"] is u["b"] is u["l"][0]


def test_nested_dataclass_dict_list() -> None:
    arrays = [np.full((256, 256), i, dtype=np.float32) for i in range(4)]
    tensors = [torch.full((128, 256), float(i)) for i in range(3)]
    obj = Nested(
        values={"a": arrays, "deep": {"t": tensors, "x": (1, "s", None)}},
        items=[b"raw" * 100_000, 1.5, {3, 4}],
    )
    out = rt(obj)
    assert isinstance(out, Nested)
    for a, b in zip(arrays, out.values["a"], strict=True):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(tensors, out.values["deep"]["t"], strict=True):
        assert torch.equal(a, b)
    assert out.values["deep"]["x"] == (1, "s", None)
    assert out.items == obj.items


def test_many_buffers_are_coalesced_below_ipyparallel_item_limit() -> None:
    arrays = [np.full(20_000, i, dtype=np.float64) for i in range(150)]  # 160 KB each
    arrays[7] = np.zeros(MiB, dtype=np.uint8)  # the biggest keeps its own frame
    frames = wire.dumps(arrays)
    assert len(frames) <= wire.MAX_FRAMES
    assert any(_addr(f) == arrays[7].ctypes.data for f in frames)
    out = wire.loads(_ro(frames))
    for a, b in zip(arrays, out, strict=True):
        np.testing.assert_array_equal(a, b)


def test_small_buffers_stay_in_band() -> None:
    frames = wire.dumps([np.zeros(100), torch.zeros(100)])
    assert len(frames) == 2


def test_plain_pickle_loads_when_no_buffers() -> None:
    frames = wire.dumps({"a": 1, "t": torch.ones(3)})
    assert pickle.loads(frames[1])["t"].tolist() == [1.0, 1.0, 1.0]


def test_rejects_foreign_frames() -> None:
    with pytest.raises(ValueError, match="not a gpucell.protocol.wire"):
        wire.loads([pickle.dumps(("other", 9, None)), pickle.dumps(1)])


def test_cuda_to_moves_tensors_that_lived_on_a_device() -> None:
    # No GPU here: drive the rebuild as loads would, for a tensor dumped from "cuda".
    buf = memoryview(np.arange(4, dtype=np.float32)).cast("B")
    token = wire._OPTIONS.set(wire._LoadOptions(cuda_to="meta", writable=True))
    try:
        moved = wire._rebuild_tensor(buf, "float32", (4,), True, "cuda")
        kept = wire._rebuild_tensor(buf, "float32", (4,), False, "cpu")
    finally:
        wire._OPTIONS.reset(token)
    assert moved.device.type == "meta" and moved.requires_grad and moved.is_leaf
    assert kept.device.type == "cpu"
    assert wire._rebuild_tensor(buf, "float32", (4,), False, "cuda").device.type == (
        "cpu"
    )


@pytest.mark.gpu
def test_cuda_tensor_round_trip() -> None:
    t = torch.randn(300, 300, device="cuda")
    frames = wire.dumps(t)
    assert wire.loads(_ro(frames)).device.type == "cpu"
    u = wire.loads(_ro(frames), cuda_to="cuda")
    assert u.device.type == "cuda" and torch.equal(u, t)


MAIN_CODE = """
import numpy as np
SCALE = 3
def f(x):
    return x * SCALE
class Point:
    def __init__(self, x, y):
        self.x, self.y = x, y
    def norm2(self):
        return self.x ** 2 + self.y ** 2
"""


def test_notebook_functions_and_classes_travel_by_value(tmp_path: Any) -> None:
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec(compile(MAIN_CODE, "<cell>", "exec"), ns)  # as a notebook cell would
    obj = {"f": ns["f"], "p": ns["Point"](3, 4), "a": np.ones(100_000)}
    frames = wire.dumps(obj)
    for i, f in enumerate(frames):
        (tmp_path / f"{i}.bin").write_bytes(bytes(f))
    probe = textwrap.dedent(f"""
        import json, pathlib
        from gpucell.protocol import wire
        from gpucell.protocol.fingerprint import fingerprint
        d = pathlib.Path({str(tmp_path)!r})
        frames = [d.joinpath(f"{{i}}.bin").read_bytes() for i in range({len(frames)})]
        o = wire.loads(frames)
        print(json.dumps([o["f"](2), o["p"].norm2(), float(o["a"].sum())]))
    """)
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert json.loads(out.stdout) == [6, 25, 100_000.0]


def test_module_imports_without_torch_or_numpy() -> None:
    probe = textwrap.dedent("""
        import sys
        sys.modules["torch"] = None
        sys.modules["numpy"] = None
        from gpucell.protocol import wire
        from gpucell.protocol.fingerprint import fingerprint
        assert wire.loads(wire.dumps({"a": [1, b"x" * 100_000]}))["a"][0] == 1
        assert fingerprint((1, "a")) is not None
        print("ok")
    """)
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "ok"


def test_torch_not_imported_when_no_tensor() -> None:
    probe = textwrap.dedent("""
        import sys, numpy as np
        from gpucell.protocol import wire
        from gpucell.protocol.fingerprint import fingerprint
        wire.loads(wire.dumps({"a": np.ones(100_000), "f": len}))
        fingerprint([np.ones(3), 1])
        print("torch" in sys.modules)
    """)
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "False"


# --------------------------------------------------------------------------------------
# zero copy
# --------------------------------------------------------------------------------------


def test_dumps_numpy_frame_is_the_array_memory() -> None:
    a = np.random.default_rng(0).random(MiB, dtype=np.float32)  # 4 MiB
    frames = wire.dumps({"nested": [Nested(values={"a": a})]})
    big = [f for f in frames if memoryview(f).nbytes == a.nbytes]
    assert len(big) == 1
    assert isinstance(big[0], memoryview)
    assert _addr(big[0]) == a.ctypes.data


def test_dumps_fortran_array_is_zero_copy() -> None:
    a = np.asfortranarray(np.ones((512, 512)))
    frames = wire.dumps(a)
    assert any(_addr(f) == a.ctypes.data for f in frames)


def test_dumps_tensor_frame_is_the_tensor_memory() -> None:
    t = torch.randn(MiB, requires_grad=True)
    p = torch.nn.Parameter(torch.randn(512, 512))
    frames = wire.dumps([t, p])
    addrs = {_addr(f) for f in frames}
    assert t.data_ptr() in addrs and p.data_ptr() in addrs


def test_loads_read_only_frames_without_copy_when_not_writable() -> None:
    a = np.arange(MiB, dtype=np.float32)
    t = torch.arange(MiB, dtype=torch.float32)
    frames = _ro(wire.dumps({"a": a, "t": t}))
    out = wire.loads(frames, writable=False)
    starts = {_addr(f) for f in frames}
    assert out["a"].ctypes.data in starts and not out["a"].flags.writeable
    assert out["t"].data_ptr() in starts
    np.testing.assert_array_equal(out["a"], a)


def test_loads_writable_copies_read_only_frames_once() -> None:
    a = np.arange(MiB, dtype=np.float32)
    frames = _ro(wire.dumps(a))
    out = wire.loads(frames)
    assert out.flags.writeable
    assert not any(np.shares_memory(out, np.frombuffer(f, np.uint8)) for f in frames)
    out[0] = 7  # the user's array is theirs


def test_loads_writable_frames_are_used_in_place() -> None:
    a = np.arange(MiB, dtype=np.float32)
    b = wire.loads(wire.dumps(a))  # documented: same-process frames alias
    assert np.shares_memory(a, b)


# --------------------------------------------------------------------------------------
# fingerprints
# --------------------------------------------------------------------------------------


def _changes(obj: Any, mutate: Any) -> bool:
    before = fingerprint(obj)
    assert before is not None
    assert fingerprint(obj) == before  # stable while unchanged
    mutate(obj)
    return fingerprint(obj) != before


def test_fingerprint_scalars_and_tuples() -> None:
    fp = fingerprint
    assert fp((1, "a", None, 2.0, b"x")) == fp((1, "a", None, 2.0, b"x"))
    assert fp(0.0) != fp(-0.0)
    assert fp(1) != fp(True) != fp(1.0)
    assert fp(float("nan")) == fp(float("nan"))
    assert fp("a" * 10) != fp("a" * 11)
    assert fp(np.float32(1)) != fp(np.float64(1))
    assert fp(len) == fp(len) is not None
    assert fp(np.ndarray) is not None


def test_fingerprint_none_for_unknowable_objects() -> None:
    ns: dict[str, Any] = {"__name__": "__main__"}
    exec("def f(x):\n    return x\nclass C: pass\n", ns)
    assert fingerprint(ns["f"]) is None  # reads globals that may change
    assert fingerprint(ns["C"]()) is None
    assert fingerprint(object()) is None
    assert fingerprint([1, object()]) is None
    assert fingerprint(list(range(FP_MAX_ITEMS + 1))) is None
    assert fingerprint(np.ma.masked_array([1, 2], mask=[0, 1])) is None
    loop: list[Any] = []
    loop.append(loop)
    assert fingerprint(loop) is None


def test_fingerprint_numpy_in_place_writes() -> None:
    a = np.random.default_rng(1).random(5 * MiB)  # 40 MiB: several crc blocks
    assert _changes(a, lambda x: x.__setitem__(-1, 0.5))
    assert not _changes(a, lambda x: None)
    assert _changes(a, lambda x: x.__setitem__(slice(None), x[::-1].copy()))
    view = a[::2]
    assert _changes(view, lambda v: a.__setitem__(0, -1.0))  # write through the base
    b = np.zeros(3)
    assert _changes(b, lambda x: x.resize(4, refcheck=False))


def test_fingerprint_distinguishes_equal_arrays() -> None:
    a, b = np.ones(10), np.ones(10)
    assert fingerprint(a) != fingerprint(b)  # distinct objects stay distinct


def test_fingerprint_tensor_in_place_ops() -> None:
    t = torch.randn(1000)
    assert _changes(t, lambda x: x.resize_(2000))
    assert _changes(t, lambda x: x.add_(1))
    assert _changes(t, lambda x: x.data.mul_(2))  # .data does not bump _version
    assert _changes(t, lambda x: x.numpy().__setitem__(0, 9.0))  # nor numpy aliases
    assert _changes(t, lambda x: x.requires_grad_(True))
    assert not _changes(t, lambda x: x + 1)
    with torch.inference_mode():
        inf = torch.ones(10)

    def write(x: torch.Tensor) -> None:
        with torch.inference_mode():
            x[0] = 2.0

    assert _changes(inf, write)


def test_fingerprint_module_optimizer_step_and_attributes() -> None:
    m = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))
    opt = torch.optim.SGD(m.parameters(), lr=0.1)

    def step(mod: torch.nn.Module) -> None:
        mod(torch.randn(16, 8)).sum().backward()
        opt.step()

    assert _changes(m, step)
    assert _changes(m, lambda mod: mod.eval())
    assert _changes(m, lambda mod: setattr(mod[0], "extra", 3))
    assert _changes(m, lambda mod: mod[1].running_mean.data.fill_(1.0))
    assert _changes(m, lambda mod: mod.append(torch.nn.ReLU()))
    assert not _changes(m, lambda mod: mod(torch.randn(4, 8)))  # eval: no stats

    def manual_sgd(mod: torch.nn.Module) -> None:
        for p in mod.parameters():
            p.data -= 0.01  # old-style update, invisible to the version counter

    assert _changes(m, manual_sgd)


def test_fingerprint_containers() -> None:
    xs = [torch.zeros(3), np.zeros(3), 1]
    assert _changes(xs, lambda v: v.append(2))
    assert _changes(xs, lambda v: v[0].add_(1))
    assert _changes(xs, lambda v: v[1].__setitem__(0, 1.0))
    assert _changes(xs, lambda v: v.__setitem__(2, 1.0))
    d = {"a": np.zeros(3), "b": [1, 2]}
    assert _changes(d, lambda v: v["b"].append(3))
    assert _changes(d, lambda v: v.__setitem__("c", 1))
    s = {1, 2}
    assert _changes(s, lambda v: v.add(3))


# --------------------------------------------------------------------------------------
# a real cluster
# --------------------------------------------------------------------------------------


def engine_round_trip(frames: list[Any]) -> list[Any]:
    """Runs on an engine: rebuild the inputs, return a nested result as frames."""
    from gpucell.protocol import wire as w

    inputs = w.loads(frames)
    arr, t = inputs["arr"], inputs["t"]
    arr[0] += 0  # writable on the engine
    result = Nested(
        values={"twice": arr * 2, "tensors": [t, t + 1]},
        items=[
            [type(f).__name__ for f in frames],
            float(arr.sum()),
            inputs["f"](3),
        ],
    )
    return w.dumps(result)


def triple(x: int) -> int:
    return 3 * x


@pytest.mark.cluster
def test_cluster_round_trip_nested(cluster: Any) -> None:
    from ipyparallel.serialize import serialize_object

    arr = np.random.default_rng(2).random(4 * MiB, dtype=np.float32)  # 16 MiB
    t = torch.randn(512, 256, dtype=torch.bfloat16, requires_grad=True)
    frames = wire.dumps({"arr": arr, "t": t, "f": triple})

    # ipyparallel cans the list item by item and sends our memoryviews themselves
    sent = serialize_object(frames)[1:]
    assert any(b is f and _addr(b) == arr.ctypes.data for b in sent for f in frames)

    view = cluster.client[cluster.client.ids[0]]
    raw = view.apply_sync(engine_round_trip, frames)
    big = [f for f in raw[2:] if memoryview(f).nbytes >= 8 * MiB]
    assert big and all(isinstance(f, memoryview) for f in big)  # zmq frames, no copy

    out = wire.loads(raw)
    assert isinstance(out, Nested)
    received_types, total, f3 = out.items
    assert received_types[2:] == ["memoryview"] * (len(frames) - 2)
    np.testing.assert_array_equal(out.values["twice"], arr * 2)
    assert out.values["twice"].flags.writeable
    assert total == pytest.approx(float(arr.sum()), rel=1e-5)
    t0, t1 = out.values["tensors"]
    assert t0.dtype == torch.bfloat16 and t0.requires_grad
    assert torch.equal(t0.detach(), t.detach())
    assert torch.equal(t1.detach(), t.detach() + 1)
    assert f3 == 9


def test_read_only_arrays_come_back_writable() -> None:
    """An engine's inputs are read-only views; a loop that hands one (or a
    row of one) back, as its loop variable's last value or in a list, must
    leave the kernel a writable array, as the serial loop does (a later
    ``row[0] = 1`` raised "assignment destination is read-only")."""
    for shape in ((8,), (300, 300), (4, 5)):
        a = np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape)
        a.flags.writeable = False
        views = [a, a[1:] if a.ndim == 1 else a[:, ::2]]
        for v in views:
            got = wire.loads(wire.dumps({"row": v})).get("row")
            assert got.flags.writeable and np.array_equal(got, v)
            got[...] = 0  # (writable: no error)
    assert not a.flags.writeable  # the original is left as it was


def test_gradients_of_leaf_tensors_and_parameters_travel() -> None:
    """A model trained in the loop (a hyper-parameter sweep's last one) keeps
    its parameters' ``.grad`` as the serial loop leaves them; torch's own
    pickling drops it."""
    m = torch.nn.Linear(3, 2)
    x = torch.ones(4, 3, requires_grad=True)
    (m(x) ** 2).sum().backward()
    got_m, got_x = wire.loads(wire.dumps((m, x)))
    assert isinstance(got_m.weight, torch.nn.Parameter)
    assert torch.equal(got_m.weight.grad, m.weight.grad)
    assert torch.equal(got_m.bias.grad, m.bias.grad)
    assert got_x.requires_grad and torch.equal(got_x.grad, x.grad)
    fresh = wire.loads(wire.dumps(torch.nn.Linear(2, 2)))
    assert fresh.weight.grad is None


def test_the_loops_own_items_travel_as_references() -> None:
    """``dumps(..., items=...)`` sends an object that is one of the loop's
    items as a reference, and ``loads(..., items=...)`` puts the receiver's
    own item there; nothing else changes, and a reference with no resolver
    is a clear error."""
    from gpucell.protocol.chunks import item_at, item_refs

    people = [{"n": 1}, {"n": 2}, {"n": 3}]
    chunk = ("enumerate", 5, ("zip", (("seq", people[1:]), ("seq", [7, 8]))))
    refs = item_refs(chunk, 5)
    assert refs == {id(people[1]): (5, "e", 0), id(people[2]): (6, "e", 0)}
    kernels = [{"n": 1}, {"n": 2}, {"n": 3}]  # the kernel's own, equal objects

    def own(i: int, path: tuple) -> object:
        one = ("enumerate", i, ("zip", (("seq", kernels[i - 4 : i - 3]), ("seq", [0]))))
        return item_at(one, path)

    frames = wire.dumps({"kept": [people[2], {"n": 2}], "last": people[1]}, items=refs)
    got = wire.loads(frames, items=own)
    assert got["kept"][0] is kernels[2] and got["last"] is kernels[1]
    assert got["kept"][1] == {"n": 2} and got["kept"][1] is not kernels[1]
    assert item_refs(("seq", [1, 2.0, "x"]), 0) == {}  # plain values: no refs
    # a tuple item's parts (`for name, m in models.items()`): m is the kernel's
    m, kernel_m = {"w": 1}, {"w": 1}
    pairs = ("seq", [("a", m)])
    refs = item_refs(pairs, 3)
    assert refs[id(m)] == (3, ("part", 1))
    assert item_at(("seq", [("a", kernel_m)]), refs[id(m)][1:]) is kernel_m
    with pytest.raises(pickle.UnpicklingError, match="no items were given"):
        wire.loads(frames)


def test_a_notebook_function_with_lru_cache_travels() -> None:
    """``@functools.lru_cache`` on a notebook function: pickle cannot find it
    by name elsewhere (the loop calling it was refused as unsendable); it
    travels as its function plus the cache's parameters, with a new cache."""
    import functools

    ns: dict = {"__name__": "__main__", "functools": functools}
    exec(
        "@functools.lru_cache(maxsize=64)\n"
        "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
        ns,
    )
    ns["fib"](20)
    got = wire.loads(wire.dumps(ns["fib"]))
    assert got(25) == 75025 and got.cache_parameters()["maxsize"] == 64
    assert got is not ns["fib"] and ns["fib"].cache_info().currsize == 21
