"""Result transfer benchmark: 32 x 4 MiB float32 from one engine back to the kernel.

Every variant returns the same 128 MiB from engine 0 of a real 2-engine cluster
(``gpucell.start_cluster(2, gpus="none")``) and is timed from the ``apply`` call to
the decoded object in the kernel (engine-side encoding included). The data is made
on the engine once, before timing.

Variants
  ipp_list          ipyparallel returns a top-level list of numpy arrays: its
                    zero-copy path (the arrays come back read-only)
  ipp_nested        ipyparallel returns the arrays nested in a dict in an object
                    (SimpleNamespace, a stand-in for ChunkResult): pickled, copied
  ipp_nested_torch  the same with torch tensors
  wire_numpy        protocol.wire.dumps of the nested object; loads(writable=True)
  wire_numpy_ro     the same, loads(writable=False): no copy out of the zmq frames
  wire_torch        gpucell.protocol.wire with torch tensors; loads(writable=True)
  wire_torch_ro     the same, loads(writable=False)
  memcpy_fresh      local np.copyto of 128 MiB into a fresh buffer (page faults
                    included, as for any received message): the ceiling
  memcpy_warm       local np.copyto into an already-touched buffer

Variants run interleaved, ``--runs`` rounds; the table shows median and best.

Usage:  python bench/bench_wire.py [--runs 15] [--count 32] [--mib 4]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

RESULTS = Path(__file__).resolve().parent / "results" / "wire.json"


# ---- run on the engine (interactive functions: their globals are the engine's) ------


def make_data(count: int, nbytes: int) -> int:
    global _ARRS, _TENS
    import numpy
    import torch

    n = nbytes // 4
    _ARRS = [numpy.full(n, i, dtype=numpy.float32) for i in range(count)]
    _TENS = [torch.from_numpy(a.copy()) for a in _ARRS]
    return sum(a.nbytes for a in _ARRS)


def ret_list() -> Any:
    return _ARRS  # noqa: F821 (engine global)


def ret_nested() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(values={"a": _ARRS}, n=len(_ARRS))  # noqa: F821


def ret_nested_torch() -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(values={"a": _TENS}, n=len(_TENS))  # noqa: F821


def ret_wire() -> Any:
    from types import SimpleNamespace

    from gpucell.protocol import wire

    return wire.dumps(SimpleNamespace(values={"a": _ARRS}, n=len(_ARRS)))  # noqa: F821


def ret_wire_torch() -> Any:
    from types import SimpleNamespace

    from gpucell.protocol import wire

    return wire.dumps(SimpleNamespace(values={"a": _TENS}, n=len(_TENS)))  # noqa: F821


# ---- kernel side ---------------------------------------------------------------------


def _check(obj: Any, count: int, n: int) -> None:
    arrs = obj if isinstance(obj, list) else obj.values["a"]
    assert len(arrs) == count
    assert float(arrs[-1][0]) == count - 1 and len(arrs[-1]) == n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=15)
    ap.add_argument("--count", type=int, default=32)
    ap.add_argument("--mib", type=int, default=4)
    args = ap.parse_args()

    import gpucell
    from gpucell.protocol import wire

    count, nbytes = args.count, args.mib << 20
    total = count * nbytes
    n = nbytes // 4
    c = gpucell.start_cluster(2, gpus="none")
    try:
        view = c.client[c.client.ids[0]]
        assert view.apply_sync(make_data, count, nbytes) == total

        def via(f: Callable[[], Any], decode: Callable[[Any], Any]) -> Callable:
            def run() -> None:
                _check(decode(view.apply_sync(f)), count, n)

            return run

        def ident(x: Any) -> Any:
            return x

        variants: dict[str, Callable[[], None]] = {
            "ipp_list": via(ret_list, ident),
            "ipp_nested": via(ret_nested, ident),
            "ipp_nested_torch": via(ret_nested_torch, ident),
            "wire_numpy": via(ret_wire, wire.loads),
            "wire_numpy_ro": via(ret_wire, lambda f: wire.loads(f, writable=False)),
            "wire_torch": via(ret_wire_torch, wire.loads),
            "wire_torch_ro": via(
                ret_wire_torch, lambda f: wire.loads(f, writable=False)
            ),
        }
        src = np.ones(total // 4, dtype=np.float32)
        warm = np.zeros_like(src)

        def memcpy_fresh() -> None:
            np.copyto(np.empty_like(src), src)

        def memcpy_warm() -> None:
            np.copyto(warm, src)

        variants["memcpy_fresh"] = memcpy_fresh
        variants["memcpy_warm"] = memcpy_warm

        for fn in variants.values():
            fn()  # warm-up: imports, first use of pools and sockets
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(args.runs):  # interleaved, so drift hits every variant alike
            for name, fn in variants.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        rows = {}
        for name, ts in times.items():
            med = statistics.median(ts)
            rows[name] = {
                "median_s": med,
                "best_s": min(ts),
                "median_MiB_s": total / MiB / med,
                "best_MiB_s": total / MiB / min(ts),
            }
    finally:
        gpucell.stop()

    base = rows["ipp_nested"]["median_s"]
    print(f"{count} x {args.mib} MiB float32 = {total / MiB:.0f} MiB, engine -> kernel")
    print(
        f"{'variant':18s} {'median MiB/s':>13s} {'best MiB/s':>11s} {'vs nested':>10s}"
    )
    for name, r in rows.items():
        print(
            f"{name:18s} {r['median_MiB_s']:13.0f} {r['best_MiB_s']:11.0f} "
            f"{base / r['median_s']:9.1f}x"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "bench": "wire",
                "count": count,
                "bytes_each": nbytes,
                "runs": args.runs,
                "machine": {
                    "cpus": os.cpu_count(),
                    "python": platform.python_version(),
                    "platform": platform.platform(),
                },
                "results": rows,
            },
            indent=2,
        )
    )
    print(f"wrote {RESULTS}")


MiB = 1 << 20

if __name__ == "__main__":
    main()
