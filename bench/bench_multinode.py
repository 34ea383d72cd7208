"""Multi-node start-up benchmark: gpucell's ``--ssh`` and ``--slurm`` clusters beside
ipyparallel's own SSH and Slurm launchers, on the same servers.

Why.  A multi-node start is mostly waiting: ssh logins, ``sbatch`` and Slurm's
scheduling, engine imports, the first heartbeats.  gpucell adds work of its own on
that path (a probe of every ssh host, one engine set per engine, a description of
every engine) and removes some (a 100 ms heartbeat, no connection files copied, no
nanny).  This measures the net effect against ``ipcluster start`` with
ipyparallel's launchers as shipped, on real servers on this machine.

Servers (started once, each cluster is fresh per run)
  ssh    two sshd "hosts", ``node2`` and ``node3``, each in its own UTS, pid and
         mount namespaces (own host name, pids, /proc and empty /dev/shm; loopback
         shared), as tests/test_ssh_start.py's ``node`` fixture starts one; one
         ``ssh_config`` names both.
  slurm  the real Slurm of tests/slurm_cluster.py: slurmctld and two slurmd (this
         host and ``node2``), two fake GPUs each.

Variants
  gpucell ssh      ``gpucell.start_cluster(1, gpus="none", ssh="node2:1,node3:1",
                   python=sys.executable)``: 1 local engine + 1 per host.
  ipyparallel ssh  ``Cluster(engine_launcher_class="ssh")`` with
                   ``SSHEngineSetLauncher.engines = {"node2": 1, "node3": 1}``
                   (defaults otherwise: 3 s heartbeat, connection files sent by scp).
  gpucell slurm    ``gpucell.start_cluster(slurm=SlurmRequest(nodes=2,
                   gpus_per_node=2))``: one job, 4 engines.
  ipyparallel slurm  ``Cluster(engine_launcher_class="slurm")``, a batch template
                   asking for 2 nodes x 2 tasks, ``--gpus-per-node=2``; 4 engines.

Columns: start = the start call until every engine has registered (gpucell: until
``start_cluster`` returns, which also describes each engine); stop = the stop call;
gone = the stop call until every process the run started has exited (and, for
Slurm, ``squeue`` is empty).  Runs are interleaved (gpucell, ipyparallel, gpucell,
...) so a change of load on the machine falls on both.

Needs root, ``unshare``, OpenSSH's sshd and Debian's Slurm and munge.  Everything
(keys, configs, Slurm's state, IPython profiles) lives in one temporary folder;
every daemon, controller and engine is stopped on exit.

Results: a table on stdout and ``bench/results/multinode.json``.

Usage:  python bench/bench_multinode.py [--runs 3] [--only ssh,slurm] [--timeout 120]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "multinode.json"
HOSTS = ("node2", "node3")
GONE_TIMEOUT = 60.0


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------


def wait_for(ok: Callable[[], bool], timeout: float, poll: float = 0.1) -> bool:
    """Poll ``ok`` until it is true (True) or ``timeout`` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while not ok():
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def descendants() -> set[int]:
    """Pids of every process below this one."""
    return {p.pid for p in psutil.Process().children(recursive=True)}


def describe(pids: set[int]) -> list[str]:
    out = []
    for pid in sorted(pids):
        with contextlib.suppress(psutil.Error):
            out.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:120]}")
    return out


def kill_pids(pids: set[int]) -> None:
    """SIGKILL these pids (processes this script started) and reap them."""
    procs = []
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            p = psutil.Process(pid)
            p.kill()
            procs.append(p)
    psutil.wait_procs(procs, timeout=5)


