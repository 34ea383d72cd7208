"""``%%gpu_parallel``: parse the line, hand the cell to :mod:`.execute`."""

from __future__ import annotations

import argparse
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments

from gpucell.errors import ClusterError, DeviceSelectionError

__all__ = ["GpuParallelMagics"]


class _Once(argparse.Action):
    """An option given twice is an error, not "the last one wins"."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option: Any = None):
        if getattr(namespace, f"_seen_{self.dest}", False):
            parser.error(
                f"%%gpu_parallel: {option} given twice; give it once "
                f"(like '{option} 0,1')."
            )
        setattr(namespace, f"_seen_{self.dest}", True)
        setattr(namespace, self.dest, values)


def _checked_args(magics: Any, line: str, cell: str) -> Any:
    """The magic line's options, every one checked before anything runs
    (:mod:`gpucell.kernel.usage`): a ``UsageError`` (or ``CheckpointRefused``)
    naming the option and the fix, the namespace untouched."""
    from gpucell.kernel import usage
    from gpucell.kernel.keep import check_folder

    m = "%%gpu_parallel"
    # shell quoting, as %gpu_cluster's: IPython's own split keeps the quotes
    # (--checkpoint '~u/x' made a folder named "'~u" in the working folder)
    args = magics.gpu_parallel.parser.parse_args(usage.split_line(m, line))
    usage.check_int(
        m, "--chunksize", args.chunksize, 1, usage.MAX_CHUNKSIZE, "iterations a chunk"
    )
    usage.check_int(
        m,
        "--retries",
        args.retries,
        0,
        usage.MAX_RETRIES,
        "0: a chunk lost with its engine is not re-run",
    )
    usage.check_int(
        m, "--seed", args.seed, 0, usage.MAX_SEED, "what numpy.random.seed takes"
    )
    usage.check_seconds(m, "--timeout", args.timeout, usage.MAX_CELL_TIMEOUT)
    usage.check_ids(m, "--devices", args.devices, ("cpu",))
    usage.check_ids(m, "--targets", args.targets)
    if args.devices and args.targets:
        raise UsageError("%%gpu_parallel: give --devices or --targets, not both.")
    if args.checkpoint is not None:
        check_folder(args.checkpoint)  # CheckpointRefused: what, where, the fix
    usage.refuse_ipython_syntax_in_loop(magics.shell, cell)
    return args


@magics_class
class GpuParallelMagics(Magics):
    """``%%gpu_parallel``: run a cell's loop on every engine of the cluster."""

    @magic_arguments()
    @argument(
        "--devices",
        action=_Once,
        help="Devices to use: GPU indices like '0,1', or 'cpu'.",
    )
    @argument("-t", "--targets", action=_Once, help="Engine ids to use, like '0,2'.")
    @argument(
        "--schedule",
        choices=["guided", "dynamic", "static"],
        action=_Once,
        help="Chunk schedule (default: %%config GpuCell.schedule, 'guided').",
    )
    @argument(
        "--chunksize",
        type=int,
        action=_Once,
        help="Iterations per chunk (dynamic), or the smallest chunk (guided).",
    )
    @argument(
        "--seed",
        type=int,
        action=_Once,
        help="Seed random, numpy and torch from (SEED, "
        "iteration) before every iteration: same results on any engine count.",
    )
    @argument(
        "--timeout",
        type=float,
        action=_Once,
        help="Cancel the loop after this many seconds.",
    )
    @argument(
        "--retries",
        type=int,
        action=_Once,
        default=2,
        help="Times a chunk is re-run after its engine died (default 2).",
    )
    @argument(
        "--resume",
        action="store_true",
        help="Run only the iterations an unfinished earlier run of this cell "
        "did not finish (kept in memory, or in --checkpoint DIR), then merge all.",
    )
    @argument(
        "--checkpoint",
        action=_Once,
        metavar="DIR",
        help="Also keep finished chunks in DIR, so --resume works after a "
        "kernel restart (removed once the results are merged).",
    )
    @argument(
        "-b",
        "--background",
        action="store_true",
        help="Return once the loop is under way; its results are merged (and the "
        "code after the loop runs) before the first later cell that uses its "
        "names, or at %%gpu_wait.",
    )
    @argument("--dry-run", action="store_true", help="Show the plan; run nothing.")
    @argument("--quiet", action="store_true", help="No summary line.")
    @cell_magic
    def gpu_parallel(self, line: str, cell: str) -> Any:
        """Run the cell's loop in parallel on the cluster's engines.

        The cell's first top-level ``for`` loop (or ``name = [... for ...]``,
        ``{...}``, ``{k: v ...}``, ``sum(e for ...)``, ``max``/``min``/``sorted``
        of a generator) runs on the engines, also inside top-level ``with``
        blocks (``with torch.no_grad():``, entered on each engine too); the
        statements before it run first in the kernel, those after it run once the
        results are merged.  The namespace ends up exactly as if the cell had run
        serially: ``L.append``/``extend`` gather in order, ``D[k] = v`` writes
        apply in order, ``acc += x`` / ``max`` / ``min`` reduce, and names
        assigned in the loop keep their last iteration's value.  A loop that
        cannot be made serial-equivalent is refused before anything runs, with
        the variable and line; inputs are read-only to iterations, and a call
        that changes one (``est.fit(X, y)``, ``loss.backward()`` on an input
        model) fails the cell on the engines' check, nothing merged.

        Examples::

            %%gpu_parallel
            losses = []
            for batch in batches:
                out = model.cuda()(batch.cuda())
                losses.append(out.mean().item())

            %%gpu_parallel --seed 0 --schedule dynamic
            hits = 0
            for i in range(1_000):
                hits += monte_carlo(10_000)

            %%gpu_parallel --dry-run      # show the plan only

            %%gpu_parallel --resume       # after an interrupt: only the rest

            %%gpu_parallel --background   # the cell returns, the run goes on

        With ``--background`` a later cell that reads, binds or deletes a name
        the run writes or reads (or another name of one of its objects), or
        that the code after the loop uses, first waits for the run and merges
        it; other cells run at once.  ``gpucell.runs`` lists the runs,
        ``%gpu_wait`` waits for them.

        After a run, ``gpucell.last_run`` records where each iteration ran.
        """
        from gpucell.kernel.execute import run_cell
        from gpucell.kernel.request import CellRequest

        args = _checked_args(self, line, cell)
        req = CellRequest(
            devices=args.devices,
            targets=args.targets,
            schedule=args.schedule,
            chunksize=args.chunksize,
            seed=args.seed,
            timeout=args.timeout,
            retries=args.retries,
            dry_run=args.dry_run,
            quiet=args.quiet,
            resume=args.resume,
            checkpoint=args.checkpoint,
            background=args.background,
        )
        try:
            run_cell(self.shell, cell, req)
        except (DeviceSelectionError, ClusterError) as e:
            raise UsageError(f"%%gpu_parallel: {e}") from None
        return None

    @line_magic
    def gpu_wait(self, line: str) -> None:
        """Wait for background runs and merge them: ``%gpu_wait`` every pending
        run, ``%gpu_wait 5`` the run of cell [5] (and the runs started before
        it).  A run's error is raised here.  An interrupt stops the wait, not
        the run (``gpucell.runs[-1].cancel()`` stops it).

        Code that runs outside cells (a widget's callback, a comm, a script
        run with ``%run``) is not checked against pending runs: call
        ``gpucell.runs.wait()`` first there.
        """
        from gpucell.kernel.background import wait_magic

        wait_magic(self.shell, line)
