"""Inputs are read-only to iterations: check them in before a chunk, out after it.

Static analysis cannot see what a call does (``est.fit(X, y)``, ``loss.backward()``
filling an input model's ``.grad``, a notebook function appending to a global).
Serially such a change would stay in the user's objects and later iterations would
see it; on an engine it changes only the engine's copy, so the merged namespace
would be silently different.  So before each chunk the engine takes a cheap
*token* of every input the analysis marked (receivers, arguments and callees of
calls, and the chunk's items when they are), and compares after it:

* numpy arrays are made read-only, so an in-place write fails at its own line,
  and (up to a budget) checksummed, for the writers that ignore the flag;
* torch tensors by their version counter (every in-place op bumps it) and their
  hooks (``p.register_hook`` bumps no counter), a module by its parameters' and
  buffers' (and their ``.grad``'s), its training flags and every submodule's
  hooks (``register_forward_hook``...: private dicts no other part shows);
* a ``logging.Logger`` by its configuration (level, handlers, filters,
  ``disabled``, ``propagate``): it pickles by name, so the engine's copy is the
  engine's own logger, and its pickled state would never change;
* builtin containers item by item; a notebook function by the globals it uses
  (cloudpickle ships them with it) and its closure;
* anything else by a hash of its pickled state.

Standard library only (numpy and torch are recognised, never imported).
"""

from __future__ import annotations

import hashlib
import io
import logging
import pickle
import types
import zlib
from collections.abc import Callable, Hashable, Iterable, Mapping
from typing import Any

from gpucell.protocol.fold import is_numpy, is_torch
from gpucell.protocol.globalrng import global_generator

__all__ = [
    "Changed",
    "changes",
    "class_state",
    "code_names",
    "freeze",
    "snapshot",
    "token",
]

#: items of containers (all levels together) tokenised before giving up
MAX_ITEMS = 100_000
#: bytes of out-of-band buffers hashed in a pickled object's state
MAX_BUFFER_BYTES = 64 << 20
#: bytes of arrays checksummed per token set (~0.3 ms per MiB); arrays beyond
#: it are checked by their read-only flag alone
MAX_CONTENT_BYTES = 8 << 20

_IMMUTABLE = (type(None), bool, int, float, complex, str, bytes, range, type(Ellipsis))
_UNCHECKED = ("unchecked",)


class Changed(Exception):
    """An input changed during a chunk (raised on the engine, sent as data)."""

    def __init__(self, changes: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(f"{n}: {w}" for n, w in changes))
        self.changes = changes


class _Budget:
    def __init__(self, after: bool = False) -> None:
        self.items = MAX_ITEMS
        self.content_bytes = MAX_CONTENT_BYTES
        #: the token after the chunk: an array's writeable flag is read before
        #: it is made read-only again (before the chunk, after: it is ours)
        self.after = after


def _contents(a: Any, budget: _Budget) -> Hashable:
    """A checksum of a (read-only) array's bytes, within the budget: a few
    writers ignore the read-only flag (a ufunc's ``.at``, ``torch.from_numpy``
    and ctypes views), and only the bytes show what they did."""
    n = int(a.nbytes)
    if n > budget.content_bytes:
        return None  # too big: read-only is the check
    budget.content_bytes -= n
    try:
        view = memoryview(a).cast("B")
    except (TypeError, ValueError):  # not contiguous: a copy (within budget)
        view = memoryview(a.tobytes())
    return zlib.crc32(view)


def _is_numpy_scalar(obj: Any) -> bool:
    return is_numpy(obj) and not any(c.__name__ == "ndarray" for c in type(obj).__mro__)


def _is_tensor(obj: Any) -> bool:
    return is_torch(obj) and hasattr(obj, "_version")


def _is_module(obj: Any) -> bool:
    """A torch module instance; a class (``class Net(nn.Module)`` the loop
    calls) has these names too, as unbound methods."""
    return (
        not isinstance(obj, type)
        and hasattr(obj, "named_parameters")
        and hasattr(obj, "named_buffers")
    )


