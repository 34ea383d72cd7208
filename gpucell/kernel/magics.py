"""The IPython magics: thin wrappers that parse options and call the Python API."""

from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser

from gpucell import config as _config
from gpucell.errors import ClusterError, DeviceSelectionError

__all__ = ["GpuClusterMagics", "load", "unload"]


def _parser(prog: str, description: str) -> MagicArgumentParser:
    return MagicArgumentParser(prog=prog, description=description, add_help=False)


def _start(args: Any) -> None:
    """``%gpu_cluster start``: a local, ssh or Slurm cluster (or only its script)."""
    from gpucell.cluster import lifecycle as api

    slurm = None
    job = ("nodes", "gpus_per_node", "cpus_per_node", "partition", "time", "account")
    job += ("slurm_directive", "dry_run", "jobs", "checkpoint")
    if args.cpus_per_node is not None and args.gpus_per_node is not None:
        raise UsageError(
            "%gpu_cluster start: --gpus-per-node or --cpus-per-node: engines are "
            "per GPU or per core (a CPU-only partition); choose one."
        )
    if args.slurm and args.scheduler not in (None, "slurm"):
        raise UsageError(
            f"%gpu_cluster start: --slurm or --scheduler {args.scheduler}; choose one."
        )
    if args.slurm or args.scheduler or args.profile:
        from gpucell.cluster.site import merge

        line = {k: getattr(args, k) for k in job if k != "slurm_directive"}
        line.update(slurm=args.slurm, scheduler=args.scheduler)
        line["directives"] = args.slurm_directive
        merged = merge(line, args.profile)  # the profile's site settings under
        slurm = merged.request
    stray = [o for o in job if getattr(args, o) is not None]
    if stray and slurm is None:  # (a profile may name the scheduler)
        flag = "--" + stray[0].replace("_", "-")
        raise UsageError(f"%gpu_cluster start: {flag} is for --slurm (or --scheduler).")
    if slurm is not None:
        if args.dry_run:
            from gpucell.cluster.slurm import dry_run

            print(merged.describe())
            print(dry_run(slurm, args.python, args.profile))
            return
    api.start_cluster(
        args.n,
        gpus=args.gpus,
        per_gpu=args.per_gpu,
        cpu_engines=args.cpu_engines,
        profile=args.profile,
        timeout=args.timeout,
        echo=print,
        ssh=args.ssh,
        ssh_key=args.ssh_key,
        python=args.python,
        controller_ip=args.controller_ip,
        slurm=slurm,
        encrypt=args.encrypt,
    )


def _connect(args: Any) -> None:
    """``%gpu_cluster connect``: a cluster started elsewhere."""
    from gpucell.cluster import lifecycle as api

    api.connect(
        profile=args.profile,
        cluster_id=args.cluster_id,
        file=args.file,
        ssh=args.ssh,
        ssh_key=args.ssh_key,
        timeout=args.timeout,
        echo=print,
    )


def _status(gc: Any) -> None:
    """``%gpu_cluster status``: the engines, and batch jobs not started yet."""
    from gpucell.cluster import lifecycle as api
    from gpucell.cluster.engines import encryption_note
    from gpucell.cluster.slurm import pending_note

    # (api.status also arms the restart watch: a cluster started before the
    # kernel's loop ran, in a startup script, is watched from then on)
    print(api.format_status(api.status(), gc.selected))
    if note := encryption_note(gc):  # GpuCell.encrypt, --no-encrypt, --slurm
        print(f"gpucell: {note}")
    if note := pending_note(gc):  # --jobs: the jobs not started yet
        print(f"gpucell: {note}")


def _monitor(gc: Any) -> None:
    """``%gpu_cluster monitor``: the live load widget, outside any cell run."""
    from IPython.display import display

    from gpucell.kernel.telemetry import for_cluster
    from gpucell.ui.monitor import DeviceMonitor

    display(DeviceMonitor(gc, for_cluster(gc)))


def _start_parser() -> MagicArgumentParser:
    start = _parser("%gpu_cluster start", "Start a local cluster, one engine per GPU.")
    start.add_argument(
        "-n",
        type=int,
        default=None,
        help="CPU engines without GPUs "
        "(default: one per core); with GPUs, use the first N.",
    )
    start.add_argument("--gpus", default=None, help="'all' (default), 'none' or '0,2'.")
    start.add_argument("--per-gpu", type=int, default=None, help="Engines per GPU.")
    start.add_argument(
        "--cpu-engines",
        type=int,
        default=None,
        help="CPU engines beside the GPU engines.",
    )
    start.add_argument("--profile", default=None, help="An existing IPython profile.")
    start.add_argument(
        "--ssh",
        default=None,
        help="Other hosts, host1[:n],user@host2[:n]: engines there over ssh too.",
    )
    start.add_argument("--ssh-key", default=None, help="Private key for --ssh.")
    start.add_argument(
        "--python", default=None, help="The Python with gpucell on the --ssh hosts."
    )
    _add_slurm_options(start)
    start.add_argument(
        "--controller-ip",
        default=None,
        help="Address the controller listens on (default: what the hosts reach).",
    )
    start.add_argument(
        "--timeout", type=float, default=None, help="Seconds to wait for the engines."
    )
    start.add_argument(
        "--no-encrypt",
        dest="encrypt",
        action="store_false",
        default=None,
        help="Messages in clear (GpuCell.encrypt): cheaper heavy traffic to other "
        "hosts, readable by anyone who reaches the controller's ports.",
    )
    return start


