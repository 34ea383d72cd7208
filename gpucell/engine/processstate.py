"""Process-wide settings a chunk's iterations may change behind a call: a
notebook function that sets ``os.environ[k]``, calls ``np.seterr`` or
``os.chdir``, adds to ``sys.path`` or sets torch's default dtype.  Serially the
notebook's process keeps such a change; on an engine it stays in the engine,
so the cell would silently differ.  Compared before and after the
iterations (the kernel's own values sent with the cell: a change that only
makes the engine's setting what the kernel's already is changes nothing;
variables libraries set for themselves, as torch's inductor its cache folder,
are theirs); a change fails the chunk, nothing merged."""

from __future__ import annotations

import os
import sys
from typing import Any

__all__ = ["changes", "put_back", "snapshot"]


#: variables libraries set for themselves as they are first used (torch's
#: inductor its cache folder, scikit-learn's import the OpenMP ones): what
#: they set is the library's business in each process, not the notebook's
_LIBRARIES = (
    "TORCHINDUCTOR_", "TORCH_", "PYTORCH_", "TRITON_", "CUDA_", "NCCL_",
    "KMP_", "OMP_", "MKL_", "OPENBLAS_", "NUMEXPR_", "TF_", "XLA_", "JAX_",
    "TOKENIZERS_", "HF_", "TRANSFORMERS_", "MPLBACKEND", "MPLCONFIGDIR",
)  # fmt: skip


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:
        return None


def snapshot() -> dict[str, Any]:
    """The settings as they are now."""
    out: dict[str, Any] = {
        "environ": dict(os.environ),
        "cwd": _cwd(),
        "sys_path": list(sys.path),
    }
    np = sys.modules.get("numpy")
    if np is not None:
        out["numpy_err"] = np.geterr()
    torch = sys.modules.get("torch")
    if torch is not None:
        out["torch_dtype"] = torch.get_default_dtype()
    return out


def changes(before: dict[str, Any], kernel: dict[str, Any]) -> list[tuple[str, str]]:
    """``(setting, what changed)`` for each setting the iterations changed
    that the kernel's process does not already have."""
    now = snapshot()
    out: list[tuple[str, str]] = []
    env_before, env_now = before["environ"], now["environ"]
    kernel_env = kernel.get("environ")
    keys = sorted(
        k
        for k in set(env_before) | set(env_now)
        if env_before.get(k) != env_now.get(k)
        and (kernel_env is None or kernel_env.get(k) != env_now.get(k))
        and not k.startswith(_LIBRARIES)
    )
    if keys:
        out.append(("os.environ", f"the loop set or removed {_listed(keys)}"))
    if now["cwd"] != before["cwd"]:
        out.append(("os.getcwd()", f"the loop changed the directory to {now['cwd']!r}"))
    added = [p for p in now["sys_path"] if p not in before["sys_path"]]
    added = [p for p in added if p not in kernel.get("sys_path", ())]
    if added:
        out.append(("sys.path", f"the loop added {_listed(added)}"))
    for key, name in (
        ("numpy_err", "numpy's error modes (np.seterr)"),
        ("torch_dtype", "torch's default dtype"),
    ):
        if key in before and now.get(key) != before[key]:
            out.append((name, f"the loop set {now.get(key)!r}"))
    if out:
        out = [(n, w + _WHY) for n, w in out]
    return out


def put_back(before: dict[str, Any]) -> None:
    """The engine's environment and import path as they were before the
    iterations (its directory, numpy's and torch's settings are put back by
    the envelope): a later cell finds them as the engine had them."""
    if os.environ != before["environ"]:
        os.environ.clear()
        os.environ.update(before["environ"])
    if sys.path != before["sys_path"]:
        sys.path[:] = before["sys_path"]


_WHY = (
    " (a setting of the whole process: serially it stays changed in the "
    "notebook's process, here only in the engine's)"
)


def _listed(items: list[str]) -> str:
    shown = ", ".join(f"`{k}`" for k in items[:3])
    return shown + (f" and {len(items) - 3} more" if len(items) > 3 else "")
