"""How chunk tasks travel: a first wave as one message to several engines, and
whether a loop's chunks are small enough on the wire to send twice (trials)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gpucell.kernel import ippdates
from gpucell.protocol import wire
from gpucell.protocol.conversation import ChunkTask

__all__ = ["WAVE_BYTES", "cheap_to_resend", "one_message", "plain", "send_wave"]

ippdates.install()  # every chunk's reply passes the client's date parser

#: a first wave of chunks goes as one message to every engine only while all of
#: them together are this small (each engine receives every engine's part)
WAVE_BYTES = 256 << 10

#: trial chunks send an engine its whole part, and what it did not reach is sent
#: again: only where a loop's chunk objects are this small in all
RESEND_BYTES = 1 << 20

#: one outgoing chunk: (chunk, its task, whether its round trip is timed)
Outgoing = tuple[Any, ChunkTask, bool]


def cheap_to_resend(chunk_of: Callable[[int, int], Any], n: int) -> bool:
    """The whole loop's chunk objects would be small on the wire (a range of any
    length, or a short list of small items): estimated from what its 9th to 16th
    iterations add to a chunk of its first 8."""
    if n <= 0:
        return False
    small, large = max(1, min(n, 16) // 2), min(n, 16)
    try:
        at_small, at_large = (
            wire.frames_nbytes(wire.dumps(chunk_of(0, m))) for m in (small, large)
        )
    except Exception:
        return False
    per_item = max(0, at_large - at_small) / max(1, large - small)
    return at_small + per_item * n <= RESEND_BYTES


def one_message(outgoing: list[Outgoing]) -> list[Outgoing]:
    """The leading chunks of ``outgoing`` that can travel as one message: one per
    engine, two or more, and small together (chunk, inputs and program); empty
    when they cannot (then each goes alone, in order)."""
    wave: list[Outgoing] = []
    engines: set[int] = set()
    total = 0
    for item in outgoing:
        c, args = item[0], item[1]
        if c.engine in engines:
            break
        total += wire.frames_nbytes(args.chunk_frames)
        total += wire.frames_nbytes(args.input_frames or [])
        if args.setup is not None:
            total += len(str(args.setup.get("program", "")))
        engines.add(c.engine)
        wave.append(item)
    return wave if len(wave) > 1 and total <= WAVE_BYTES else []


def plain(args: ChunkTask) -> tuple[Any, ...]:
    """``worker.run``'s arguments as a plain tuple with frames as bytes: inside
    the one message they are pickled (on engines that need not import this
    module), and pickle takes no memoryview."""

    def flat(frames: Any) -> Any:
        if frames is None:
            return None
        return [f if isinstance(f, bytes) else bytes(memoryview(f)) for f in frames]

    return tuple(
        args._replace(
            chunk_frames=flat(args.chunk_frames), input_frames=flat(args.input_frames)
        )
    )


def send_wave(client: Any, wave: list[Outgoing]) -> list[tuple[Any, Any, bool]]:
    """Several engines' chunks as one task (``worker.run_each``): ipyparallel
    serialises its arguments once and sends them to each engine, where 16
    ``apply_async`` calls, each pickling its own, kept the kernel busy 7-9 ms
    (25 ms while the first engines already ran) and the last engine waiting.
    Each engine's reply is its own AsyncResult (``AsyncResult.split``, in
    target order), as if sent alone."""
    from gpucell.engine import worker

    eids = [c.engine for c, _args, _timed in wave]
    table = {c.engine: plain(args) for c, args, _timed in wave}
    big = client.direct_view(eids).apply_async(worker.RUN_EACH, table)
    return [
        (c, ar, timed) for (c, _args, timed), ar in zip(wave, big.split(), strict=True)
    ]