def _tensor(t: Any) -> Hashable:
    """Where its data is and its version counter (bumped by every in-place op,
    shared by views): a view made anew by iterating has the same token; and
    its hooks, by their handles' ids (``p.register_hook(fn)`` bumps nothing)."""
    grad = getattr(t, "grad", None) if getattr(t, "is_leaf", False) else None
    g = None if grad is None else (grad.data_ptr(), grad._version)
    try:
        where = (t.data_ptr(), tuple(t.shape))
    except Exception:  # sparse and other layouts without one data pointer
        where = (id(t),)
    # requires_grad too: `bb.requires_grad_(False)` bumps no version counter
    flag = bool(getattr(t, "requires_grad", False))
    hooks = _tensor_hooks(t)
    return ("tensor", where, t._version, g, str(t.device), str(t.dtype), flag, hooks)


def _tensor_hooks(t: Any) -> Hashable:
    """A tensor's gradient hooks and post-accumulate hooks (handle ids)."""
    pre = getattr(t, "_backward_hooks", None)
    post = getattr(t, "_post_accumulate_grad_hooks", None)
    if not pre and not post:
        return None
    return (tuple(pre or ()), tuple(post or ()))


#: a module's hook dicts (``register_forward_hook`` and the like), each keyed
#: by its handles' ids, taken by submodule position (torch 2's names;
#: ``_forward_hooks_with_kwargs`` and ``_forward_hooks_always_called`` share
#: ``_forward_hooks``'s keys)
_MODULE_HOOKS = (
    "_forward_hooks",
    "_forward_pre_hooks",
    "_backward_hooks",
    "_backward_pre_hooks",
    "_state_dict_hooks",
    "_state_dict_pre_hooks",
    "_load_state_dict_pre_hooks",
    "_load_state_dict_post_hooks",
)


def _same(was: Hashable, now: Hashable) -> bool:
    """Tokens equal, but for tensors moved to another device (``model.cuda()``
    on a GPU engine): the engine's own placement of its copy, not a change of
    what the kernel holds (a move makes a new tensor: its pointer and version
    counter start anew, so only shape and dtype can be compared)."""
    if was == now:
        return True
    if not (isinstance(was, tuple) and isinstance(now, tuple)):
        return False
    if len(was) != len(now):
        return False
    if was and was[0] == "tensor" and now[0] == "tensor" and len(was) == 8:
        moved = was[4] != now[4]
        return moved and was[1][1:] == now[1][1:] and was[5:] == now[5:]
    return all(_same(a, b) for a, b in zip(was, now, strict=True))


def _torch_module(m: Any, budget: _Budget) -> Hashable:
    params = tuple((n, _tensor(p)) for n, p in m.named_parameters())
    buffers = tuple((n, _tensor(b)) for n, b in m.named_buffers())
    training, hooks = [], []
    for i, s in enumerate(m.modules()):  # (one walk: this runs every chunk)
        training.append(bool(getattr(s, "training", False)))
        d = getattr(s, "__dict__", None) or {}
        if any(map(d.get, _MODULE_HOOKS)):  # (most have none: ~0.3 us to see it)
            hooks.append(
                (i, tuple((n, tuple(d[n])) for n in _MODULE_HOOKS if d.get(n)))
            )
    budget.items -= len(params) + len(buffers)
    attrs = module_attributes(m)
    return ("module", id(m), params, buffers, tuple(training), attrs, tuple(hooks))


def _logger(lg: Any) -> Hashable:
    """A logger's configuration: what ``setLevel``, ``addHandler``,
    ``addFilter``, ``disabled`` and ``propagate`` change."""
    return (
        "logger",
        lg.name,
        lg.level,
        bool(lg.disabled),
        bool(lg.propagate),
        tuple(map(id, lg.handlers)),
        tuple(map(id, lg.filters)),
    )


#: what a logger's changed token means, and the rewrite
LOGGER_CHANGED = (
    "its configuration changed (`setLevel`, `addHandler`, `addFilter`, "
    "`disabled`, `propagate`): a logger travels by name, so each engine "
    "changed its own logger of that name, not yours; configure loggers "
    "before the loop"
)


def logger_why(was: Hashable, now: Hashable) -> str:
    """:data:`LOGGER_CHANGED` where two tokens are a logger's and differ."""
    if isinstance(was, tuple) and was[:1] == ("logger",) and was != now:
        return LOGGER_CHANGED
    return ""


