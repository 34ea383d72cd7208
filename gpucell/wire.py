"""How values travel between the kernel and the engines, without needless copies.

ipyparallel's own serialisation sends a numpy array as its own zero-copy zmq frame only
when the array is a top-level ``apply`` argument (or an item of a top-level
list/tuple/dict): anything deeper, and every torch tensor, is pickled in-band, i.e.
copied into one big pickle and copied again out of it. gpucell's inputs (dicts of
models, datasets, tensors) and results (``ChunkResult`` dataclasses full of user values)
are nested, so this module turns any value into a *list of frames*:

``[header, payload, buf_0, buf_1, ...]``

* ``payload`` is a protocol-5 pickle made by a :class:`cloudpickle.CloudPickler`
  subclass (so functions and classes defined in a notebook's ``__main__`` travel);
* every large contiguous numpy array or torch tensor becomes one out-of-band
  ``buf_i``: a :class:`memoryview` of the object's own memory (no copy on the sender);
* ``header`` is a tiny pickle saying how ``buf_i`` map onto the frames.

Passed as ONE top-level ``apply`` argument or returned from the applied function, the
list is canned item by item by ipyparallel (``can_sequence``; the list must have fewer
than ``jupyter_client.session.MAX_ITEMS`` = 64 items, which :func:`dumps` guarantees),
so each memoryview larger than ``MAX_BYTES`` (1 KiB) is sent as its own zmq frame
without copying, and arrives as a (read-only) memoryview of the received zmq frame.

numpy and torch are optional: torch is imported only once a tensor is met.
"""

from __future__ import annotations

import contextvars
import ctypes
import io
import os
import pickle
import sys
import types
import warnings
import zlib
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import cloudpickle

__all__ = [
    "FORMAT",
    "FP_MAX_ITEMS",
    "INBAND_MAX",
    "MAX_FRAMES",
    "dumps",
    "fingerprint",
    "frames_nbytes",
    "loads",
]

#: Version tag written in every header; :func:`loads` refuses other versions.
FORMAT = ("gpucell.wire", 1)

#: Buffers smaller than this stay inside the pickle: a zmq frame costs a few
#: microseconds, about what copying 64 KiB costs, so smaller ones are cheaper in-band.
INBAND_MAX = 64 * 1024

#: At most this many frames per value. ipyparallel cans a list item by item only when it
#: has fewer than ``jupyter_client.session.MAX_ITEMS`` (64) items; a longer list is
#: pickled whole, i.e. every buffer copied. Beyond it the smallest buffers are joined.
MAX_FRAMES = 63

_PROTOCOL = 5


# --------------------------------------------------------------------------------------
# dumps
# --------------------------------------------------------------------------------------


class _Pickler(cloudpickle.CloudPickler):
    """cloudpickle, plus zero-copy torch tensors and non-contiguous numpy arrays."""

    def reducer_override(self, obj: Any) -> Any:
        t = type(obj)
        mod = t.__module__
        if mod.startswith("torch"):
            rv = _reduce_torch(obj)
            if rv is not NotImplemented:
                return rv
        elif mod == "numpy" and t.__name__ == "ndarray":
            rv = _reduce_ndarray(obj)
            if rv is not NotImplemented:
                return rv
        return super().reducer_override(obj)


def _reduce_ndarray(a: Any) -> Any:
    """Big non-contiguous arrays: one contiguous copy sent out of band.

    numpy's own reduction pickles them in-band through ``tobytes()``: a copy into a
    bytes object and a second one into the pickle stream (and a third out of it).
    """
    flags = a.flags
    if flags.c_contiguous or flags.f_contiguous or a.dtype.hasobject:
        return NotImplemented
    if a.nbytes < INBAND_MAX:
        return NotImplemented
    import numpy as np

    return np.ascontiguousarray(a).__reduce_ex__(_PROTOCOL)


def _reduce_torch(obj: Any) -> Any:
    """Reduce a plain strided tensor to raw bytes plus what is needed to rebuild it.

    The bytes are a raw view of the tensor's memory (zero-copy for contiguous CPU
    tensors), so every dtype travels, including those numpy lacks (bfloat16, float8,
    complex32). Anything exotic falls back to torch's own pickling.
    """
    torch = sys.modules.get("torch")
    if torch is None or type(obj) is not torch.Tensor:
        # Parameters reduce to a plain tensor (their ``.data``) plus flags: that
        # tensor comes back here.
        return NotImplemented
    t = obj
    if t.layout != torch.strided or t.is_quantized or t.is_meta or t.is_nested:
        return NotImplemented
    device = t.device.type
    d = t.detach()
    if device != "cpu":
        d = d.cpu()
    d = d.resolve_conj().resolve_neg()
    if not d.is_contiguous():
        d = d.contiguous()
    raw = _tensor_buffer(d)
    dtype = str(t.dtype).removeprefix("torch.")
    return (
        _rebuild_tensor,
        (pickle.PickleBuffer(raw), dtype, tuple(t.shape), t.requires_grad, device),
    )


