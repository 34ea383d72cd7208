"""One comparison of two namespaces, for the tests that run a cell serially
and through %%gpu_parallel and compare every name (tests/test_canonical.py,
tests/test_sweep_loops.py): strict on types (a defaultdict is not a dict, a
numpy float is not a float), by state for objects with no equality of their
own (torch modules and optimizers, scikit-learn estimators, PIL images)."""

from __future__ import annotations

import copy
import dataclasses
import functools
import io
import logging
import pickle
import types
from typing import Any

import numpy as np
import torch

_IPYTHON_OWN = ("In", "Out", "exit", "quit", "get_ipython")


@dataclasses.dataclass
class _Snap:
    kind: str
    data: Any


def _default_eq(v: Any) -> bool:
    return type(v).__eq__ is object.__eq__


def snap(v: Any) -> Any:
    if isinstance(v, types.ModuleType):
        return _Snap("python module", v.__name__)
    if isinstance(v, type):
        return _Snap("class", (v.__module__, v.__qualname__))
    if isinstance(v, logging.Logger):
        return _Snap("logger", (v.name, v.level))
    if isinstance(v, torch.nn.Module):
        return _Snap(
            "torch module",
            (
                type(v).__qualname__,
                v.training,
                {k: t.detach().clone() for k, t in v.state_dict().items()},
                {n: p.requires_grad for n, p in v.named_parameters()},
                {  # plain attributes a notebook sets on a module
                    k: snap(x)
                    for k, x in vars(v).items()
                    if not k.startswith("_") and k != "training"
                },
            ),
        )
    if isinstance(v, torch.Tensor):

        def _grad(t: Any) -> Any:
            # a non-leaf's .grad is None unless retained (reading it only warns)
            if not (t.is_leaf or t.retains_grad) or t.grad is None:
                return None
            return t.grad.detach().clone()

        return _Snap(
            "tensor",
            (
                v.detach().clone(),
                v.requires_grad,
                _grad(v),
            ),
        )
    if isinstance(v, torch.optim.Optimizer):
        return _Snap("optimizer", (type(v).__qualname__, copy.deepcopy(v.state_dict())))
    if isinstance(v, io.IOBase):
        return _Snap(
            "file",
            (
                type(v).__name__,
                getattr(v, "name", None),
                getattr(v, "mode", None),
                v.closed,
            ),
        )
    if (
        isinstance(
            v,
            (
                types.FunctionType,
                types.BuiltinFunctionType,
                types.MethodType,
                functools.partial,
            ),
        )
        or type(v).__name__ == "_lru_cache_wrapper"
    ):
        return _Snap("function", getattr(v, "__qualname__", type(v).__qualname__))
    if isinstance(v, types.GeneratorType):
        return _Snap("generator", v.__qualname__)
    if type(v) in (list, tuple):
        return type(v)(snap(x) for x in v)
    if type(v) is dict:
        return {k: snap(x) for k, x in v.items()}
    if type(v).__name__ == "ImageDraw" and hasattr(v, "_image"):
        return _Snap("image draw", snap(v._image))
    slots = [n for c in type(v).__mro__ for n in getattr(c, "__slots__", ())]
    if (
        slots
        and not hasattr(v, "__dict__")
        and type(v).__module__
        in (
            "__main__",
            "builtins",
        )
    ):
        return _Snap(
            "slots " + type(v).__qualname__,
            {n: snap(getattr(v, n, None)) for n in slots},
        )
    if _default_eq(v) and not hasattr(v, "__dict__"):
        # C objects with a state dict (sklearn's Tree): by that state
        try:
            state = v.__getstate__()
        except Exception:
            state = None
        if type(state) is dict and state:
            return _Snap("state " + _qualname(v), snap(state))
        # iterators, counters, C objects: by their pickled state
        try:
            return _Snap("pickled " + _qualname(v), pickle.dumps(v, protocol=4))
        except Exception:
            return _Snap("opaque " + _qualname(v), None)
    try:
        return copy.deepcopy(v)
    except Exception:
        return v