@contextlib.contextmanager
def chdir(path: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


def summary(xs: list[float]) -> dict | None:
    if not xs:
        return None
    return {"min": min(xs), "median": statistics.median(xs), "runs": list(xs)}


# --------------------------------------------------------------------------------------
# servers: namespaced sshd hosts, and Slurm
# --------------------------------------------------------------------------------------


# the namespaced sshd hosts and the Slurm are the tests' own (tests/ssh_hosts.py,
# tests/slurm_cluster.py): the bench measures on the servers the tests use
sys.path.insert(0, str(ROOT / "tests"))
from ssh_hosts import SshHost  # noqa: E402
from ssh_hosts import missing as ssh_missing  # noqa: E402
from ssh_hosts import start_hosts as start_ssh_hosts  # noqa: E402
from ssh_hosts import stop_hosts as stop_ssh_hosts  # noqa: E402


def start_slurm(root: Path) -> Any:
    """tests/slurm_cluster.py's Slurm, with ``SLURM_CONF`` exported."""
    import slurm_cluster

    why = slurm_cluster.missing()
    if why:
        raise RuntimeError(why)
    s = slurm_cluster.start(root)
    os.environ["SLURM_CONF"] = str(s.conf)
    return s


# --------------------------------------------------------------------------------------
# one run of each variant
# --------------------------------------------------------------------------------------


@dataclass
class Run:
    """What one start/stop of a cluster measured."""

    engines: int
    hosts: list[str]
    start_s: float
    stop_s: float
    gone_s: float | None  # None: something still ran GONE_TIMEOUT s after stop
    leftover: list[str]


def finish(
    stop: Callable[[], None], before: set[int], done: Callable[[], bool]
) -> tuple[float, float | None, list[str]]:
    """Time ``stop``, then until every process started since ``before`` has gone
    and ``done()``; kill what is still there after GONE_TIMEOUT s."""
    t0 = time.perf_counter()
    stop()
    stop_s = time.perf_counter() - t0
    gone = wait_for(lambda: not (descendants() - before) and done(), GONE_TIMEOUT, 0.2)
    gone_s = time.perf_counter() - t0 if gone else None
    left = descendants() - before
    leftover = describe(left)
    kill_pids(left)
    return stop_s, gone_s, leftover


def gpucell_ssh(cfg: Path, hosts: list[SshHost], timeout: float) -> Run:
    import gpucell
    from gpucell import config

    config.settings().ssh_options = ["-F", str(cfg)]
    spec = ",".join(f"{h.name}:1" for h in hosts)
    before = descendants()
    t0 = time.perf_counter()
    try:
        gc = gpucell.start_cluster(
            1, gpus="none", ssh=spec, python=sys.executable, timeout=timeout
        )
        start_s = time.perf_counter() - t0
    except BaseException:
        _gpucell_stop_quietly()
        raise
    names = sorted(e.host for e in gc.engines.values())
    stop_s, gone_s, left = finish(
        gpucell.stop, before, lambda: not any(h.engines() for h in hosts)
    )
    return Run(len(names), names, start_s, stop_s, gone_s, left)


def _gpucell_stop_quietly() -> None:
    import gpucell

    with contextlib.suppress(Exception):
        gpucell.stop()


def _hostname() -> str:
    import socket  # runs on the engine

    return socket.gethostname()


def ipp_cluster(n: int, **kw: Any) -> Any:
    """An ipyparallel Cluster, defaults otherwise (``ipcluster start``'s)."""
    import ipyparallel as ipp

    return ipp.Cluster(n=n, log_level=40, **kw)


def run_ipp(
    cluster: Any, n: int, timeout: float, before: set[int], done: Callable[[], bool]
) -> Run:
    """``start_and_connect_sync(n)`` until ``n`` engines registered; then stop."""
    cluster.engine_timeout = timeout
    t0 = time.perf_counter()
    try:
        rc = cluster.start_and_connect_sync(n=n)
        rc.wait_for_engines(n, timeout=timeout)
        start_s = time.perf_counter() - t0
        names = sorted(rc[:].apply_sync(_hostname))
    except BaseException:
        with contextlib.suppress(Exception):
            cluster.stop_cluster_sync()
        raise

    def stop() -> None:
        rc.close()
        cluster.stop_cluster_sync()

    stop_s, gone_s, left = finish(stop, before, done)
    return Run(len(names), names, start_s, stop_s, gone_s, left)


def ipp_ssh(cfg: Path, hosts: list[SshHost], work: Path, timeout: float) -> Run:
    cluster = ipp_cluster(len(hosts), engine_launcher_class="ssh")
    c = cluster.config.SSHEngineSetLauncher
    c.engines = {h.name: 1 for h in hosts}
    c.ssh_args = ["-F", str(cfg)]
    c.scp_args = ["-F", str(cfg)]
    c.remote_python = sys.executable
    # the hosts share this file system: a separate remote profile, so that scp
    # never copies a connection file onto itself
    c.remote_profile_dir = str(work / "remote-profile")
    before = descendants()
    return run_ipp(
        cluster,
        len(hosts),
        timeout,
        before,
        lambda: not any(h.engines() for h in hosts),
    )


def gpucell_slurm(slurm: Any, timeout: float) -> Run:
    import gpucell
    from gpucell.cluster.slurm import SlurmRequest

    before = descendants()
    t0 = time.perf_counter()
    try:
        gc = gpucell.start_cluster(
            slurm=SlurmRequest(nodes=2, gpus_per_node=2), timeout=timeout
        )
        start_s = time.perf_counter() - t0
    except BaseException:
        _gpucell_stop_quietly()
        raise
    names = sorted(e.host for e in gc.engines.values())
    stop_s, gone_s, left = finish(gpucell.stop, before, lambda: not slurm.jobs())
    return Run(len(names), names, start_s, stop_s, gone_s, left)


IPP_SLURM_TEMPLATE = """#!/bin/sh
#SBATCH --export=ALL
#SBATCH --job-name=ipengine-{cluster_id}
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --ntasks={n}
#SBATCH --gpus-per-node=2
#SBATCH --output={output_file}
srun {program_and_args}
"""


def ipp_slurm(slurm: Any, work: Path, timeout: float) -> Run:
    cluster = ipp_cluster(4, engine_launcher_class="slurm")
    cluster.config.SlurmEngineSetLauncher.batch_template = IPP_SLURM_TEMPLATE
    before = descendants()
    with chdir(work):  # the launcher writes ./slurm_engine.sbatch
        return run_ipp(cluster, 4, timeout, before, lambda: not slurm.jobs())


# --------------------------------------------------------------------------------------
# rounds, table, report
# --------------------------------------------------------------------------------------


def measure(variants: dict[str, Callable[[], Run]], runs: int) -> dict[str, dict]:
    """Each variant ``runs`` times, interleaved; errors kept with their traceback."""
    rec: dict[str, dict] = {v: {"runs": [], "errors": []} for v in variants}
    for i in range(runs):
        for name, fn in variants.items():
            try:
                r = fn()
            except Exception as e:
                tb = traceback.format_exc()
                rec[name]["errors"].append({"error": repr(e), "traceback": tb})
                print(f"  {name} run {i + 1}: ERROR {e!r}\n{tb}", file=sys.stderr)
                continue
            rec[name]["runs"].append(r.__dict__)
            gone = f"{r.gone_s:.2f}s" if r.gone_s is not None else "NOT GONE"
            print(
                f"  {name} run {i + 1}: {r.engines} engines {r.hosts}  start "
                f"{r.start_s:.2f}s  stop {r.stop_s:.2f}s  gone {gone}"
                + (f"  leftover {r.leftover}" if r.leftover else ""),
                file=sys.stderr,
                flush=True,
            )
    for e in rec.values():
        for key in ("start_s", "stop_s", "gone_s"):
            vals = [r[key] for r in e["runs"] if r[key] is not None]
            e[key] = summary(vals)
        e["engines"] = sorted({r["engines"] for r in e["runs"]})
    return rec


def _ratio(a: dict | None, b: dict | None) -> str:
    if not a or not b or not b["median"]:
        return "-"
    return f"{a['median'] / b['median']:.2f}"


def _cell(s: dict | None) -> str:
    return f"{s['min']:.2f} / {s['median']:.2f}" if s else "-"


def print_table(results: dict[str, dict]) -> None:
    cols = ["variant", "engines", "start min/med", "stop min/med", "gone min/med"]
    cols += ["start ratio", "stop ratio", "ok/runs"]
    rows = []
    for name, e in results.items():
        kind = name.split()[-1]
        peer = (
            results.get(f"ipyparallel {kind}") if name.startswith("gpucell") else None
        )
        rows.append(
            [
                name,
                ",".join(map(str, e["engines"])) or "-",
                _cell(e["start_s"]),
                _cell(e["stop_s"]),
                _cell(e["gone_s"]),
                _ratio(e["start_s"], peer and peer["start_s"]),
                _ratio(e["stop_s"], peer and peer["stop_s"]),
                f"{len(e['runs'])}/{len(e['runs']) + len(e['errors'])}",
            ]
        )
    widths = [max(len(c), *(len(r[k]) for r in rows)) for k, c in enumerate(cols)]
    print("  ".join(c.ljust(w) for c, w in zip(cols, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)))
    print(
        "seconds, min / median; ratio = gpucell median / ipyparallel median; "
        "gone = stop call -> every process of the run exited (and squeue empty)"
    )


def _version(cmd: list[str]) -> str:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return (p.stdout + p.stderr).strip().splitlines()[0] if p.stdout + p.stderr else ""


def machine_info() -> dict:
    import ipyparallel

    import gpucell

    def git(*a: str) -> str:
        p = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return p.stdout.strip()

    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": sys.version.split()[0],
        "loadavg_at_start": os.getloadavg(),
        "versions": {
            "gpucell": getattr(gpucell, "__version__", ""),
            "ipyparallel": ipyparallel.__version__,
            "openssh": _version(["ssh", "-V"]),
            "slurm": _version(["slurmd", "-V"]),
        },
        "git": {"commit": git("rev-parse", "HEAD"), "dirty": bool(git("status", "-s"))},
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


# --------------------------------------------------------------------------------------
# main
# --------------------------------------------------------------------------------------


def _sigterm(*_: Any) -> None:
    raise SystemExit(143)  # through the finally blocks: servers are stopped


def run_ssh(work: Path, runs: int, timeout: float) -> dict[str, dict]:
    why = ssh_missing()
    if why:
        return {"ssh": {"skipped": why}}
    cfg, hosts = start_ssh_hosts(work / "ssh", HOSTS)
    try:
        variants = {
            "gpucell ssh": lambda: gpucell_ssh(cfg, hosts, timeout),
            "ipyparallel ssh": lambda: ipp_ssh(cfg, hosts, work, timeout),
        }
        return measure(variants, runs)
    finally:
        stop_ssh_hosts(hosts)


def run_slurm(work: Path, runs: int, timeout: float) -> dict[str, dict]:
    root = Path(tempfile.mkdtemp(prefix="gpucell-slurm-"))
    try:
        slurm = start_slurm(root)
    except RuntimeError as e:
        shutil.rmtree(root, ignore_errors=True)
        return {"slurm": {"skipped": str(e)}}
    try:
        variants = {
            "gpucell slurm": lambda: gpucell_slurm(slurm, timeout),
            "ipyparallel slurm": lambda: ipp_slurm(slurm, work, timeout),
        }
        return measure(variants, runs)
    finally:
        slurm.stop()
        os.environ.pop("SLURM_CONF", None)
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="runs per variant (3)")
    ap.add_argument("--only", default="ssh,slurm", help="ssh, slurm or both")
    ap.add_argument("--timeout", type=float, default=120.0, help="start timeout (s)")
    ap.add_argument("--out", default=str(RESULTS), help="JSON output path")
    args = ap.parse_args(argv)
    kinds = [k.strip() for k in args.only.split(",") if k.strip()]

    signal.signal(signal.SIGTERM, _sigterm)
    work = Path(tempfile.mkdtemp(prefix="gpucell-bench-multinode-"))
    (work / "ssh").mkdir()
    # a private IPython dir: no profile shared with other clusters on this machine
    os.environ["IPYTHONDIR"] = str(work / "ipython")
    report: dict[str, Any] = {
        "meta": machine_info(),
        "setup": {
            "ssh": f"{len(HOSTS)} namespaced sshd hosts ({', '.join(HOSTS)}), "
            "1 engine each; gpucell adds 1 local engine",
            "slurm": "tests/slurm_cluster.py: 2 nodes x 2 fake GPUs; 4 engines",
        },
        "runs": args.runs,
        "results": {},
    }
    before = descendants()
    t0 = time.perf_counter()
    try:
        if "ssh" in kinds:
            report["results"].update(run_ssh(work, args.runs, args.timeout))
        if "slurm" in kinds:
            report["results"].update(run_slurm(work, args.runs, args.timeout))
    finally:
        left = descendants() - before
        report["leftover_at_exit"] = describe(left)
        kill_pids(left)
        shutil.rmtree(work, ignore_errors=True)
    report["total_s"] = time.perf_counter() - t0

    print(f"\nssh: {report['setup']['ssh']}; slurm: {report['setup']['slurm']}")
    measured = {k: v for k, v in report["results"].items() if "skipped" not in v}
    for k, v in report["results"].items():
        if "skipped" in v:
            print(f"{k}: skipped: {v['skipped']}")
    if measured:
        print_table(measured)
    if report["leftover_at_exit"]:
        print(f"killed at exit: {report['leftover_at_exit']}")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2))
    print(f"total {report['total_s']:.0f} s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
