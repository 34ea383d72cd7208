"""What a chunk would cost with one ipyparallel task per engine per cell (issue 34).

A prototype of the transport only, not of gpucell's run: the same chunks (a
chunk is ``k`` iterations of a trivial body, its result a short list) go to
the same local engines three ways, and the CPU each process spends is read
from ``/proc`` (user + system, whole process trees) and divided by the chunks:

- ``gpucell``: a ``%%gpu_parallel`` cell of the same iterations, chunks of
  the same size: what a chunk costs today, gpucell's own work included.
- ``gpucell+channel``: the same cell with ``GpuCell.chunk_channel`` on (the
  design below, built into gpucell's dispatcher).
- ``apply``: one ipyparallel task per chunk, each engine keeping its next
  chunk queued behind the running one: how gpucell's dispatcher sends chunks
  today (less gpucell's own work on both sides).
- ``datapub``: one task per engine per cell; the kernel writes each chunk's
  bounds into the engine's FIFO in ``/dev/shm`` (host-local: the channel that
  carries inputs and chunk bounds beside ipyparallel), and the engine sends
  each result back as an ipyparallel ``publish_data`` message on its IOPub.
- ``fifo``: as ``datapub``, but the result comes back through a second FIFO
  (host-local engines only; engines on other hosts would keep a message).

Usage:  python bench/bench_stream_proto.py [--engines 8] [--chunks 2000]
        [--rounds 3] [--json bench/results/stream_proto.json]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_scale import pids_cpu_psutil, tree_pids  # noqa: E402

ITERATIONS = 4  # per chunk: the body is trivial, the transport is measured
_STOP = 0xFFFFFFFF


def _work(start: int, stop: int) -> list[int]:
    return [i * i for i in range(start, stop)]


def serve_datapub(fifo: str) -> int:
    """On an engine: chunk bounds from ``fifo`` until the stop mark, each
    result published as data on IOPub (one message per chunk).  (It and
    :func:`serve_fifo` read the bounds with the same lines: ipyparallel sends
    a function by its code alone, without the ``__main__`` functions it calls.)"""
    import os
    import struct

    from ipyparallel.datapub import publish_data

    fd = os.open(fifo, os.O_RDONLY)
    n = 0
    try:
        while True:
            data = b""
            while len(data) < 8:
                more = os.read(fd, 8 - len(data))
                if not more:
                    return n
                data += more
            start, stop = struct.unpack("<II", data)
            if start == 0xFFFFFFFF:
                return n
            publish_data({f"c{start}": [i * i for i in range(start, stop)]})
            n += 1
    finally:
        os.close(fd)


def serve_fifo(fifo_in: str, fifo_out: str) -> int:
    """As :func:`serve_datapub`, the result written back to ``fifo_out``
    (length-prefixed pickle)."""
    import os
    import pickle
    import struct

    fd = os.open(fifo_in, os.O_RDONLY)
    out = os.open(fifo_out, os.O_WRONLY)
    n = 0
    try:
        while True:
            data = b""
            while len(data) < 8:
                more = os.read(fd, 8 - len(data))
                if not more:
                    return n
                data += more
            start, stop = struct.unpack("<II", data)
            if start == 0xFFFFFFFF:
                return n
            body = pickle.dumps((start, [i * i for i in range(start, stop)]))
            os.write(out, struct.pack("<I", len(body)) + body)
            n += 1
    finally:
        os.close(fd)
        os.close(out)


class _Cpu:
    """CPU seconds of the kernel (this process), controller and engines."""

    def __init__(self, gc: Any) -> None:
        self.eng = [i.pid for i in gc.engines.values() if i.pid]
        self.ctl = [p for p in tree_pids(gc.controller_pid) if p not in self.eng]

    def read(self) -> dict[str, float]:
        t = os.times()
        return {
            "kernel": t.user + t.system,
            "controller": pids_cpu_psutil(self.ctl),
            "engines": pids_cpu_psutil(self.eng),
        }


def _chunks(n: int) -> list[tuple[int, int]]:
    return [(k * ITERATIONS, (k + 1) * ITERATIONS) for k in range(n)]


def run_apply(client: Any, ids: list[int], chunks: list[tuple[int, int]]) -> int:
    """One task per chunk, two in flight per engine (the next one queued)."""
    views = {e: client.direct_view(e) for e in ids}
    todo = list(chunks)
    flying: dict[Any, int] = {}
    for e in ids:
        for _ in range(2):
            if todo:
                flying[views[e].apply_async(_work, *todo.pop())] = e
    done = 0
    while flying:
        for ar in [a for a in flying if a.ready()]:
            e = flying.pop(ar)
            ar.get()
            done += 1
            if todo:
                flying[views[e].apply_async(_work, *todo.pop())] = e
        if flying and not any(a.ready() for a in flying):
            client.wait(list(flying), timeout=0.05)
    return done


def _fifos(tmp: str, ids: list[int], kind: str) -> dict[int, str]:
    out = {}
    for e in ids:
        path = os.path.join(tmp, f"{kind}{e}")
        os.mkfifo(path, 0o600)
        out[e] = path
    return out


def _feed(fds: dict[int, int], ids: list[int], todo: list[tuple[int, int]]) -> None:
    """Two chunks queued per engine; the next one as each result comes."""
    for e in ids:
        for _ in range(2):
            if todo:
                os.write(fds[e], struct.pack("<II", *todo.pop()))


def run_datapub(client: Any, ids: list[int], chunks: list[tuple[int, int]]) -> int:
    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        fifos = _fifos(tmp, ids, "in")
        ars = {
            e: client.direct_view(e).apply_async(serve_datapub, fifos[e]) for e in ids
        }
        fds = {e: os.open(fifos[e], os.O_WRONLY) for e in ids}
        todo = list(chunks)
        _feed(fds, ids, todo)
        seen = dict.fromkeys(ids, 0)
        done = 0
        while done < len(chunks):
            progressed = False
            for e in ids:
                got = len(ars[e].data or {})
                while seen[e] < got:
                    seen[e] += 1
                    done += 1
                    progressed = True
                    if todo:
                        os.write(fds[e], struct.pack("<II", *todo.pop()))
            if not progressed:
                time.sleep(0.0002)
        for e in ids:
            os.write(fds[e], struct.pack("<II", _STOP, _STOP))
            os.close(fds[e])
        assert sum(ar.get(timeout=30) for ar in ars.values()) == len(chunks)
    return done


def run_fifo(client: Any, ids: list[int], chunks: list[tuple[int, int]]) -> int:
    import pickle

    with tempfile.TemporaryDirectory(dir="/dev/shm") as tmp:
        fin, fout = _fifos(tmp, ids, "in"), _fifos(tmp, ids, "out")
        ars = {
            e: client.direct_view(e).apply_async(serve_fifo, fin[e], fout[e])
            for e in ids
        }
        fds = {e: os.open(fin[e], os.O_WRONLY) for e in ids}
        back = {os.open(fout[e], os.O_RDONLY): e for e in ids}
        todo = list(chunks)
        _feed(fds, ids, todo)
        done = 0
        while done < len(chunks):
            ready, _, _ = select.select(list(back), [], [], 5)
            for fd in ready:
                e = back[fd]
                (size,) = struct.unpack("<I", os.read(fd, 4))
                body = b""
                while len(body) < size:
                    body += os.read(fd, size - len(body))
                pickle.loads(body)
                done += 1
                if todo:
                    os.write(fds[e], struct.pack("<II", *todo.pop()))
        for e in ids:
            os.write(fds[e], struct.pack("<II", _STOP, _STOP))
            os.close(fds[e])
        assert sum(ar.get(timeout=30) for ar in ars.values()) == len(chunks)
        for fd in back:
            os.close(fd)
    return done


_SHELL: list[Any] = []


def run_gpucell(client: Any, ids: list[int], chunks: list[tuple[int, int]]) -> int:
    """The same iterations as a ``%%gpu_parallel`` cell, ``ITERATIONS`` a chunk:
    gpucell's own work on both sides on top of ``apply``'s transport."""
    return _gpucell_cell(chunks, channel=False)


def run_gpucell_channel(
    client: Any, ids: list[int], chunks: list[tuple[int, int]]
) -> int:
    """As :func:`run_gpucell` with ``GpuCell.chunk_channel`` on: each engine's
    chunks after its first through /dev/shm, one serving task per engine."""
    return _gpucell_cell(chunks, channel=True)


def _gpucell_cell(chunks: list[tuple[int, int]], channel: bool) -> int:
    if not _SHELL:
        from IPython.testing.globalipapp import start_ipython

        ip = start_ipython()
        ip.run_line_magic("load_ext", "gpucell")
        ip.run_line_magic("config", "GpuCell.inline_below = 0")
        _SHELL.append(ip)
    ip = _SHELL[0]
    ip.run_line_magic("config", f"GpuCell.chunk_channel = {channel}")
    n = chunks[-1][1]
    ip.run_cell_magic(
        "gpu_parallel",
        f"--quiet --schedule dynamic --chunksize {ITERATIONS}",
        f"out = []\nfor i in range({n}):\n    out.append(i * i)\n",
    )
    assert ip.user_ns["out"] == _work(0, n)
    return len(chunks)


WAYS = {
    "gpucell": run_gpucell,
    "gpucell+channel": run_gpucell_channel,
    "apply": run_apply,
    "datapub": run_datapub,
    "fifo": run_fifo,
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", type=int, default=8)
    ap.add_argument("--chunks", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=str(HERE / "results" / "stream_proto.json"))
    args = ap.parse_args()

    import gpucell

    gc = gpucell.start_cluster(args.engines, gpus="none")
    rows: list[dict[str, Any]] = []
    try:
        client, ids = gc.client, sorted(gc.engines)
        cpu = _Cpu(gc)
        chunks = _chunks(args.chunks)
        for way in WAYS.values():  # warm: imports, first connections
            way(client, ids, chunks[: 4 * len(ids)])
        for r in range(args.rounds):
            for name, way in WAYS.items():
                time.sleep(0.5)  # the last way's stragglers settle
                before, t0 = cpu.read(), time.perf_counter()
                done = way(client, ids, chunks)
                wall, after = time.perf_counter() - t0, cpu.read()
                assert done == len(chunks)
                row = {"round": r, "way": name, "chunks": done, "wall_s": wall}
                for who in before:
                    row[f"{who}_ms_per_chunk"] = (after[who] - before[who]) / done * 1e3
                row["all_ms_per_chunk"] = sum(row[f"{w}_ms_per_chunk"] for w in before)
                rows.append(row)
                print(
                    f"round {r} {name:15s} {wall:6.2f} s  "
                    + "  ".join(f"{w} {row[f'{w}_ms_per_chunk']:.3f}" for w in before)
                    + f"  all {row['all_ms_per_chunk']:.3f} ms/chunk",
                    flush=True,
                )
    finally:
        gpucell.stop()
    print(
        f"\n{args.engines} engines, {args.chunks} chunks of {ITERATIONS} iterations,"
        f" median of {args.rounds} rounds, ms of CPU per chunk:"
    )
    print("| way | kernel | controller | engines | all | wall s |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name in WAYS:
        mine = [r for r in rows if r["way"] == name]

        def med(key: str, mine: list[dict[str, Any]] = mine) -> float:
            return sorted(r[key] for r in mine)[len(mine) // 2]

        cells = [
            med(f"{w}_ms_per_chunk") for w in ("kernel", "controller", "engines", "all")
        ]
        print(f"| {name} | " + " | ".join(f"{x:.3f}" for x in cells), end="")
        print(f" | {med('wall_s'):.2f} |")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(
        json.dumps(
            {"engines": args.engines, "load": os.getloadavg(), "rows": rows}, indent=1
        )
    )
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