def _tensor_buffer(d: Any) -> Any:
    """A writable buffer over a contiguous CPU tensor's bytes, holding the tensor.

    Not ``Tensor.numpy()``: that marks the storage non-resizable for good, a side
    effect on the user's tensor (``resize_`` would then fail). The buffer keeps ``d``
    alive; resizing ``d`` while the buffer is in use would free its memory (the caller
    must not, as with any in-flight zero-copy send).
    """
    nbytes = d.numel() * d.element_size()
    if nbytes == 0:
        return bytearray()
    buf = (ctypes.c_char * nbytes).from_address(d.data_ptr())
    buf._gpucell_keep = d  # type: ignore[attr-defined]
    return buf


@dataclass(frozen=True)
class _LoadOptions:
    cuda_to: Any
    writable: bool


_DEFAULT_OPTIONS = _LoadOptions(None, True)
_OPTIONS: contextvars.ContextVar[_LoadOptions | None] = contextvars.ContextVar(
    "gpucell_wire_load_options", default=None
)


def _rebuild_tensor(
    buf: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool, device: str
) -> Any:
    """Inverse of :func:`_reduce_torch`; runs inside :func:`loads` (reads its options).

    Also used when a pickle made by :func:`dumps` is loaded with plain
    :func:`pickle.loads`: then tensors stay on the CPU.
    """
    import torch

    opts = _OPTIONS.get() or _DEFAULT_OPTIONS
    tdtype = getattr(torch, dtype)
    nbytes = memoryview(buf).nbytes
    if nbytes == 0:
        t = torch.empty(shape, dtype=tdtype)
    else:
        with warnings.catch_warnings():
            # Read-only buffers only reach here when the caller asked for
            # ``writable=False``: the tensor then shares the received frame.
            warnings.filterwarnings("ignore", message=".*not writable.*")
            raw = torch.frombuffer(buf, dtype=torch.uint8)
        t = raw.view(tdtype).reshape(shape)
    if device != "cpu" and opts.cuda_to is not None:
        t = t.to(opts.cuda_to)
    if requires_grad:
        t.requires_grad_(True)
    return t


def dumps(obj: Any) -> list[memoryview | bytes]:
    """Serialise ``obj`` into frames whose big buffers are the objects' own memory.

    Parameters
    ----------
    obj : object
        Anything cloudpickle can pickle. Contiguous numpy arrays and CPU torch
        tensors of at least :data:`INBAND_MAX` bytes are not copied: their frames are
        views of their memory. Non-contiguous ones are copied once (contiguous).
        GPU tensors are copied to the host once; :func:`loads` can put them back on a
        GPU (``cuda_to``).

    Returns
    -------
    list of memoryview or bytes
        At most :data:`MAX_FRAMES` frames. Pass the list as one top-level ipyparallel
        ``apply`` argument, or return it from the applied function, and each big frame
        travels as its own zero-copy zmq frame.

    Notes
    -----
    The frames alias the objects: do not mutate them until the message is sent
    (ipyparallel's ``AsyncResult.sent`` / ``wait_for_send``). Aliasing views of one
    tensor storage are sent separately and come back as independent tensors.
    """
    bufs: list[memoryview] = []

    def _out_of_band(pb: pickle.PickleBuffer) -> bool:
        raw = pb.raw()
        if raw.nbytes < INBAND_MAX:
            return True  # true: serialise in-band
        bufs.append(raw)
        return False

    f = io.BytesIO()
    _Pickler(f, protocol=_PROTOCOL, buffer_callback=_out_of_band).dump(obj)
    payload = f.getbuffer()
    frames, layout = _pack(bufs)
    header = pickle.dumps((*FORMAT, layout), protocol=_PROTOCOL)
    return [header, payload, *frames]


def _pack(
    bufs: list[memoryview],
) -> tuple[list[memoryview | bytes], tuple[tuple[int, int, int], ...] | None]:
    """Keep the largest buffers as frames; join the smallest if there are too many."""
    room = MAX_FRAMES - 2
    if len(bufs) <= room:
        return list(bufs), None
    order = sorted(range(len(bufs)), key=lambda i: bufs[i].nbytes, reverse=True)
    own = set(order[: room - 1])
    joined = bytearray()
    frames: list[memoryview | bytes] = []
    layout = []
    for i, b in enumerate(bufs):
        if i in own:
            layout.append((len(frames), 0, b.nbytes))
            frames.append(b)
        else:
            layout.append((-1, len(joined), len(joined) + b.nbytes))
            joined += b
    last = len(frames)
    layout = [(last if fi < 0 else fi, a, z) for fi, a, z in layout]
    frames.append(memoryview(joined))
    return frames, tuple(layout)


