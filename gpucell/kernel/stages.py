"""The typed values one ``%%gpu_parallel`` cell's stages hand each other.

:mod:`gpucell.kernel.execute` runs the stages: prepare (the cell's text, its
plan, the engines) -> prelude (the cell's code before the loop, in the kernel)
-> admit (the loop's items and inputs, the pre-flight checks, the plan for the
run) -> run (in the kernel, on the engines, or in the background) -> merge ->
epilogue.  Each stage takes the values the one before it made, never ``Any``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpucell.cluster.lifecycle import GpuCluster
    from gpucell.core.analysis.iterspace import Chunker
    from gpucell.core.costmodel import Advice
    from gpucell.core.provenance import LastRun
    from gpucell.kernel.keep import Keeping
    from gpucell.kernel.plans import Prepared
    from gpucell.kernel.request import CellRequest

__all__ = ["Admitted", "Cell", "Loop"]

Shell = Any  # IPython's InteractiveShell (not imported: IPython is optional here)


@dataclass(frozen=True)
class Cell:
    """What the prepare stage found: the cell's text as analysed, its
    namespace, the cluster and the engines it runs on."""

    shell: Shell
    req: CellRequest
    src: str  # the magic's line as a comment, then the transformed cell
    filename: str  # where IPython's tracebacks find the text
    gc: GpuCluster | None
    targets: tuple[int, ...]
    # names IPython put in the namespace for builtins (its `open` wrapper,
    # exit): the builtins on engines, never inputs to ship
    ipython_names: frozenset[str]

    @property
    def ns(self) -> dict[str, Any]:
        return self.shell.user_ns  # type: ignore[no-any-return]

    def kinds(self) -> set[str]:
        """The kinds of the target engines (``"gpu"``, ``"cpu"``)."""
        gc = self.gc
        return {gc.engines[e].kind for e in self.targets} if gc is not None else set()


@dataclass(frozen=True)
class Loop:
    """The loop as the prelude left it: its iterations and what it reads."""

    chunker: Chunker
    inputs: dict[str, Any]
    shapes: Any  # what its cost scales with (gpucell.core.costmodel.shape_of)
    values: tuple[Any, ...] = ()  # the iterable's parts, as evaluated


@dataclass
class Admitted:
    """A loop that passed the pre-flight checks and is ready to run, with what
    finishing it needs: merging its results, the summary, keeping (also when
    a background run finishes in a later cell)."""

    shell: Shell
    gc: GpuCluster
    prep: Prepared
    loop: Loop
    record: LastRun
    req: CellRequest
    keeping: Keeping
    kept: list[tuple[int, int]]
    advice: Advice
    cost_key: tuple[str, tuple[int, ...]]
    random_said: str = ""  # what the random warning said before the run
    programs: dict[int, Any] = field(default_factory=dict)  # each engine's code
