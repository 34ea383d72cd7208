"""The messages between the kernel and the JupyterLab panel (one Jupyter comm).

Defined here once for Python and once in ``gpucell/labextension/src/api.ts``;
both sides check themselves against ``tests/fixtures/panel_v1.json`` (pytest and
jest), so the two definitions cannot drift apart unseen.

The comm's target is :data:`TARGET`.  Either side may open it: the panel opens
it when it attaches to a kernel (``%load_ext gpucell`` registered the target,
else the kernel closes it at once and the panel shows a hint), and the kernel
opens it when gpucell is loaded after the panel attached.  Every message is a
JSON object with ``"v": 1`` and a ``"type"``.

Kernel -> panel::

    {"v": 1, "type": "state", "seq": 7,        # seq grows with every state sent
     "status": "gpucell: 4 GPUs · 2 hosts · 63% busy",   # the status-bar text
     "cluster": null | {
        "connection": {"kind": "local" | "ssh" | "slurm" | "connected",
                       "text": "4 engines on node1, node2 (profile gpucell)",
                       "profile": "gpucell" | null, "hosts": ["node1", "node2"]},
        "selected": [0, 2] | null,              # null: every engine
        "devices": [{"engine": 0, "host": "node1", "label": "0 · node1 · GPU 0",
                     "state": "idle" | "busy" | "retrying" | "restarting"
                              | "dead" | "done" | "stopped",   # DEVICE_STATES
                     "color": "#2e7d32", "selected": true,
                     "util": 0.63 | null, "util_text": "63%",    # fraction 0-1
                     "mem": 0.25 | null, "mem_text": "2.0 / 8.0 GiB",
                     "extra": "301 W · 61 °C", "note": "", "done_text": "12"}]},
     "run": null | {"total": 64, "done": 12, "elapsed": 3.2, "eta": 13.9 | null,
                    "status": "running" | "ok" | "error" | "timeout"
                              | "interrupted",
                    "text": "12/64 · 0:03 · ETA 0:14"},
     "last": null | {"id": 3, "status": "ok", "lines": ["..."],
                     "timeline_svg": "<svg ...>" | null},
     # optional (a kernel before the charts sends none): the charts over time
     "history": null | {"window": 300.0, "period": 1.0,   # seconds kept, between points
                        "devices": [{"engine": 0,
                                     "age": [-2.0, -1.0, 0.0],  # s before the last one
                                     "util": [12.5, null, 97.0],   # percent 0-100
                                     "mem": [25.0, 25.0, 30.1]}]},  # percent 0-100
     # optional (a kernel before --background sends none): background runs
     "background": null | {
        "pending": [{"cell": 5, "state": "running" | "finished" | "failed",
                     "done": 37, "total": 120, "elapsed": 12.3,
                     "started_at": 1795000000.0,       # epoch seconds
                     "writes": ["out", "total"],       # a later cell using one waits
                     "text": "cell [5]: 37 of 120 iterations (30%), 12.3 s, running",
                     "note": ""}],                      # why it waits, if it ended
        "recent": [{"cell": 4, "outcome": "merged" | "failed" | "cancelled",
                    "error": "ValueError: bad row" | null,   # first line
                    "text": "cell [4]: merged (120 of 120 iterations, 40.1 s)"}]}}

    {"v": 1, "type": "reply", "request": "select" | "start" | "stop" | "cancel",
     "ok": true, "text": "later cells run on engines [1]"}

Panel -> kernel::

    {"v": 1, "type": "hello"}                     # send me the whole state now
    {"v": 1, "type": "select", "engines": [1] | null}    # null: every engine
    {"v": 1, "type": "start", "args": "-n 2 --gpus none"}  # %gpu_cluster start ARGS
    {"v": 1, "type": "stop"}
    {"v": 1, "type": "cancel", "cell": 5}    # gpucell.runs.cell(5).cancel()

Pure: no I/O, no Jupyter imports.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = [
    "DEVICE_STATES",
    "REQUESTS",
    "TARGET",
    "VERSION",
    "hello",
    "reply",
    "validate",
]

#: the comm target both sides register
TARGET = "gpucell.panel"
#: the schema version every message carries as ``"v"``
VERSION = 1
#: what the panel may ask the kernel to do
REQUESTS = ("select", "start", "stop", "cancel")
#: what a device's row may say: an engine's state, or how the last run left it;
#: ``restarting``: its engine died and a new one is being started on the device
#: (the row goes on under the new engine's id), ``dead``: nothing restarts it
DEVICE_STATES = (
    "idle",
    "busy",
    "retrying",
    "restarting",
    "dead",
    "done",
    "stopped",
)

_NUM = (int, float)


def _is_num(x: Any) -> bool:
    return isinstance(x, _NUM) and not isinstance(x, bool)


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


# field -> (check, what it must be); "?" after a check's name: may be null
_Check = tuple[Any, str]
_STR: _Check = (lambda x: isinstance(x, str), "a string")
_BOOL: _Check = (lambda x: isinstance(x, bool), "true or false")
_INT: _Check = (_is_int, "an integer")
_NUMBER: _Check = (_is_num, "a number")
_FRACTION: _Check = (lambda x: _is_num(x) and 0.0 <= x <= 1.0, "a number in [0, 1]")
_INTS: _Check = (
    lambda x: isinstance(x, list) and all(_is_int(i) for i in x),
    "a list of integers",
)
_STRS: _Check = (
    lambda x: isinstance(x, list) and all(isinstance(i, str) for i in x),
    "a list of strings",
)


def _nullable(c: _Check) -> _Check:
    return (lambda x: x is None or c[0](x), c[1] + " or null")


def _one_of(*values: str) -> _Check:
    return (lambda x: x in values, "one of " + ", ".join(map(repr, values)))


_CONNECTION: dict[str, _Check] = {
    "kind": _one_of("local", "ssh", "slurm", "connected"),
    "text": _STR,
    "profile": _nullable(_STR),
    "hosts": _STRS,
}
_DEVICE: dict[str, _Check] = {
    "engine": _INT,
    "host": _STR,
    "label": _STR,
    "state": _one_of(*DEVICE_STATES),
    "color": _STR,
    "selected": _BOOL,
    "util": _nullable(_FRACTION),
    "util_text": _STR,
    "mem": _nullable(_FRACTION),
    "mem_text": _STR,
    "extra": _STR,
    "note": _STR,
    "done_text": _STR,
}
_RUN: dict[str, _Check] = {
    "total": _INT,
    "done": _INT,
    "elapsed": _NUMBER,
    "eta": _nullable(_NUMBER),
    "status": _one_of("running", "ok", "error", "timeout", "interrupted"),
    "text": _STR,
}
_LAST: dict[str, _Check] = {
    "id": _INT,
    "status": _STR,
    "lines": _STRS,
    "timeline_svg": _nullable(_STR),
}


_PERCENTS: _Check = (
    lambda x: (
        isinstance(x, list)
        and all(i is None or (_is_num(i) and 0.0 <= i <= 100.0) for i in x)
    ),
    "a list of numbers in [0, 100] or nulls",
)
_HISTORY_DEVICE: dict[str, _Check] = {
    "engine": _INT,
    "age": (
        lambda x: isinstance(x, list) and all(_is_num(i) and i <= 0 for i in x),
        "a list of numbers <= 0",
    ),
    "util": _PERCENTS,
    "mem": _PERCENTS,
}


_BACKGROUND_PENDING: dict[str, _Check] = {
    "cell": _INT,
    "state": _STR,
    "done": _INT,
    "total": _INT,
    "elapsed": _NUMBER,
    "started_at": _NUMBER,
    "writes": _STRS,
    "text": _STR,
    "note": _STR,
}
_BACKGROUND_RECENT: dict[str, _Check] = {
    "cell": _INT,
    "outcome": _one_of("merged", "failed", "cancelled"),
    "error": _nullable(_STR),
    "text": _STR,
}


def _fields(obj: Any, spec: Mapping[str, _Check], where: str) -> list[str]:
    if not isinstance(obj, Mapping):
        return [f"{where} must be an object"]
    problems = []
    for key, (ok, what) in spec.items():
        if key not in obj:
            problems.append(f"{where}.{key} is missing")
        elif not ok(obj[key]):
            problems.append(f"{where}.{key} must be {what}, not {obj[key]!r}")
    return problems


def _cluster(c: Any) -> list[str]:
    problems = _fields(
        c,
        {
            "connection": (lambda x: isinstance(x, Mapping), "an object"),
            "selected": _nullable(_INTS),
            "devices": (lambda x: isinstance(x, list), "a list"),
        },
        "cluster",
    )
    if problems:
        return problems
    problems += _fields(c["connection"], _CONNECTION, "cluster.connection")
    for i, d in enumerate(c["devices"]):
        problems += _fields(d, _DEVICE, f"cluster.devices[{i}]")
    return problems


def _history(h: Any) -> list[str]:
    positive: _Check = (lambda x: _is_num(x) and x > 0, "a number > 0")
    problems = _fields(
        h,
        {
            "window": positive,
            "period": positive,
            "devices": (lambda x: isinstance(x, list), "a list"),
        },
        "history",
    )
    if problems:
        return problems
    for i, d in enumerate(h["devices"]):
        where = f"history.devices[{i}]"
        found = _fields(d, _HISTORY_DEVICE, where)
        if not found and not len(d["age"]) == len(d["util"]) == len(d["mem"]):
            found = [f"{where}: age, util and mem must be as long as each other"]
        problems += found
    return problems


def _background(b: Any) -> list[str]:
    lists: _Check = (lambda x: isinstance(x, list), "a list")
    problems = _fields(b, {"pending": lists, "recent": lists}, "background")
    if problems:
        return problems
    for key, spec in (("pending", _BACKGROUND_PENDING), ("recent", _BACKGROUND_RECENT)):
        for i, r in enumerate(b[key]):
            problems += _fields(r, spec, f"background.{key}[{i}]")
    return problems


def validate(msg: Any) -> list[str]:
    """What is wrong with ``msg`` as a panel message (``[]``: nothing).

    Unknown extra keys are allowed (a newer kernel may add some); missing keys,
    wrong types, another version or an unknown type are not.
    """
    if not isinstance(msg, Mapping):
        return ["a message must be a JSON object"]
    if not _is_int(msg.get("v")) or msg.get("v") != VERSION:
        return [f"v must be {VERSION}, not {msg.get('v')!r}"]
    kind = msg.get("type")
    if kind == "state":
        problems = _fields(
            msg,
            {
                "seq": _INT,
                "status": _STR,
                "cluster": (lambda x: x is None or isinstance(x, Mapping), "an object"),
                "run": (lambda x: x is None or isinstance(x, Mapping), "an object"),
                "last": (lambda x: x is None or isinstance(x, Mapping), "an object"),
            },
            "state",
        )
        if problems:
            return problems
        if msg["cluster"] is not None:
            problems += _cluster(msg["cluster"])
        if msg["run"] is not None:
            problems += _fields(msg["run"], _RUN, "run")
        if msg["last"] is not None:
            problems += _fields(msg["last"], _LAST, "last")
        if msg.get("history") is not None:
            problems += _history(msg["history"])
        if msg.get("background") is not None:
            problems += _background(msg["background"])
        return problems
    if kind == "reply":
        return _fields(
            msg,
            {"request": _one_of(*REQUESTS), "ok": _BOOL, "text": _STR},
            "reply",
        )
    if kind == "hello":
        return []
    if kind == "select":
        return _fields(msg, {"engines": _nullable(_INTS)}, "select")
    if kind == "start":
        return _fields(msg, {"args": _STR}, "start")
    if kind == "stop":
        return []
    if kind == "cancel":
        return _fields(msg, {"cell": _INT}, "cancel")
    known = "state, reply, hello, select, start, stop, cancel"
    return [f"type must be one of {known}, not {kind!r}"]


def hello() -> dict[str, Any]:
    return {"v": VERSION, "type": "hello"}


def reply(request: str, ok: bool, text: str) -> dict[str, Any]:
    return {"v": VERSION, "type": "reply", "request": request, "ok": ok, "text": text}
