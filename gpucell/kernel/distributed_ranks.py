"""Each rank of a ``%%gpu_distributed`` cell as the kernel follows it (its
task, its report), and what went wrong in words: which rank failed first,
where, and what the other ranks were doing."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gpucell.core.provenance import ChunkRecord
from gpucell.errors import RankFailed
from gpucell.kernel.distributed_group import Group, remote_message

__all__ = ["Rank", "died", "fail", "record_ranks", "take"]


@dataclass
class Rank:
    rank: int
    engine: int
    ar: Any
    report: dict[str, Any] | None = None
    values: dict[str, Any] = field(default_factory=dict)
    signalled: float | None = None  # first SIGINT
    last_signal: float | None = None


def take(rk: Rank) -> None:
    """A finished rank's report and values (or the error its task raised)."""
    from gpucell.protocol import wire

    try:
        got = wire.loads(rk.ar.get(0))
        rk.report, rk.values = got["report"], got["values"]
    except Exception as e:  # the task itself failed (not the cell)
        rk.report = {
            "status": "error",
            "kind": "engine",
            "type": getattr(e, "ename", None) or type(e).__name__,
            "message": remote_message(e),
            "traceback": "".join(getattr(e, "traceback", None) or ""),
        }


def died(rk: Rank, info: Any) -> dict[str, Any]:
    return {
        "status": "error",
        "kind": "died",
        "type": "EngineDied",
        "host": getattr(info, "host", "?"),
        "message": f"engine {rk.engine} died (its process ended)",
    }


def record_ranks(record: Any, gc: Any, ranks: list[Rank]) -> None:
    """One chunk record per rank (its engine's wall-clock span)."""
    for rk in ranks:
        rep = rk.report or {}
        info = gc.engines.get(rk.engine)
        t_start = float(rep.get("t_start") or 0.0)
        t_end = float(rep.get("t_end") or rep.get("t_error") or t_start)
        kind = rep.get("kind")
        if rep.get("status") == "ok":
            state = "done"
        elif kind == "died":
            state = "lost"
        elif kind in ("interrupt", "peer", "stuck"):
            state = "cancelled"  # stopped because another rank failed
        else:
            state = "failed"
        record.add_chunk(
            ChunkRecord(
                start=rk.rank,
                stop=rk.rank + 1,
                engine=rk.engine,
                host=str(rep.get("host") or getattr(info, "host", "?")),
                device=getattr(info, "device", "?"),
                t_start=t_start,
                t_end=t_end,
                compute=max(0.0, t_end - t_start),
                attempt=0,
                state=state,  # type: ignore[arg-type]
            )
        )


#: how telling each kind of failure is: the first of the lowest is the cause
_CAUSE = {"user": 0, "out": 0, "engine": 1, "died": 1, "timeout": 2, "nogroup": 3}