def hooks_of(tok: Hashable) -> Hashable:
    """The hooks in a module's or tensor's token (its own and its tensors'):
    what the write-back cannot carry (a hook is code that would run in the
    notebook's object)."""
    if not isinstance(tok, tuple) or not tok:
        return None
    if tok[0] == "tensor" and len(tok) == 8:
        return tok[7]
    if tok[0] == "module" and len(tok) == 7:
        tensors = tuple((n, t[7]) for n, t in (*tok[2], *tok[3]) if t[7] is not None)
        return (tok[6], tensors)
    return None


def module_attributes(m: Any) -> Hashable:
    """A module's public attributes other than its parameters, buffers and
    submodules (``net.val_loss = ...``): part of what an iteration can change."""
    out = []
    for k, v in vars(m).items():
        if k.startswith("_") or k == "training":
            continue
        if isinstance(v, _IMMUTABLE):
            out.append((k, ("=", type(v).__name__, v)))
        else:
            tok = _tensor(v) if _is_tensor(v) else _pickled(v)
            if _unchecked(tok):  # (too big: by identity, never the whole
                tok = ("by identity",)  # module's token unchecked for it)
            out.append((k, (id(v), tok)))
    return tuple(sorted(out, key=lambda kv: kv[0]))


def code_names(code: types.CodeType) -> set[str]:
    """Global names a code object (and the code nested in it) reads."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= code_names(const)
    return names


def _function(fn: types.FunctionType, budget: _Budget, seen: set[int]) -> Hashable:
    """A notebook function: the globals it uses and its closure (what it could
    change); functions of installed modules are their module's business."""
    if getattr(fn, "__module__", None) != "__main__" or id(fn) in seen:
        return ("function", id(fn))
    seen.add(id(fn))
    g = fn.__globals__
    used = sorted(n for n in code_names(fn.__code__) if n in g)
    parts = [(n, _token(g[n], budget, seen)) for n in used]
    for i, cell in enumerate(fn.__closure__ or ()):
        try:
            parts.append((f"<closure {i}>", _token(cell.cell_contents, budget, seen)))
        except ValueError:  # an empty cell
            pass
    # a mutable default (`def add(x, acc=[])`, a memo dict) keeps state
    # across calls: serially later iterations see what earlier ones left
    for i, d in enumerate(fn.__defaults__ or ()):
        parts.append((f"<default {i}>", _token(d, budget, seen)))
    for k, d in sorted((fn.__kwdefaults__ or {}).items()):
        parts.append((f"<default {k}>", _token(d, budget, seen)))
    # attributes set on the function (`step.calls += 1`): state it keeps
    for k, v in sorted(vars(fn).items()):
        if k != "__wrapped__":
            parts.append((f"<attribute {k}>", _token(v, budget, seen)))
    return ("function", id(fn), tuple(parts))


def _class(cls: type, budget: _Budget, seen: set[int]) -> Hashable:
    """A notebook class: its own attributes other than methods (``count = 0``
    that ``__init__`` bumps: serially each instance sees the ones before it),
    and its methods as notebook functions."""
    if id(cls) in seen:
        return ("class", id(cls))
    seen.add(id(cls))
    parts = []
    for k, v in sorted(vars(cls).items(), key=lambda kv: kv[0]):
        if k in ("__dict__", "__weakref__", "__doc__", "__module__", "__qualname__"):
            continue
        if isinstance(v, (staticmethod, classmethod)):
            v = v.__func__
        if isinstance(v, property):
            continue
        parts.append((k, _token(v, budget, seen)))
    return ("class", id(cls), tuple(parts))


def _pickled(obj: Any) -> Hashable:
    """A hash of the object's pickled state, its big buffers included up to a
    budget (an object holding arrays that change in place changes its token)."""
    buffers: list[Any] = []
    try:
        data = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    except Exception:
        try:
            import cloudpickle

            f = io.BytesIO()
            cloudpickle.CloudPickler(
                f, protocol=5, buffer_callback=buffers.append
            ).dump(obj)
            data = f.getvalue()
        except Exception:
            return _UNCHECKED
    h = hashlib.blake2b(data, digest_size=16)
    left = MAX_BUFFER_BYTES
    for b in buffers:
        view = b.raw()
        if view.nbytes > left:
            return _UNCHECKED
        left -= view.nbytes
        h.update(view)
    return ("pickled", h.hexdigest())


