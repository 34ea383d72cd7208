"""The magics' options checked before anything runs.

Every bad value is a ``UsageError`` that names the option, the value, the
limit and what to write instead; the namespace and the cluster are left as
they were (nothing is started, no prelude runs).  The limits:

* numbers: ``--timeout`` of a cell more than 0 and at most 30 days, of a start
  or connect at most a day; ``--retries`` 0 to 100; ``--chunksize`` 1 to 10⁹;
  ``--seed`` 0 to 2³²−1 (what ``numpy.random.seed`` takes); ``--nodes`` 1 to
  1024, ``--gpus-per-node`` 1 to 64; ``-n``, ``--per-gpu`` and
  ``--cpu-engines`` at most :func:`gpucell.core.topology.engine_limit` engines
  in all (4 per core, 1024 at most, unless there are more GPUs);
* ids and indices (``--devices``, ``--targets``, ``--gpus``, ``select``): ASCII
  digits (``int('٣')`` is 3: an Arabic-Indic digit would silently pick GPU 3);
* names (``--profile``, ``--cluster-id``): at most :data:`MAX_NAME` characters,
  no ``/``; paths (``--file``, ``--ssh-key``, ``--checkpoint``...): each part at
  most 255 bytes, the whole at most 4095, and a ``~user`` that exists;
* the magic line itself: balanced quotes;
* a ``%%gpu_parallel`` cell: no IPython syntax (``x = !cmd``, ``%magic``) in the
  loop's body, which runs on engines that have no IPython shell.
"""

from __future__ import annotations

import ast
import math
import os
import re
import shlex
from typing import Any

from IPython.core.error import UsageError

__all__ = [
    "MAX_CELL_TIMEOUT",
    "MAX_CHUNKSIZE",
    "MAX_NAME",
    "MAX_RETRIES",
    "MAX_SEED",
    "MAX_START_TIMEOUT",
    "check_ids",
    "check_int",
    "check_name",
    "check_path",
    "check_seconds",
    "path_problem",
    "refuse_ipython_syntax_in_loop",
    "shorten",
    "split_line",
]

MAX_CELL_TIMEOUT = 30 * 86400.0
MAX_START_TIMEOUT = 86400.0
MAX_RETRIES = 100
MAX_CHUNKSIZE = 10**9
MAX_SEED = 2**32 - 1
MAX_NODES = 1024
MAX_GPUS_PER_NODE = 64
MAX_NAME = 200
#: the longest file name part and path Linux file systems take (bytes)
NAME_MAX = 255
PATH_MAX = 4095

_ASCII_INT = re.compile(r"[0-9]+")


def split_line(magic: str, line: str) -> list[str]:
    """The magic line's words (shell quoting), or a ``UsageError`` for an
    unbalanced quote."""
    try:
        return shlex.split(line)
    except ValueError as e:
        raise UsageError(
            f"{magic}: the line cannot be read ({e}: a quote is not closed). "
            "Close the quote, or escape it with a backslash (\\'). Nothing ran."
        ) from None


def check_int(
    magic: str, option: str, value: int | None, lo: int, hi: int, why: str = ""
) -> None:
    """``value`` (when given) within ``lo..hi``."""
    if value is None or lo <= value <= hi:
        return
    raise UsageError(
        f"{magic} {option} {value}: must be {lo:,} or more and at most {hi:,}"
        + (f" ({why})" if why else "")
        + f"; pass {option} N with N in that range. Nothing ran."
    )


def check_seconds(magic: str, option: str, value: float | None, hi: float) -> None:
    """``value`` (when given) a finite number of seconds, more than 0, at most
    ``hi``."""
    if value is None or (math.isfinite(value) and 0 < value <= hi):
        return
    days = hi / 86400
    raise UsageError(
        f"{magic} {option} {value:g}: must be a number of seconds more than 0 "
        f"and at most {hi:,.0f} ({days:g} day{'s' if days != 1 else ''}); leave "
        "it out for the default. Nothing ran."
    )


def check_ids(
    magic: str, option: str, spec: str | None, words: tuple[str, ...] = ()
) -> None:
    """``spec`` (when given) comma-separated ASCII integers (or one of
    ``words``, like ``cpu`` or ``all``)."""
    if spec is None or (not spec.strip() and "all" in words):
        return  # --gpus '' is all GPUs
    tokens = [t.strip() for t in spec.split(",")]
    bad = [t for t in tokens if t and not _ASCII_INT.fullmatch(t)]
    bad = [t for t in bad if t.lower() not in words]
    if bad or not any(tokens):
        what = repr(bad[0]) if bad else "nothing"
        extra = "".join(f" or '{w}'" for w in words)
        raise UsageError(
            f"{magic} {option} {shorten(spec)}: {what} is not a number written "
            f"with the digits 0-9; write indices like '0,1'{extra}. Nothing ran."
        )


