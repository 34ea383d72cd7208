"""Start an ipyparallel process (engine or controller) tied to its kernel.

ipyparallel launchers run ``python -m gpucell.cluster.boot <module> [args...]`` (our
launch
hook sets that command).  Before the real module is imported this:

* asks Linux to kill the process when the process that started it dies
  (``PR_SET_PDEATHSIG``), so no engine outlives its kernel, even a SIGKILLed one;
  processes it forks later get the same, tied to it;
  a watchdog thread backs it up where ``prctl`` is not available;
* applies the CPU affinity in ``GPUCELL_CPU_AFFINITY`` (e.g. ``0,1``);
* applies the umask in ``GPUCELL_UMASK`` (octal; the controller's ``077``: its
  files in the profile are its user's alone; engines keep the user's umask, so
  files a loop writes get the modes they get serially);
* with ``GPUCELL_PIN_BY_RANK=1`` (engines a batch system starts together, one
  ``srun`` for all), picks this engine's GPU by its rank on its node
  (``SLURM_LOCALID``; ``GPUCELL_LOCAL_RANK`` of ``GPUCELL_LOCAL_SIZE`` from
  gpucell's PBS/LSF/SGE scripts, which also take that share of the node's
  cores) among the node's ``CUDA_VISIBLE_DEVICES`` (a MIG slice,
  ``MIG-...``, alone: CUDA gives a process one), and sizes its thread pools to
  the cores it was given.

Thread-pool sizes and ``CUDA_VISIBLE_DEVICES`` arrive as plain environment variables
from the launcher, so they are in place before CUDA or any BLAS can initialise.
Standard library only: this runs before anything else on the engine.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
import time


def _death_signal() -> int:
    """SIGKILL for engines (works even inside C code); the controller may ask for
    SIGTERM so it can remove its connection files."""
    name = os.environ.get("GPUCELL_DEATH_SIGNAL", "SIGKILL")
    return int(getattr(signal, name, signal.SIGKILL))


def _set_parent_death_signal(parent: int) -> bool:
    """Ask the kernel to signal us when our parent exits (Linux only)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        PR_SET_PDEATHSIG = 1
        if libc.prctl(PR_SET_PDEATHSIG, _death_signal(), 0, 0, 0) != 0:
            return False
    except Exception:
        return False
    # The parent may have died between fork and prctl.
    if os.getppid() != parent:
        os._exit(1)
    return True


def _watch_parent(parent: int, period: float = 1.0) -> None:
    """Fallback: exit once the parent process is gone (we are re-parented)."""

    def watch() -> None:
        while True:
            time.sleep(period)
            if os.getppid() != parent:
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="gpucell-parent-watch", daemon=True).start()


def _apply_affinity(spec: str) -> None:
    cores = {int(c) for c in spec.split(",") if c.strip()}
    if cores and hasattr(os, "sched_setaffinity"):
        try:
            os.sched_setaffinity(0, cores)
        except OSError:
            pass  # cores outside our cgroup: keep the inherited set


def _share_cores(rank: int, size: int) -> None:
    """The ``rank``-th of ``size`` shares of the cores the job gave this node
    (no srun binds a task to its own there)."""
    if size < 2 or not hasattr(os, "sched_getaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    share = cores[rank * len(cores) // size : (rank + 1) * len(cores) // size]
    _apply_affinity(",".join(map(str, share or cores)))


def _pin_by_local_rank(env: os._Environ[str]) -> None:
    """One engine per GPU of its node: its GPU first in ``CUDA_VISIBLE_DEVICES``
    (the others after it, as for local engines), named for the status table."""
    # PBS, LSF and SGE have no srun: gpucell's script gives the rank itself
    rank = env.get("GPUCELL_LOCAL_RANK", env.get("SLURM_LOCALID"))
    if env.get("GPUCELL_PIN_BY_RANK") != "1" or rank is None:
        return
    r = int(rank)
    _share_cores(r, int(env.get("GPUCELL_LOCAL_SIZE") or 0))
    host = os.uname().nodename.split(".")[0]
    gpus = [g.strip() for g in env.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    gpus = [g for g in gpus if g]
    if gpus:
        own = gpus[r % len(gpus)]
        if own.startswith("MIG-"):  # a MIG slice: CUDA gives a process one, alone
            env["CUDA_VISIBLE_DEVICES"] = own
            env["GPUCELL_ENGINE_LABEL"] = f"{host}/mig{r % len(gpus)}"
        else:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(
                [own] + [g for g in gpus if g != own]
            )
            env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
            env["GPUCELL_ENGINE_LABEL"] = f"{host}/gpu{own}"
        env["GPUCELL_DEVICE_KIND"] = "gpu"
        # a UUID (GPU-..., MIG-...) is no index: its place in the node's list
        env["GPUCELL_DEVICE_INDEX"] = own if own.isdigit() else str(r % len(gpus))
    else:
        env["GPUCELL_DEVICE_KIND"] = "cpu"
        env["GPUCELL_ENGINE_LABEL"] = f"{host}/cpu{r}"
    try:
        threads = len(os.sched_getaffinity(0))  # the batch system's binding
    except (AttributeError, OSError):
        threads = 1
    for var in filter(None, env.get("GPUCELL_THREAD_VARS", "").split(",")):
        env[var] = str(max(1, threads))


def main(argv: list[str]) -> None:
    if not argv:
        raise SystemExit("usage: python -m gpucell.cluster.boot <module> [args...]")
    parent = int(os.environ.get("GPUCELL_PARENT_PID", os.getppid()))
    if parent == os.getppid() and not _set_parent_death_signal(parent):
        _watch_parent(parent)
    # prctl's setting is not inherited across fork: processes the controller or an
    # engine forks (schedulers, helpers) get it anew, tied to their own parent.
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(
            after_in_child=lambda: _set_parent_death_signal(os.getppid())
        )
    _pin_by_local_rank(os.environ)
    mask = os.environ.pop("GPUCELL_UMASK", "")
    if mask:
        try:
            os.umask(int(mask, 8))
        except ValueError:
            pass
    aff = os.environ.get("GPUCELL_CPU_AFFINITY", "")
    if aff:
        _apply_affinity(aff)
    for name in filter(None, os.environ.get("GPUCELL_PREIMPORT", "").split(",")):
        try:
            __import__(name)
        except ImportError:
            pass
    module, rest = argv[0], argv[1:]
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