def _add_slurm_options(start: MagicArgumentParser) -> None:
    start.add_argument(
        "--slurm", action="store_true", help="Start the engines as one Slurm job."
    )
    start.add_argument(
        "--scheduler",
        choices=("slurm", "pbs", "torque", "lsf", "sge"),
        default=None,
        help="The engines as a job of this batch system (--slurm: slurm); the "
        "options below apply to each.",
    )
    start.add_argument("--nodes", type=int, default=None, help="--slurm: nodes.")
    start.add_argument(
        "--gpus-per-node",
        type=int,
        default=None,
        help="--slurm: GPUs (engines) a node.",
    )
    start.add_argument(
        "--cpus-per-node",
        type=int,
        default=None,
        help="--slurm: a CPU-only partition: engines a node, one core each, no GPU.",
    )
    start.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="--slurm: N smaller jobs (nodes shared out); cells start with the "
        "first job's engines, the others join as their jobs start.",
    )
    start.add_argument(
        "--checkpoint",
        type=int,
        nargs="?",
        const=1,
        default=None,
        metavar="N",
        help="--slurm: a job Slurm ends during a run (time limit, preemption, "
        "scancel) is submitted again, up to N times (default 1), and the run goes "
        "on on its engines (GpuCell.slurm_resubmit); one still pending after "
        "GpuCell.slurm_pending_timeout s (600) is cancelled.",
    )
    start.add_argument("--partition", default=None, help="--slurm: partition.")
    start.add_argument("--time", default=None, help="--slurm: time limit.")
    start.add_argument("--account", default=None, help="--slurm: account.")
    start.add_argument(
        "--slurm-directive",
        "--directive",
        dest="slurm_directive",
        action="append",
        default=None,
        metavar="OPTION",
        help="--slurm: an extra #SBATCH option, e.g. --mem-per-cpu=4G (repeat it); "
        "with --scheduler, one of its own (#PBS -l mem=4gb).",
    )
    start.add_argument(
        "--dry-run",
        action="store_const",
        const=True,
        default=None,
        help="--slurm: print the job script and the sbatch command; submit nothing.",
    )


def _build_parsers() -> dict[str, MagicArgumentParser]:
    conn = _parser("%gpu_cluster connect", "Attach to a cluster started elsewhere.")
    conn.add_argument("--profile", default=None)
    conn.add_argument("--cluster-id", default=None)
    conn.add_argument("--file", default=None, help="An ipcontroller-client.json.")
    conn.add_argument(
        "--ssh", default=None, help="user@host[:port] to tunnel through (key login)."
    )
    conn.add_argument("--ssh-key", default=None, help="Private key for --ssh.")
    conn.add_argument("--timeout", type=float, default=None)

    select = _parser(
        "%gpu_cluster select",
        "Pick the engines later cells use: a widget, or engine ids / 'all'.",
    )
    select.add_argument(
        "engines",
        nargs="?",
        default=None,
        help="Engine ids like '0,2', or 'all'. Omit for the widget.",
    )
    return {
        "start": _start_parser(),
        "connect": conn,
        "status": _parser("%gpu_cluster status", "Show the engines."),
        "select": select,
        "monitor": _parser("%gpu_cluster monitor", "Live per-device load."),
        "stop": _parser("%gpu_cluster stop", "Stop the cluster."),
    }


_USAGE = """\
Usage:
  %gpu_cluster start [-n N] [--gpus all|none|0,2,..] [--per-gpu K] [--cpu-engines M]
                     [--profile NAME] [--timeout S] [--no-encrypt]
                     [--ssh host1[:n],user@host2[:n] [--ssh-key KEY] [--python PATH]
                      [--controller-ip IP]]
                     [--slurm | --scheduler pbs|torque|lsf|sge
                      [--nodes N] [--gpus-per-node G | --cpus-per-node C]
                      [--jobs J] [--checkpoint [N]] [--partition P] [--time T]
                      [--account A] [--slurm-directive OPT]... [--dry-run]]
  %gpu_cluster connect --profile P | --cluster-id ID | --file ipcontroller-client.json
                       [--ssh user@host[:port] [--ssh-key KEY]] [--timeout S]
  %gpu_cluster status
  %gpu_cluster select [0,2|all]
  %gpu_cluster monitor
  %gpu_cluster stop
"""