def _token(obj: Any, budget: _Budget, seen: set[int]) -> Hashable:
    budget.items -= 1
    if budget.items < 0:
        return _UNCHECKED
    if isinstance(obj, _IMMUTABLE):
        return ("=", type(obj).__name__, hash(obj))
    if isinstance(obj, type):
        # a class is an input like a function (checked as one), never taken
        # for an instance of itself: `Net.named_parameters` is a plain function
        if getattr(obj, "__module__", None) == "__main__":
            return _class(obj, budget, seen)
        return ("=", id(obj))
    if _is_numpy_scalar(obj):
        # a numpy scalar is a value: its array interface points at a copy
        # made anew each time (an address that moves means nothing)
        return ("=", type(obj).__name__, bytes(obj.tobytes()))
    if is_numpy(obj):
        left = bool(obj.flags.writeable)  # (after the chunk: what the loop left)
        if left:
            try:
                obj.setflags(write=False)
            except ValueError:
                return _pickled(obj)
        # (made writable again, `a.flags.writeable = True`: a change, whatever
        # the loop wrote next, beyond the checksum's budget included)
        flag = left if budget.after else bool(obj.flags.writeable)
        where = (obj.__array_interface__["data"][0], obj.shape, obj.dtype.str)
        if obj.dtype.hasobject:  # its items are objects that may change
            return ("ndarray", where, _pickled(obj), flag)
        return ("ndarray", where, _contents(obj, budget), flag)
    if _is_tensor(obj):
        return _tensor(obj)
    if _is_module(obj):
        return _torch_module(obj, budget)
    if isinstance(obj, logging.Logger):
        return _logger(obj)
    t = type(obj)
    if t in (list, tuple, set, frozenset) or isinstance(obj, (list, tuple)):
        items: Iterable[Any] = sorted(obj, key=id) if t in (set, frozenset) else obj
        return (t.__name__, tuple(_token(x, budget, seen) for x in items))
    if isinstance(obj, Mapping) and t.__module__ in ("builtins", "collections"):
        return (
            t.__name__,
            tuple(
                (_token(k, budget, seen), _token(v, budget, seen))
                for k, v in obj.items()
            ),
        )
    if isinstance(obj, types.FunctionType):
        return _function(obj, budget, seen)
    if global_generator(obj) is not None:  # process state, as a module is
        return ("=", id(obj))
    owner = _bound_to(obj)
    if owner is not None:
        # `add = seen.add`, `map(out.append, ...)`, `sink=metrics.append`: a
        # method bound to an object changes that object when called
        return ("bound", getattr(obj, "__name__", ""), _token(owner, budget, seen))
    if isinstance(obj, (types.ModuleType, types.BuiltinFunctionType)):
        return ("=", id(obj))
    return _pickled(obj)


def _bound_to(obj: Any) -> Any:
    """The object a builtin method (``seen.add``, ``out.append``,
    ``d.__setitem__``) is bound to, or None (a plain function, a module's)."""
    if not isinstance(obj, (types.BuiltinMethodType, types.MethodWrapperType)):
        return None
    owner = getattr(obj, "__self__", None)
    if owner is None or isinstance(owner, (types.ModuleType, type)):
        return None
    return owner


def freeze(chunk_obj: Any) -> None:
    """Nothing: the items' arrays (rows of an array included) stay writable.
    An iteration's own item may change (``for row in P: row /= row.sum()``):
    the items' token hashes every array item's bytes, so a change is seen
    and written back (``checkout``) or fails the chunk, never lost."""


def token(obj: Any, after: bool = False) -> Hashable:
    """What must not change while a chunk runs (arrays are made read-only);
    ``after``: the token after the chunk (:class:`_Budget`)."""
    return _token(obj, _Budget(after), set())


def snapshot(
    inputs: Mapping[str, Any], names: Iterable[str], items: Callable[[], Any] | None
) -> dict[str, Hashable]:
    """Tokens of ``names`` among ``inputs`` and (``items``) of the chunk's items."""
    out = {n: token(inputs[n]) for n in names if n in inputs}
    if items is not None:
        out[""] = _items(items)
    return out


def _items(items: Callable[[], Any], after: bool = False) -> Hashable:
    budget, seen = _Budget(after), set[int]()
    classes: dict[int, Hashable] = {}
    return (
        "items",
        tuple(_item_token(x, budget, seen, 0, classes) for x in items()),
    )


