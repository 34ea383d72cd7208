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

import builtins
import contextvars
import ctypes
import functools
import io
import pickle
import sys
import types
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import cloudpickle

from gpucell.protocol.globalrng import global_generator, the_global_generator

__all__ = [
    "FORMAT",
    "INBAND_MAX",
    "MAX_FRAMES",
    "dumps",
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
        if t is functools._lru_cache_wrapper:
            rv = _reduce_lru_cache(obj)
            if rv is not NotImplemented:
                return rv
        if mod.startswith("torch"):
            rv = _reduce_torch(obj)
            if rv is not NotImplemented:
                return rv
        elif mod == "numpy" and t.__name__ == "ndarray":
            rv = _reduce_ndarray(obj)
            if rv is not NotImplemented:
                return rv
        elif t.__name__ in ("RandomState", "Random"):
            name = global_generator(obj)
            if name is not None:  # the receiver's own, as a module would be
                return (the_global_generator, (name,))
        return super().reducer_override(obj)


def _reduce_lru_cache(obj: Any) -> Any:
    """A notebook function decorated with ``functools.lru_cache``: pickle finds
    no ``__main__.name`` on the other side, so it travels as its function
    (by value) and the cache's parameters, and gets a new, empty cache there
    (what it returns does not depend on the cache)."""
    fn = getattr(obj, "__wrapped__", None)
    if not isinstance(fn, types.FunctionType) or fn.__module__ != "__main__":
        return NotImplemented
    params = obj.cache_parameters()
    return (_rebuild_lru_cache, (fn, params["maxsize"], params["typed"]))


def _rebuild_lru_cache(fn: Any, maxsize: int | None, typed: bool) -> Any:
    return functools.lru_cache(maxsize=maxsize, typed=typed)(fn)


def _reduce_ndarray(a: Any) -> Any:
    """Big non-contiguous arrays: one contiguous copy sent out of band; small
    read-only ones: a writable copy (see below).

    numpy's own reduction pickles them in-band through ``tobytes()``: a copy into a
    bytes object and a second one into the pickle stream (and a third out of it).
    """
    flags = a.flags
    if not flags.writeable and not a.dtype.hasobject:
        # read-only (an engine's input is a read-only view, and a loop may hand
        # an input's element back): pickle marks a read-only buffer read-only
        # on the way back too, where the serial loop leaves a writable array
        if flags.c_contiguous or flags.f_contiguous:
            order = "C" if flags.c_contiguous else "F"
            raw = pickle.PickleBuffer(a)
            return (_rebuild_read_only, (raw, a.dtype, a.shape, order))
        import numpy as np

        return np.ascontiguousarray(a).__reduce_ex__(_PROTOCOL)  # (a copy)
    if flags.c_contiguous or flags.f_contiguous or a.dtype.hasobject:
        return NotImplemented
    if a.nbytes < INBAND_MAX:
        return NotImplemented
    import numpy as np

    return np.ascontiguousarray(a).__reduce_ex__(_PROTOCOL)


def _rebuild_read_only(buf: Any, dtype: Any, shape: Any, order: str) -> Any:
    """An array that was read-only where it was sent from, rebuilt as
    ``loads`` was asked: writable (the kernel: serial code would have a
    writable array) on the memory received when that is ours to write (a
    frame ``loads`` copied), else on a copy; or, where read-only views are
    asked for (an engine's inputs), a read-only view."""
    import numpy as np

    opts = _OPTIONS.get() or _DEFAULT_OPTIONS
    mv = memoryview(buf)
    if mv.readonly and opts.writable and mv.obj is not None:
        try:
            whole = memoryview(mv.obj)
        except TypeError:
            whole = mv
        if not whole.readonly and whole.nbytes == mv.nbytes:
            mv = whole  # the frame loads copied, or a result's mapping: ours
    arr = np.frombuffer(mv, dtype=dtype).reshape(shape, order=order)
    if opts.writable and not arr.flags.writeable:
        arr = arr.copy(order=order)
    return arr


def _reduce_torch(obj: Any) -> Any:
    """Reduce a plain strided tensor to raw bytes plus what is needed to rebuild it.

    The bytes are a raw view of the tensor's memory (zero-copy for contiguous CPU
    tensors), so every dtype travels, including those numpy lacks (bfloat16, float8,
    complex32). Anything exotic falls back to torch's own pickling.
    """
    torch = sys.modules.get("torch")
    if torch is None:
        return NotImplemented
    if type(obj) is torch.nn.Parameter and _grad(obj) is not None:
        # torch's own reduction keeps the data and flags but drops ``.grad``,
        # which the serial loop leaves on a model it trained
        return (_rebuild_parameter, (obj.data, obj.requires_grad, obj.grad))
    if type(obj) is not torch.Tensor:
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
    raw = tensor_buffer(d)
    dtype = str(t.dtype).removeprefix("torch.")
    args = (pickle.PickleBuffer(raw), dtype, tuple(t.shape), t.requires_grad, device)
    grad = _grad(t)
    return (_rebuild_tensor, args if grad is None else (*args, grad))


def _grad(t: Any) -> Any:
    """A leaf tensor's ``.grad`` (``None`` for others: reading a non-leaf's
    warns)."""
    return t.grad if t.is_leaf and t.requires_grad else None


def _rebuild_parameter(data: Any, requires_grad: bool, grad: Any) -> Any:
    import torch

    p = torch.nn.Parameter(data, requires_grad=requires_grad)
    p.grad = grad
    return p


def tensor_buffer(d: Any) -> Any:
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
    cell_globals: dict[str, Any] | None = None


_DEFAULT_OPTIONS = _LoadOptions(None, True)
_OPTIONS: contextvars.ContextVar[_LoadOptions | None] = contextvars.ContextVar(
    "gpucell_wire_load_options", default=None
)


def _rebuild_tensor(
    buf: Any,
    dtype: str,
    shape: tuple[int, ...],
    requires_grad: bool,
    device: str,
    grad: Any = None,
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
        if grad is not None:
            t.grad = grad
    return t


#: a persistent id naming one of the loop's own items (see ``dumps``'s ``items``)
ITEM = "gpucell-item"


class _ItemPickler(_Pickler):
    """Objects that are the loop's own items travel as a reference to them;
    functions the loop's code made travel without their globals (see
    ``dumps``'s ``cell_globals``)."""

    def __init__(
        self,
        *args: Any,
        items: dict[int, tuple[Any, ...]] | None,
        cell_globals: dict[str, Any] | None,
        **kw: Any,
    ):
        super().__init__(*args, **kw)
        self._items = items or {}
        self._cell_globals = cell_globals

    def persistent_id(self, obj: Any) -> Any:
        ref = self._items.get(id(obj))
        return None if ref is None else (ITEM, *ref)

    def reducer_override(self, obj: Any) -> Any:
        if (
            self._cell_globals is not None
            and type(obj) is types.FunctionType
            and obj.__globals__ is self._cell_globals
        ):
            return (
                _cell_function,
                (
                    obj.__code__,
                    obj.__name__,
                    obj.__defaults__,
                    obj.__kwdefaults__,
                    obj.__closure__,
                    obj.__qualname__,
                    dict(obj.__dict__),
                ),
            )
        return super().reducer_override(obj)


def _cell_function(
    code: Any,
    name: str,
    defaults: Any,
    kwdefaults: Any,
    closure: Any,
    qualname: str,
    attrs: dict[str, Any],
) -> Any:
    """A function the loop's code made, rebuilt on the receiver's globals
    (``loads``'s ``cell_globals``: the notebook's namespace), as serially:
    ``fns.append(lambda: i * 10)`` then reads the notebook's ``i`` when
    called after the loop, not the engine's."""
    opts = _OPTIONS.get() or _DEFAULT_OPTIONS
    g = opts.cell_globals
    if g is None:
        g = {"__builtins__": builtins}
    fn = types.FunctionType(code, g, name, defaults, closure)
    fn.__kwdefaults__ = kwdefaults
    fn.__qualname__ = qualname
    fn.__dict__.update(attrs)
    return fn


class _Unpickler(pickle.Unpickler):
    """Resolves item references with ``loads``'s ``items``."""

    def __init__(self, *args: Any, items: Callable[..., Any] | None, **kw: Any):
        super().__init__(*args, **kw)
        self._items = items

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and pid and pid[0] == ITEM):
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        if self._items is None:
            raise pickle.UnpicklingError(
                "a result names the loop's own items, but no items were given"
            )
        return self._items(pid[1], tuple(pid[2:]))


def dumps(
    obj: Any,
    items: dict[int, tuple[Any, ...]] | None = None,
    cell_globals: dict[str, Any] | None = None,
) -> list[memoryview | bytes]:
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

    items : dict, optional
        ``id(object) -> (iteration, *path)`` for objects that are the loop's
        own items (``protocol.chunks.item_refs``): each travels as a
        reference, and :func:`loads` puts the receiver's own item there.
    cell_globals : dict, optional
        The namespace the loop's code ran in: functions it made (their
        ``__globals__`` is it) travel without it, and :func:`loads` gives
        them the receiver's ``cell_globals``.

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
    if items or cell_globals is not None:
        _ItemPickler(
            f,
            protocol=_PROTOCOL,
            buffer_callback=_out_of_band,
            items=items,
            cell_globals=cell_globals,
        ).dump(obj)
    else:
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