def _check(cmd: str, args: Any) -> None:
    """Every option of ``%gpu_cluster <cmd>`` within its limits, before anything
    starts (:mod:`gpucell.kernel.usage`; ``-n``, ``--per-gpu`` and
    ``--cpu-engines`` are bounded by the host's cores where the engines are
    planned, :func:`gpucell.core.topology.engine_limit`)."""
    from gpucell.kernel import usage

    m = f"%gpu_cluster {cmd}"
    for option, value in vars(args).items():
        if isinstance(value, str) and len(value) > usage.PATH_MAX:
            flag = "--" + option.replace("_", "-")
            raise UsageError(
                f"{m} {flag}: {len(value):,} characters; at most "
                f"{usage.PATH_MAX:,} are taken. Pass a shorter value. Nothing ran."
            )
    usage.check_seconds(
        m, "--timeout", getattr(args, "timeout", None), usage.MAX_START_TIMEOUT
    )
    usage.check_name(m, "--profile", getattr(args, "profile", None))
    usage.check_name(m, "--cluster-id", getattr(args, "cluster_id", None))
    usage.check_path(m, "--file", getattr(args, "file", None))
    usage.check_path(m, "--ssh-key", getattr(args, "ssh_key", None))
    if cmd == "start":
        usage.check_ids(m, "--gpus", args.gpus, ("all", "none"))
        usage.check_int(m, "--nodes", args.nodes, 1, usage.MAX_NODES)
        usage.check_int(
            m, "--gpus-per-node", args.gpus_per_node, 1, usage.MAX_GPUS_PER_NODE
        )
        usage.check_int(m, "--cpus-per-node", args.cpus_per_node, 1, 4096)
        usage.check_int(m, "--jobs", args.jobs, 1, usage.MAX_NODES)
        usage.check_int(m, "--checkpoint", args.checkpoint, 0, 100)
    elif cmd == "select":
        usage.check_ids(m, "engines", args.engines, ("all",))