def _item_token(
    x: Any, budget: _Budget, seen: set[int], depth: int, classes: dict[int, Hashable]
) -> Hashable:
    """An item's token, its arrays (and a tuple item's) left writable and
    hashed whole: the iteration may change them, and a change must show."""
    if type(x) is tuple and depth < 2:
        return (
            "tuple",
            tuple(_item_token(p, budget, seen, depth + 1, classes) for p in x),
        )
    if is_numpy(x) and not _is_numpy_scalar(x) and not x.dtype.hasobject:
        # (its writeable flag too: `a.flags.writeable = False` changes no byte)
        flag = bool(x.flags.writeable)
        return ("ndarray", x.shape, x.dtype.str, array_digest(x), flag)
    cls = type(x)
    if getattr(cls, "__module__", None) == "__main__" and not isinstance(x, type):
        # what every instance of a notebook class shares (`self.seen.append`
        # on a class-level list): pickled by reference, an item's token
        # would not show a change there
        if id(cls) not in classes:
            classes[id(cls)] = class_state(cls)
        return ("instance", classes[id(cls)], _token(x, budget, seen))
    return _token(x, budget, seen)


def class_state(cls: type) -> Hashable:
    """A notebook class's own data attributes, through its notebook bases
    (``count = 0``, ``registry = []``), hashed by value; methods, properties
    and the class machinery left out, and nothing made read-only (an item's
    own arrays may be among them)."""
    parts = []
    for c in cls.__mro__:
        if getattr(c, "__module__", None) != "__main__":
            continue
        for k, v in sorted(vars(c).items(), key=lambda kv: kv[0]):
            if k.startswith("__") and k.endswith("__"):
                continue
            if callable(v) or isinstance(v, (staticmethod, classmethod, property)):
                continue
            if type(v).__name__ in ("member_descriptor", "getset_descriptor"):
                continue  # a slot's descriptor
            if isinstance(v, _IMMUTABLE):
                tok: Hashable = ("=", type(v).__name__, hash(v))
            else:
                tok = _pickled(v)
                if tok == _UNCHECKED:
                    continue  # (unpicklable: unknown, never taken as a change)
            parts.append((c.__qualname__, k, tok))
    return ("class state", tuple(parts))


def array_digest(a: Any) -> int:
    """A checksum of all of an array's bytes (no budget: a change must show;
    crc32, several GB/s: it runs on every item before and after a chunk)."""
    try:
        view = memoryview(a).cast("B")
    except (TypeError, ValueError):  # not contiguous: a copy
        view = memoryview(a.tobytes())
    return zlib.crc32(view)


def changes(
    before: Mapping[str, Hashable],
    inputs: Mapping[str, Any],
    items: Callable[[], Any] | None,
) -> list[tuple[str, str]]:
    """``(name, what)`` for each input whose token differs now (``""``: the
    loop's items); what is unknown (too big, unpicklable) is never reported."""
    out = []
    for name, was in before.items():
        if _unchecked(was):
            continue
        now = _items(items, True) if name == "" and items else token(inputs[name], True)
        if not _same(was, now) and not _unchecked(now):
            out.append((name, _what(was, now)))
    return out


def only_mode_changed(was: Hashable, value: Any) -> bool:
    """Has a module's train/eval mode alone changed since its token ``was``
    (``model.eval()`` the body's first use of it: the kernel sets the mode the
    body leaves)?"""
    now = token(value, True)
    return (
        isinstance(was, tuple)
        and isinstance(now, tuple)
        and was[:1] == ("module",) == now[:1]
        and was[:4] == now[:4]
        and was[5:] == now[5:]
    )


#: why a hook cannot come back from an engine, and the rewrite
HOOKS_ADVICE = (
    "a hook stays on the engine's copy (serially it would be on your object); "
    "register hooks before the loop, in a loop of its own without %%gpu_parallel"
)


def hooks_changed(was: Hashable, now: Hashable) -> str:
    """``"added"``, ``"removed"`` or ``"added and removed"``: what happened
    to the hooks in two tokens of a module or tensor (``""``: nothing)."""
    before, after = _hook_ids(hooks_of(was), was), _hook_ids(hooks_of(now), now)
    if before == after:
        return ""
    added, removed = bool(after - before), bool(before - after)
    return " and ".join(w for w, f in (("added", added), ("removed", removed)) if f)