def loads(
    frames: Sequence[Any],
    *,
    cuda_to: Any = None,
    writable: bool = True,
    items: Callable[[int, tuple[Any, ...]], Any] | None = None,
    cell_globals: dict[str, Any] | None = None,
) -> Any:
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
    items : callable, optional
        ``items(iteration, path)``: the receiver's own loop item that a
        reference made by ``dumps(..., items=...)`` names.
    cell_globals : dict, optional
        The globals of functions the loop's code made (``dumps``'s
        ``cell_globals``): the notebook's namespace in the kernel.

    Notes
    -----
    Frames that are writable are used as they are: ``loads(dumps(x))`` in one process
    shares memory with ``x``.
    """
    header = pickle.loads(frames[0])
    if tuple(header[:2]) != FORMAT:
        raise ValueError(f"not a gpucell.protocol.wire message (header {header[:2]!r})")
    layout = header[2]
    raw = list(frames[2:])
    if writable:
        raw = [_writable(f) for f in raw]
    if layout is None:
        bufs: list[Any] = raw
    else:
        views = [memoryview(f).cast("B") for f in raw]
        bufs = [views[fi][a:z] for fi, a, z in layout]
    token = _OPTIONS.set(_LoadOptions(cuda_to, writable, cell_globals))
    try:
        return _Unpickler(io.BytesIO(frames[1]), buffers=bufs, items=items).load()
    finally:
        _OPTIONS.reset(token)


def _writable(frame: Any) -> Any:
    mv = memoryview(frame)
    if not mv.readonly:
        return frame
    return bytearray(mv)