def fail(
    gc: Any,
    g: Group,
    ranks: list[Rank],
    status: str,
    record: Any,
    filename: str,
) -> None:
    """Raise the error that names what went wrong, and on which rank."""
    for rk in ranks:
        rep = rk.report or {}
        if rep.get("status") == "nogroup":
            rep.setdefault("kind", "nogroup")
    if status == "interrupted":
        g.broken = "the last cell was interrupted"
        record.errors.append("interrupted")
        raise KeyboardInterrupt(
            "gpucell: interrupted; every rank stopped and nothing in the notebook "
            "changed. The next %%gpu_distributed cell re-forms the process group."
        )
    bad = [rk for rk in ranks if (rk.report or {}).get("status") != "ok"]
    bad.sort(
        key=lambda rk: (
            _CAUSE.get((rk.report or {}).get("kind", ""), 4),
            (rk.report or {}).get("t_error", 0.0),
            rk.rank,
        )
    )
    cause = bad[0]
    rep = cause.report or {}
    g.broken = f"rank {cause.rank} failed in the last cell"
    info = gc.engines.get(cause.engine)
    host = rep.get("host") or getattr(info, "host", "?")
    where = f"rank {cause.rank} (engine {cause.engine} on {host})"
    kind = rep.get("kind")
    line = rep.get("line")
    src_line = _line_text(filename, line)
    at = f" at line {line}" + (f": `{src_line}`" if src_line else "") if line else ""
    if kind == "timeout":
        waited = rep.get("timeout") or g.timeout
        what = rep.get("collective") or "a collective"
        others = _absent(ranks, cause)
        head = (
            f"gpucell: {where} waited {waited:g} s (--timeout) in {what}{at} and "
            f"gave up: {others}. Every rank must call each collective, in the "
            "same order (a rank that skips an all_reduce leaves the others "
            "waiting)."
        )
    elif kind == "died":
        head = f"gpucell: {where} died while running the cell."
    elif kind == "nogroup":
        head = (
            f"gpucell: {where} had no process group"
            + (f" ({rep['why']})" if rep.get("why") else "")
            + "."
        )
    else:
        head = f"gpucell: {where} raised {rep.get('type', 'an error')}{at}."
    msg = [head]
    if kind in ("user", "timeout", "engine", "out") and rep.get("traceback"):
        msg.append(_indent(rep["traceback"].rstrip()))
    elif rep.get("message") and kind not in ("died",):
        msg.append(_indent(f"{rep.get('type', 'Error')}: {rep['message']}"))
    if rep.get("tail"):
        msg.append(f"  its last output lines:\n{_indent(''.join(rep['tail']), 4)}")
    stopped = [_stopped(rk) for rk in ranks if rk is not cause]
    if stopped:
        msg.append("The other ranks: " + "; ".join(stopped) + ".")
    msg.append(
        "The process group is broken: the next %%gpu_distributed cell re-forms "
        "it. Nothing in the notebook changed."
    )
    record.errors.append(head)
    raise RankFailed("\n".join(msg))


def _line_text(filename: str, line: int | None) -> str:
    """The cell's line ``line`` (the kernel cached the cell's text)."""
    if not line:
        return ""
    import linecache

    return linecache.getline(filename, line).strip()


def _absent(ranks: list[Rank], cause: Rank) -> str:
    """Which ranks did not come to the collective ``cause`` waited in."""
    waiting = {
        rk.rank
        for rk in ranks
        if (rk.report or {}).get("kind") == "timeout"
        and (rk.report or {}).get("line") == (cause.report or {}).get("line")
    }
    parts = []
    for rk in ranks:
        if rk.rank in waiting:
            continue
        rep = rk.report or {}
        if rep.get("status") == "ok":
            parts.append(f"rank {rk.rank} never called it (it finished the cell)")
        elif rep.get("kind") == "timeout":
            parts.append(
                f"rank {rk.rank} was waiting elsewhere (line {rep.get('line')}, "
                f"{rep.get('collective') or 'a collective'})"
            )
        else:
            parts.append(f"rank {rk.rank} did not arrive ({_stopped(rk)})")
    return "; ".join(parts) or "no other rank arrived"


def _stopped(rk: Rank) -> str:
    rep = rk.report or {}
    kind = rep.get("kind")
    where = f" at line {rep['line']}" if rep.get("line") else ""
    if rep.get("status") == "ok":
        return f"rank {rk.rank} finished the cell"
    if kind == "peer":
        what = rep.get("collective") or "a collective"
        return f"rank {rk.rank} stopped in {what}{where} (its peer left the group)"
    if kind == "interrupt":
        return f"rank {rk.rank} was interrupted{where}"
    if kind == "stuck":
        return (
            f"rank {rk.rank} (engine {rk.engine}) did not stop: it may stay busy "
            "(`%gpu_cluster stop` ends it)"
        )
    if kind == "died":
        return f"rank {rk.rank} died"
    if kind == "timeout":
        return f"rank {rk.rank} also timed out{where}"
    return f"rank {rk.rank} raised {rep.get('type', 'an error')}{where}"


def _indent(text: str, n: int = 2) -> str:
    pad = " " * n
    return "\n".join(pad + ln if ln else ln for ln in text.splitlines())