@magics_class
class GpuClusterMagics(Magics):
    """``%gpu_cluster``: start, connect to, inspect and stop a GPU cluster."""

    @line_magic
    def gpu_cluster(self, line: str) -> Any:
        """Manage the cluster that ``%%gpu_parallel`` cells run on.

        Usage::

          %gpu_cluster start [-n N] [--gpus all|none|0,2,..] [--per-gpu K]
                             [--cpu-engines M] [--profile NAME] [--timeout S]
                             [--ssh host1[:n],host2[:n] [--ssh-key K]
                              [--python PATH] [--controller-ip IP]]
                             [--slurm | --scheduler pbs|torque|lsf|sge
                              [--nodes N] [--gpus-per-node G]
                              [--cpus-per-node C] [--jobs J] [--checkpoint [N]]
                              [--partition P] [--time T]
                              [--account A] [--slurm-directive OPT]... [--dry-run]]
          %gpu_cluster connect --profile P | --cluster-id ID | --file F
                               [--ssh u@h[:port] [--ssh-key K]]
          %gpu_cluster status
          %gpu_cluster select [0,2|all]
          %gpu_cluster monitor
          %gpu_cluster stop

        ``start`` launches one ipyparallel engine per GPU, each pinned to its device
        (``CUDA_VISIBLE_DEVICES`` lists its GPU first, so ``.cuda()`` code lands on
        it) with its CPU affinity set to the GPU's near cores.  Without GPUs it
        starts one CPU engine per core, each limited to its share of threads.

        Examples::

          %gpu_cluster start                 # every GPU (or every core)
          %gpu_cluster start --gpus 0,2      # two GPUs
          %gpu_cluster start --per-gpu 2     # two engines share each GPU
          %gpu_cluster start -n 2 --gpus none
          %gpu_cluster start --ssh gpu1,gpu2:2 --python /opt/venv/bin/python
          %gpu_cluster start --slurm --nodes 2 --gpus-per-node 4 --time 1:00:00
          %gpu_cluster start --slurm --slurm-directive=--mem-per-cpu=4G --dry-run
          %gpu_cluster start --slurm --partition cpu --nodes 2 --cpus-per-node 32
          %gpu_cluster start --slurm --nodes 4 --jobs 4  # cells start with 1 node
          %gpu_cluster start --scheduler pbs --nodes 2 --gpus-per-node 4 --dry-run
          %gpu_cluster connect --profile mpi # a cluster from `ipcluster start`
          %gpu_cluster status
          %gpu_cluster select                # tick the devices later cells use
          %gpu_cluster select 0,2            # the same without the widget
          %gpu_cluster monitor               # live load, outside any cell run
          %gpu_cluster stop

        Defaults come from ``%config GpuCell`` (e.g. ``%config GpuCell.per_gpu = 2``).
        """
        from gpucell.cluster import lifecycle as api
        from gpucell.kernel.usage import split_line
        from gpucell.kernel.warm import warm_kernel

        argv = split_line("%gpu_cluster", line)
        if not argv:
            raise UsageError("%gpu_cluster needs a command.\n" + _USAGE)
        cmd, rest = argv[0], argv[1:]
        parsers = _build_parsers()
        if cmd not in parsers:
            raise UsageError(f"%gpu_cluster: unknown command {cmd!r}.\n" + _USAGE)
        args = parsers[cmd].parse_args(rest)
        _check(cmd, args)
        try:
            if cmd == "start":
                _start(args)
                warm_kernel()  # the first cell's imports, here instead (kernel/warm)
            elif cmd == "connect":
                _connect(args)
                warm_kernel()
            elif cmd == "status":
                _status(api.current())
            elif cmd == "select":
                _wait_for_background(self.shell, "`%gpu_cluster select` waits for it")
                self._select(api.current(), args.engines)
            elif cmd == "monitor":
                _monitor(api.current())
            elif cmd == "stop":
                _wait_for_background(self.shell, "`%gpu_cluster stop` waits for it")
                api.stop(echo=print)
        except (ClusterError, DeviceSelectionError) as e:
            raise UsageError(f"%gpu_cluster {cmd}: {e}") from None
        return None

    @staticmethod
    def _select(gc: Any, engines: str | None) -> None:
        """The selection widget, or set the selection from ids given inline."""
        from gpucell.ui.select import selection_from

        if engines is None:
            from IPython.display import display

            from gpucell.kernel.telemetry import for_cluster
            from gpucell.ui.select import DeviceSelector

            display(DeviceSelector(gc, for_cluster(gc)))
            return
        from gpucell.kernel.request import parse_engine_ids

        live = gc.live_ids()
        if engines.strip().lower() == "all":
            gc.selected = None
        else:
            gc.selected = selection_from(
                parse_engine_ids(engines, live, "select"), live
            )
        which = "all engines" if gc.selected is None else f"engines {list(gc.selected)}"
        print(f"gpucell: later cells run on {which}.")


def _wait_for_background(shell: Any, why: str) -> None:
    """Pending ``--background`` runs finish and merge first (kernel/background.py)."""
    from gpucell.kernel.background import wait_for_all

    wait_for_all(shell, why)


#: the cells (and lines) that say first what restarts said since the last cell
_GPUCELL_MAGICS = ("%gpu_parallel", "%gpu_distributed", "%gpu_cluster", "%gpu_wait")


def _say_between(info: Any) -> None:
    """``pre_run_cell``: a cell using gpucell's magics says first, in its own
    output, what the restarts said while no cell ran (kept by the restart
    watch: printed then, it would land in the last cell's output)."""
    raw = getattr(info, "raw_cell", None) or ""
    if not any(m in raw for m in _GPUCELL_MAGICS):
        return
    from gpucell.cluster import restart_watch

    for text in restart_watch.said_between():
        print(f"gpucell: since the last cell: {text}", flush=True)


def load(ipython: Any) -> None:
    _config.install(ipython)
    if _say_between not in ipython.events.callbacks["pre_run_cell"]:
        ipython.events.register("pre_run_cell", _say_between)
    ipython.register_magics(GpuClusterMagics)
    from gpucell.kernel.parallel_magic import GpuParallelMagics

    ipython.register_magics(GpuParallelMagics)
    from gpucell.kernel.distributed_magic import GpuDistributedMagics

    ipython.register_magics(GpuDistributedMagics)
    from gpucell.kernel import panel

    panel.install(ipython)


def unload(ipython: Any) -> None:
    import sys

    from gpucell.kernel import panel

    panel.uninstall()
    background = sys.modules.get("gpucell.kernel.background")
    if background is not None:
        background.shutdown()  # pending runs' engines stop their work
    cluster = sys.modules.get("gpucell.cluster.lifecycle")
    if cluster is not None:
        cluster.stop()
    if _say_between in ipython.events.callbacks["pre_run_cell"]:
        ipython.events.unregister("pre_run_cell", _say_between)
    mm = ipython.magics_manager
    for kind in ("line", "cell"):
        for name in ("gpu_cluster", "gpu_parallel", "gpu_distributed", "gpu_wait"):
            mm.magics[kind].pop(name, None)