def frames_nbytes(frames: Iterable[Any]) -> int:
    """Total size of ``frames`` in bytes (what travels, headers included)."""
    return sum(memoryview(f).nbytes for f in frames)


# --------------------------------------------------------------------------------------
# loads
# --------------------------------------------------------------------------------------


def loads(frames: Sequence[Any], *, cuda_to: Any = None, writable: bool = True) -> Any:
    """Rebuild the object :func:`dumps` serialised, on top of the received frames.

    Parameters
    ----------
    frames : sequence of bytes-like
        As received (bytes, memoryviews of zmq frames, ...).
    cuda_to : torch.device or str, optional
        Tensors that lived on a non-CPU device when dumped are moved there (the
        engine's GPU in the kernel-to-engine direction). ``None`` leaves them on the
        CPU.
    writable : bool
        Serial code would hand the user writable arrays, but received zmq frames are
        read-only: each read-only frame is then copied once (about the cost of a
        memcpy, a few GB/s). ``False`` skips that copy: numpy arrays come back
        read-only views of the frames, and torch tensors (which have no read-only
        flag) share them, so writing to them writes into the received message.

    Notes
    -----
    Frames that are writable are used as they are: ``loads(dumps(x))`` in one process
    shares memory with ``x``.
    """
    header = pickle.loads(frames[0])
    if tuple(header[:2]) != FORMAT:
        raise ValueError(f"not a gpucell.wire message (header {header[:2]!r})")
    layout = header[2]
    raw = list(frames[2:])
    if writable:
        raw = [_writable(f) for f in raw]
    if layout is None:
        bufs: list[Any] = raw
    else:
        views = [memoryview(f).cast("B") for f in raw]
        bufs = [views[fi][a:z] for fi, a, z in layout]
    token = _OPTIONS.set(_LoadOptions(cuda_to, writable))
    try:
        return pickle.loads(frames[1], buffers=bufs)
    finally:
        _OPTIONS.reset(token)


def _writable(frame: Any) -> Any:
    mv = memoryview(frame)
    if not mv.readonly:
        return frame
    return bytearray(mv)


# --------------------------------------------------------------------------------------
# fingerprint
# --------------------------------------------------------------------------------------

#: Containers with more items than this (all levels together) get no fingerprint.
FP_MAX_ITEMS = 10_000

_CRC_BLOCK = 16 << 20
_pool: ThreadPoolExecutor | None = None


def _checksum(buf: Any) -> tuple[int, ...]:
    """crc32 of ``buf``, per 16 MiB block, blocks in parallel threads.

    Measured on 256 MiB here: crc32 3.0-3.5 GB/s on one core (5.6 GB/s on two
    threads), adler32 3.0, sha1 1.7, blake2b 0.74. crc32 is the fastest and detects
    every change confined to 4 bytes; any other change escapes it with probability
    2**-32 per block. zlib releases the GIL on large buffers, hence the threads.
    """
    global _pool
    mv = memoryview(buf).cast("B")
    n = mv.nbytes
    if n <= _CRC_BLOCK:
        return (zlib.crc32(mv),)
    if _pool is None:
        _pool = ThreadPoolExecutor(
            max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="gpucell-crc"
        )
    blocks = [mv[i : i + _CRC_BLOCK] for i in range(0, n, _CRC_BLOCK)]
    return tuple(_pool.map(zlib.crc32, blocks))


class _Budget:
    def __init__(self, n: int) -> None:
        self.left = n

    def take(self, n: int) -> bool:
        self.left -= n
        return self.left >= 0


_CONTAINERS = frozenset({list, dict, set, OrderedDict})
_IMMUTABLE = (str, bytes, int, bool, type(None), type(Ellipsis), range)


def fingerprint(obj: Any) -> Hashable | None:
    """A cheap key that changes whenever ``obj``'s content could have changed.

    Used to cache big inputs on engines across cells: an input whose fingerprint equals
    the one it had when last sent is not sent again. ``None`` means "no usable
    fingerprint: always send". It must never claim "unchanged" for a changed object,
    so it is exact where that is cheap and ``None`` where it is not.

    * immutable scalars, ``str``, ``bytes``: the value itself (held, so ids cannot be
      reused); floats by their bits (``0.0`` and ``-0.0`` differ, ``nan`` equals
      itself); tuples and frozensets of these;
    * numpy arrays: identity, layout and a crc32 of the bytes (numpy has no version
      counter);
    * torch tensors: identity, layout and autograd's version counter (bumped by every
      in-place op, optimizer steps included), plus a crc32 of the bytes for CPU tensors,
      because writes through ``.data`` or a numpy alias do not bump it;
    * lists, dicts, sets, ``nn.Module`` (its whole ``__dict__``, submodules,
      parameters, buffers, flags, user attributes): identity plus the fingerprints of
      every item, when all have one and there are at most :data:`FP_MAX_ITEMS` in all;
    * functions and classes importable by name outside ``__main__`` (they travel by
      reference): their name;
    * anything else (notebook functions whose globals may change, arbitrary objects):
      ``None``.
    """
    try:
        return _fp(obj, _Budget(FP_MAX_ITEMS), set())
    except _NoFingerprint:
        return None