def check_name(magic: str, option: str, value: str | None) -> None:
    """``value`` (when given) a usable name: a file name part, not a path."""
    if value is None:
        return
    if not value or len(value) > MAX_NAME or "/" in value or "\0" in value:
        raise UsageError(
            f"{magic} {option} {shorten(value)}: a name of 1 to {MAX_NAME} "
            f"characters without '/' is expected ({len(value):,} given). "
            "Pass a short name. Nothing ran."
        )


def check_path(magic: str, option: str, value: str | None) -> None:
    """``value`` (when given) a path this host can name: a ``~user`` that
    exists, parts at most 255 bytes, at most 4095 in all."""
    if value is None:
        return
    problem = path_problem(value)
    if problem:
        raise UsageError(f"{magic} {option} {shorten(value)}: {problem} Nothing ran.")


def path_problem(value: str) -> str | None:
    """Why ``value`` cannot name a file here (with the fix), or ``None``."""
    if not value or "\0" in value:
        return "an empty path, or one with a NUL character. Name a folder or file."
    if value.startswith("~"):
        user = value[1:].split("/", 1)[0]
        if user and os.path.expanduser(f"~{user}") == f"~{user}":
            return (
                f"there is no user {user!r} on this host (a path starting with "
                f"~name is that user's home folder). Write the path out, or "
                f"start it with ~/ for your own home."
            )
    path = os.path.expanduser(value)
    raw = os.fsencode(path)
    longest = max((len(p) for p in raw.split(b"/")), default=0)
    if longest > NAME_MAX:
        return (
            f"a name in it is {longest:,} bytes long; file systems take "
            f"{NAME_MAX}. Use shorter names."
        )
    if len(raw) > PATH_MAX:
        return (
            f"the path is {len(raw):,} bytes long; at most {PATH_MAX} are "
            "taken. Use a shorter path."
        )
    return None


def shorten(value: str, keep: int = 60) -> str:
    """``value`` for a message: quoted, cut in the middle when long."""
    if len(value) <= keep:
        return repr(value)
    return repr(value[: keep // 2] + "…" + value[-keep // 4 :])


_IPYTHON_SYNTAX = {
    "getoutput": "a shell command (`x = !cmd`)",
    "system": "a shell command (`!cmd`)",
    "run_line_magic": "a line magic (`%magic`)",
    "run_cell_magic": "a cell magic",
}


def refuse_ipython_syntax_in_loop(shell: Any, cell: str) -> None:
    """A ``UsageError`` naming the first line of the loop's body that is
    IPython syntax (``!cmd``, ``x = !cmd``, ``%magic``) or calls
    ``get_ipython()``: the body runs on engines, which have no IPython shell
    (it failed there with a ``NameError`` from inside gpucell).  Lines before
    and after the loop run in the kernel and are left alone."""
    from gpucell.core.analysis.split import split_cell

    try:
        module = ast.parse(shell.transform_cell(cell))
        loop = split_cell(module).loop
    except Exception:  # a syntax error: the cell's run reports it
        return
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return  # a comprehension holds no statement: no `!` or `%` line
    lines = cell.splitlines()
    for stmt in loop.body:
        for node in ast.walk(stmt):
            if not (isinstance(node, ast.Call) and _calls_get_ipython(node)):
                continue
            # the editor's line: the magic's own line is line 1
            text = lines[node.lineno - 1].strip() if node.lineno <= len(lines) else ""
            attr = node.func.attr if isinstance(node.func, ast.Attribute) else ""
            what = _IPYTHON_SYNTAX.get(attr, "a call of get_ipython()")
            raise UsageError(
                f"%%gpu_parallel: line {node.lineno + 1} (`{text}`) is {what} "
                "in the loop's body, which runs on the engines, and they have no "
                "IPython shell. Run it before the loop and keep what it gives in "
                "a variable the loop reads, or use the standard library in the "
                "loop (`subprocess.run([...], capture_output=True, text=True)` "
                "for a shell command). Nothing ran."
            )


def _calls_get_ipython(node: ast.Call) -> bool:
    """``get_ipython()`` or ``get_ipython().anything(...)``."""
    f = node.func
    if isinstance(f, ast.Name):
        return f.id == "get_ipython"
    return (
        isinstance(f, ast.Attribute)
        and isinstance(f.value, ast.Call)
        and isinstance(f.value.func, ast.Name)
        and f.value.func.id == "get_ipython"
    )
