"""``%%gpu_distributed``: parse the line, hand the cell to :mod:`.distributed`.

Why this name: the cell runs as one ``torch.distributed`` job, and the name
says so in the words the cell's own code uses (``torch.distributed``,
``init_process_group``); it sits beside ``%%gpu_parallel`` (tab completion
offers both, and the pair reads as the two ways to use the GPUs: independent
iterations, or one job across them).  The other candidates say less or too
much: ``%%gpu_ddp`` names one wrapper (the cell may use FSDP, or no wrapper at
all: an evaluation with ``all_gather``), ``%%gpu_train`` one use, ``%%gpu_spmd``
and ``%%gpu_mpi`` jargon a notebook user may not know (and MPI is not what
runs).

``%gpu_distributed`` (the line magic) shows the process group, and
``%gpu_distributed stop`` takes it down.
"""

from __future__ import annotations

import math
import shlex
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, magics_class
from IPython.core.magic_arguments import MagicArgumentParser

from gpucell.errors import ClusterError, DeviceSelectionError

__all__ = ["GpuDistributedMagics"]


def _parser() -> MagicArgumentParser:
    p = MagicArgumentParser(
        prog="%%gpu_distributed",
        description="Run the cell on every selected engine as one "
        "torch.distributed job.",
        add_help=False,
    )
    p.add_argument("--devices", help="GPU indices like '0,1', or 'cpu'.")
    p.add_argument("-t", "--targets", help="Engine ids, like '0,2'.")
    p.add_argument(
        "--backend",
        choices=["auto", "gloo", "nccl"],
        default="auto",
        help="nccl on GPU engines, gloo on CPU engines (default: auto).",
    )
    p.add_argument(
        "--out",
        default=None,
        help="Names to bring back into the notebook: rank 0's value, or "
        "name@all for a list of every rank's (like 'model,history@all').",
    )
    p.add_argument(
        "--ranks",
        choices=["0", "all"],
        default="0",
        help="Whose output to show: rank 0's (default) or every rank's, tagged.",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=None,
        help="Seconds a collective may wait for the other ranks (default 300).",
    )
    p.add_argument("--quiet", action="store_true", help="No summary line.")
    return p


@magics_class
class GpuDistributedMagics(Magics):
    """``%%gpu_distributed``: one torch.distributed job across the engines."""

    @line_cell_magic
    def gpu_distributed(self, line: str, cell: str | None = None) -> Any:
        """Run the cell on every selected engine as one torch.distributed job.

        Each engine is a rank: ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
        ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` are set and the
        default process group is initialised before the first such cell (nccl on
        GPU engines, gloo on CPU engines), then kept: a model built in one cell
        is trained in the next.  Each rank's GPU is ``cuda:0``
        (``gpucell.device()``), whatever its LOCAL_RANK.  The names the cell
        reads from the notebook are sent to every rank; what the cell makes
        stays on the ranks unless ``--out`` brings it back (rank 0's value, or
        ``name@all``: a list of every rank's), CUDA tensors and modules as CPU
        objects.  Rank 0's output is shown (``--ranks all``: every rank's,
        tagged).  An error on any rank stops every rank and names the rank,
        host and line; a collective that waits longer than ``--timeout``
        seconds fails and says which ranks did not come.

        Examples::

            %%gpu_distributed --out model
            model = gpucell.ddp(Net())          # DistributedDataParallel
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for epoch in range(3):
                for xb, yb in gpucell.shard(loader):   # each rank its part
                    opt.zero_grad()
                    loss_fn(model(xb), yb).backward()
                    opt.step()

            %%gpu_distributed --ranks all --timeout 30
            import torch.distributed as dist
            t = torch.ones(1) * dist.get_rank()
            dist.all_reduce(t)
            print(t.item())

            %gpu_distributed           # the group: ranks, engines, hosts
            %gpu_distributed stop      # every rank leaves it, names dropped

        After a cell, ``gpucell.last_run`` records each rank's span.
        """
        from gpucell.kernel import distributed as dm

        if cell is None:
            _line_magic(line)
            return None
        req = _request(line)
        try:
            dm.run_distributed(self.shell, cell, req)
        except (DeviceSelectionError, ClusterError) as e:
            raise UsageError(f"%%gpu_distributed: {e}") from None
        return None


def _line_magic(line: str) -> None:
    """``%gpu_distributed`` (status) and ``%gpu_distributed stop``."""
    from gpucell.kernel import distributed as dm

    cmd = line.strip()
    if cmd in ("", "status"):
        print(dm.status_text())
    elif cmd == "stop":
        dm.stop_group()
    else:
        raise UsageError(
            f"%gpu_distributed {cmd!r}: expected 'status' or 'stop' (the "
            "cell magic %%gpu_distributed runs a cell)."
        )


def _request(line: str) -> Any:
    """The cell magic's line, checked, as a ``DistRequest``."""
    from gpucell.kernel import distributed as dm

    try:
        args = _parser().parse_args(shlex.split(line))
    except ValueError as e:
        raise UsageError(f"%%gpu_distributed: {e}") from None
    if args.timeout is not None and not (
        math.isfinite(args.timeout) and args.timeout > 0
    ):
        raise UsageError(
            f"%%gpu_distributed --timeout {args.timeout}: must be a number of "
            "seconds > 0."
        )
    if args.devices and args.targets:
        raise UsageError("%%gpu_distributed: give --devices or --targets, not both.")
    try:
        out = dm.parse_out(args.out)
    except ValueError as e:
        raise UsageError(f"%%gpu_distributed {e}") from None
    return dm.DistRequest(
        devices=args.devices,
        targets=args.targets,
        backend=args.backend,
        out=out,
        ranks=args.ranks,
        timeout=args.timeout,
        quiet=args.quiet,
    )