def _hook_ids(hooks: Any, tok: Hashable) -> set[tuple[Any, ...]]:
    """Each hook in :func:`hooks_of`'s form, by where it is and its handle."""
    if hooks is None:
        return set()
    if isinstance(tok, tuple) and tok[0] == "tensor":
        return {(j, k) for j, ks in enumerate(hooks) for k in ks}
    mine, tensors = hooks
    out = {(i, n, k) for i, hs in mine for n, ks in hs for k in ks}
    out |= {(n, j, k) for n, h in tensors for j, ks in enumerate(h) for k in ks}
    return out


def _hooked(was: tuple[Any, ...], now: tuple[Any, ...]) -> str:
    """What an iteration did to a module's or tensor's hooks, and the rewrite;
    ``""`` if they are as they were."""
    how = hooks_changed(was, now)
    if not how:
        return ""
    if was[0] == "tensor":
        return f"hooks were {how} (`register_hook`...): {HOOKS_ADVICE}"
    return (
        f"hooks were {how} (on it, a submodule or a parameter: "
        f"`register_forward_hook`, `p.register_hook`...): {HOOKS_ADVICE}"
    )


def _unchecked(t: Hashable) -> bool:
    """Whether any part of a token could not be taken (then it proves nothing)."""
    if t == _UNCHECKED:
        return True
    return isinstance(t, tuple) and any(
        _unchecked(x) for x in t if isinstance(x, tuple)
    )


def _what(was: Hashable, now: Hashable) -> str:
    """A few words on how a token changed, for the error message."""
    kind = was[0] if isinstance(was, tuple) and was else ""
    if kind == "module":
        assert isinstance(was, tuple) and isinstance(now, tuple)
        hooked = _hooked(was, now)
        if hooked:
            return hooked
        if was[2] != now[2]:
            grads = [
                n
                for (n, a), (_m, b) in zip(was[2], now[2], strict=False)
                if a[3] != b[3]
            ]
            if grads and all(
                a[:3] == b[:3] for (_n, a), (_m, b) in zip(was[2], now[2], strict=False)
            ):
                return f"the .grad of its parameters ({', '.join(grads[:3])}) changed"
            return "its parameters changed"
        if was[3] != now[3]:
            return "its buffers changed (running statistics?)"
        if was[4] != now[4]:
            return "its train/eval mode changed"
        if was[5:] != now[5:]:
            return "an attribute set on it changed"
    if kind == "tensor":
        assert isinstance(was, tuple) and isinstance(now, tuple)
        hooked = _hooked(was, now)
        if hooked:
            return hooked
        if was[:6] == now[:6] and was[6:] != now[6:]:
            return "its requires_grad changed"
        if was[:3] == now[:3] and was[3] != now[3]:
            return "its .grad changed (a backward() reached it)"
        return "it was changed in place"
    if kind == "ndarray":
        assert isinstance(was, tuple) and isinstance(now, tuple)
        if was[:-1] == now[:-1]:
            return (
                "it was made writable (`a.flags.writeable = True`, "
                "`a.setflags(write=True)`)"
                if now[-1]
                else "it was made read-only (`a.flags.writeable = False`)"
            )
        return (
            "its contents changed in place (by a writer that ignores read-only: "
            "a ufunc's `.at`, `torch.from_numpy`, ctypes)"
        )
    if kind == "function":
        assert isinstance(was, tuple) and isinstance(now, tuple)
        before = dict(was[2]) if len(was) > 2 else {}
        after = dict(now[2]) if len(now) > 2 else {}
        names = [n for n in before if before[n] != after.get(n)]
        if names and all(n.startswith("<default") for n in names):
            return "a default argument it keeps state in (`acc=[]`, a memo) changed"
        if names and all(n.startswith("<attribute") for n in names):
            attrs = ", ".join(f"`{n[11:-1]}`" for n in names)
            return f"an attribute set on it ({attrs}) changed"
        if names:
            return f"{', '.join(f'`{n}`' for n in names)}, which it uses, changed"
        return "a global it uses changed"
    if kind == "class":
        assert isinstance(was, tuple) and isinstance(now, tuple)
        before = dict(was[2]) if len(was) > 2 else {}
        after = dict(now[2]) if len(now) > 2 else {}
        names = [n for n in before if before[n] != after.get(n)]
        if names:
            listed = ", ".join(f"`{n}`" for n in names)
            return f"its class attribute(s) {listed} changed"
        return "its class attributes changed"
    if kind == "pickled":
        return "its state changed"
    if kind == "logger":
        return LOGGER_CHANGED
    return "its contents changed"