class _NoFingerprint(Exception):
    pass


def _fp(obj: Any, budget: _Budget, active: set[int]) -> Hashable:
    if not budget.take(1):
        raise _NoFingerprint
    t = type(obj)
    if t in _IMMUTABLE:
        return (t, obj)
    if t is float:
        return (t, obj.hex())
    if t is complex:
        return (t, obj.real.hex(), obj.imag.hex())
    if t is tuple or t is frozenset:
        return (t, t(_fp(x, budget, active) for x in obj))
    mod = t.__module__
    if mod == "numpy":
        return _fp_numpy(obj)
    if mod.startswith("torch"):
        torch = sys.modules.get("torch")
        if torch is not None:
            if isinstance(obj, torch.Tensor):
                return _fp_tensor(obj, torch)
            if isinstance(obj, torch.nn.Module):
                return _fp_object(obj, budget, active)
            if t is torch.dtype or t is torch.device:
                return (t, str(obj))
    if t in _CONTAINERS:
        if id(obj) in active or not budget.take(len(obj)):
            raise _NoFingerprint
        active.add(id(obj))
        try:
            if t is dict or t is OrderedDict:
                items: Any = tuple(
                    (_fp(k, budget, active), _fp(v, budget, active))
                    for k, v in obj.items()
                )
            elif t is set:
                items = frozenset(_fp(x, budget, active) for x in obj)
            else:
                items = tuple(_fp(x, budget, active) for x in obj)
        finally:
            active.discard(id(obj))
        return (t, id(obj), items)
    if isinstance(obj, (types.FunctionType, types.BuiltinFunctionType, type)):
        return _fp_by_reference(obj)
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.nn.Module):
        # user-defined subclasses live in __main__ or user modules
        return _fp_object(obj, budget, active)
    raise _NoFingerprint


def _fp_object(obj: Any, budget: _Budget, active: set[int]) -> Hashable:
    """An object by its class and ``__dict__`` (used for ``nn.Module``)."""
    if id(obj) in active:
        raise _NoFingerprint
    active.add(id(obj))
    try:
        state = _fp(vars(obj), budget, active)
    finally:
        active.discard(id(obj))
    return (type(obj), id(obj), state)


def _fp_by_reference(obj: Any) -> Hashable:
    """Name of a function/class that cloudpickle sends by reference, else refuse.

    ``__main__`` functions and classes travel by value, with the globals they read:
    their content can change without the object changing, so they get no fingerprint.
    """
    mod = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None)
    if not mod or not qual or mod == "__main__" or "<locals>" in qual:
        raise _NoFingerprint
    target: Any = sys.modules.get(mod)
    for part in qual.split("."):
        target = getattr(target, part, None)
    if target is not obj:
        raise _NoFingerprint
    return ("ref", mod, qual)


def _fp_numpy(obj: Any) -> Hashable:
    import numpy as np

    if isinstance(obj, np.generic):
        if obj.dtype.hasobject:
            raise _NoFingerprint
        return (type(obj), obj.dtype.str, obj.tobytes())
    if type(obj) is not np.ndarray or obj.dtype.hasobject:
        raise _NoFingerprint  # subclasses (masked arrays...) carry more than bytes
    data = obj if obj.flags.c_contiguous else np.ascontiguousarray(obj)
    return (
        np.ndarray,
        id(obj),
        obj.shape,
        obj.dtype.str,
        obj.strides,
        obj.ctypes.data,
        _checksum(data.reshape(-1).view(np.uint8)) if data.size else (),
    )


def _fp_tensor(t: Any, torch: Any) -> Hashable:
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        raise _NoFingerprint
    if t.layout != torch.strided or t.is_quantized or t.is_meta or t.is_nested:
        raise _NoFingerprint
    try:
        version: int | None = t._version
    except RuntimeError:  # inference tensors track no version
        version = None
    crc: tuple[int, ...] = ()
    if t.device.type == "cpu":
        d = t.detach().resolve_conj().resolve_neg().contiguous()
        if d.numel():
            crc = _checksum(_tensor_buffer(d))
    elif version is None:
        raise _NoFingerprint
    return (
        type(t),
        id(t),
        t.data_ptr(),
        tuple(t.shape),
        tuple(t.stride()),
        t.storage_offset(),
        str(t.dtype),
        str(t.device),
        t.requires_grad,
        version,
        crc,
    )