def _qualname(x: Any) -> str:
    return type(x).__module__ + "." + type(x).__qualname__


def same(a: Any, b: Any) -> bool:
    if isinstance(a, _Snap):
        return isinstance(b, _Snap) and a.kind == b.kind and same(a.data, b.data)
    if _qualname(a) != _qualname(b):
        return False
    if isinstance(a, torch.Tensor):
        return (
            a.dtype == b.dtype
            and a.shape == b.shape
            and torch.allclose(a, b, equal_nan=True)
        )
    if isinstance(a, np.ndarray):
        if not (a.dtype == b.dtype and a.shape == b.shape):
            return False
        if a.dtype == object:
            return same(a.tolist(), b.tolist())
        if a.dtype.kind in "fc":
            return np.allclose(a, b, equal_nan=True, rtol=1e-9, atol=1e-12)
        return bool(np.array_equal(a, b))
    if isinstance(a, np.generic):
        return same(a.item(), b.item())
    if isinstance(a, float):
        if a != a:
            return b != b
        return a == b or abs(a - b) <= 1e-9 * max(1.0, abs(a))
    if type(a).__module__.startswith("pandas") and hasattr(a, "equals"):
        return a.equals(b)
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover
        Image = None
    if Image is not None and isinstance(a, Image.Image):
        return (a.mode, a.size) == (b.mode, b.size) and a.tobytes() == b.tobytes()
    if isinstance(a, np.random.Generator):
        return same(a.bit_generator.state, b.bit_generator.state)
    if isinstance(a, np.random.RandomState):  # (an estimator's random_state)
        return same(list(a.get_state()), list(b.get_state()))
    if isinstance(a, torch.utils.data.DataLoader):
        return a.batch_size == b.batch_size and same(a.dataset, b.dataset)
    if isinstance(a, torch.utils.data.TensorDataset):
        return same(list(a.tensors), list(b.tensors))
    if _is_estimator(a):
        return same(a.get_params(deep=False), b.get_params(deep=False)) and same(
            _fitted(a), _fitted(b)
        )
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (set, frozenset, str, bytes, int, bool, type(None), complex)):
        return a == b
    if hasattr(a, "__dict__") and not isinstance(a, type):
        # notebook classes differ between the two setups: same name, same fields
        return same(snap(vars(a)), snap(vars(b)))
    return a == b


def _is_estimator(x: Any) -> bool:
    try:
        from sklearn.base import BaseEstimator
    except ImportError:  # pragma: no cover
        return False
    return isinstance(x, BaseEstimator)


def _fitted(est: Any) -> dict:
    return {
        k: snap(v)
        for k, v in sorted(vars(est).items())
        if k.endswith("_") and not k.startswith("_")
    }


def user_names(ip) -> list[str]:
    return [k for k in ip.user_ns if not k.startswith("_") and k not in _IPYTHON_OWN]


def snapshot(ip) -> dict[str, Any]:
    return {k: snap(ip.user_ns[k]) for k in user_names(ip)}


def clear(ip) -> None:
    for k in user_names(ip):
        ip.user_ns.pop(k)
    for k in [k for k in ip.user_ns if k.startswith("_sweep")]:
        ip.user_ns.pop(k)


def differences(want: dict, got: dict) -> list[str]:
    """Names whose values differ (or that only one side has)."""
    out = [f"{k} (only serially)" for k in sorted(set(want) - set(got))]
    out += [f"{k} (only in the parallel run)" for k in sorted(set(got) - set(want))]
    out += [k for k in want if k in got and not same(want[k], got[k])]
    return out


class restored_logging:
    """Put the root logger's handlers and level back; close what was added."""

    def __enter__(self):
        root = logging.getLogger()
        self.saved, self.level = root.handlers[:], root.level
        return self

    def __exit__(self, *exc):
        root = logging.getLogger()
        for h in root.handlers[:]:
            if h not in self.saved:
                h.flush()
                h.close()
        root.handlers[:] = self.saved
        root.setLevel(self.level)
        return False
