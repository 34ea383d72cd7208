"""A run on the engines with its live display: the dispatcher's
:class:`~gpucell.kernel.dispatch.Run`, the widget or text line, telemetry and
the Lab panel's view, opened and closed together (the foreground and the
background run share it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gpucell import config as _config

if TYPE_CHECKING:
    from gpucell.kernel.dispatch import Options
    from gpucell.kernel.stages import Admitted

__all__ = ["Watched", "run_with_display"]


def run_with_display(a: Admitted, targets: list[int], options: Options) -> list[Any]:
    """The dispatcher's run of ``a`` on ``targets``, watched by the live
    display, driven to its end."""
    watched = Watched(a, targets, options)
    try:
        watched.run.ship_inputs()
        return list(watched.run.execute())
    finally:
        watched.close()


class Watched:
    """A dispatcher's :class:`~gpucell.kernel.dispatch.Run` with its live display
    (widget or text line), its telemetry and the Lab panel's view of it.  The
    foreground drives it to its end at once; a background run step by step
    (``relay``/``echo``: where its engine output and notes go; ``display``: a
    display of its own instead of the usual one)."""

    def __init__(
        self,
        a: Admitted,
        targets: list[int],
        options: Options,
        *,
        relay: Callable[[str], None] | None = None,
        echo: Callable[[str], None] = print,
        display: Any = None,
    ) -> None:
        from gpucell.kernel import panel
        from gpucell.kernel.dispatch import Run
        from gpucell.kernel.telemetry import for_cluster
        from gpucell.ui.model import initial_snapshot
        from gpucell.ui.progress import make_progress

        shell, gc, loop, record, quiet = a.shell, a.gc, a.loop, a.record, a.req.quiet
        first = initial_snapshot([gc.engines[e] for e in targets], loop.chunker.count)
        self.tele = None if quiet else for_cluster(gc, targets)
        self.display = (
            display
            if display is not None
            else make_progress(shell, first, self.tele, quiet)
        )
        self.last = first
        self._closed = False
        panel.run_started(self.tele)
        panel.run_progress(first)
        try:
            self.run = Run(
                gc,
                targets,
                programs=a.programs,
                inputs=loop.inputs,
                n=loop.chunker.count,
                chunk_of=loop.chunker.chunk,
                options=options,
                record=record,
                echo=echo,
                progress=self.on_progress,
                telemetry=self.tele,
                relay=relay or getattr(self.display, "write_above", None),
                watch=(
                    record.plan.watched()
                    if record.plan is not None and _config.settings().check_inputs
                    else None
                ),
                kept=a.kept,
                on_chunk=a.keeping.add,
                drop_inputs=lambda name: name not in shell.user_ns,
                cache_bytes=_config.settings().engine_cache_bytes,
                namespace=shell.user_ns,
            )
        except BaseException:
            self.close()
            raise

    def on_progress(self, snap: Any) -> None:
        from gpucell.kernel import panel

        self.last = snap
        self.display.update(snap)
        panel.run_progress(snap)

    def close(self) -> None:
        """The display's final figures, the panel told, telemetry stopped (once)."""
        if self._closed:
            return
        self._closed = True
        from gpucell.kernel import panel

        try:
            self.display.close(self.last)
        finally:
            panel.run_ended(self.last)
            if self.tele is not None:
                self.tele.close()
