"""A logger configured in a loop's body is process-wide state
(``core/loggerconfig.py``): loggers travel by name, so an engine would change
its own and the notebook's would stay as it was.  Refused before the loop
runs, naming the line, with the rewrite (configure loggers before the loop);
a logger only used, or an object that is not one, is left alone."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from gpucell.core.lastitem import process_state_calls
from gpucell.core.loggerconfig import logger_message

APP = [logging.getLogger(f"test_logger_configuration.{n}") for n in ("db", "net")]

NS: dict[str, Any] = {
    "logging": logging,
    "app_loggers": APP,
    "by_name": {"db": APP[0]},
    "widgets": [type("Widget", (), {})()],
}


def _resolve(name: str) -> Any:
    root, *rest = name.split(".")
    obj = NS.get(root)
    for part in rest:
        obj = getattr(obj, part, None)
    return obj


@pytest.mark.parametrize(
    "body, found",
    [
        ("for lg in app_loggers:\n    lg.setLevel(logging.WARNING)\n", "lg.setLevel"),
        ("for lg in app_loggers:\n    lg.disabled = True\n", "lg.disabled = ..."),
        ("for k, lg in by_name.items():\n    lg.propagate = False\n", "lg.propagate"),
        (
            "for k in by_name:\n    by_name[k].addFilter(print)\n",
            "by_name[k].addFilter",
        ),
        (
            "for i in range(3):\n    logging.getLogger(f'x{i}').setLevel(10)\n",
            "logging.getLogger(f'x{i}').setLevel",
        ),
        (
            "for i in range(3):\n    lg = logging.getLogger(str(i))\n"
            "    lg.handlers.clear()\n",
            "lg.handlers.clear",
        ),
        ("for i in range(3):\n    logging.root.handlers[:] = []\n", "handlers[...]"),
        (
            "for lg in logging.root.manager.loggerDict.values():\n"
            "    lg.removeHandler(h)\n",
            "lg.removeHandler",
        ),
    ],
)
def test_a_logger_configured_in_the_body_is_process_state(
    body: str, found: str
) -> None:
    [(line, call)] = process_state_calls(body, 1, _resolve)
    assert found in call and line >= 2
    message = logger_message(line, call)
    assert message is not None and f"line {line}" in message
    assert "Configure the loggers before the loop" in message


@pytest.mark.parametrize(
    "body",
    [
        "for lg in app_loggers:\n    lg.info('x')\n",
        "for w in widgets:\n    w.disabled = True\n    w.level = 3\n",
        "for i in range(3):\n    h = logging.StreamHandler()\n    h.setLevel(10)\n",
    ],
)
def test_a_logger_used_or_another_object_is_not(body: str) -> None:
    assert process_state_calls(body, 1, _resolve) == []


def test_the_analysis_alone_refuses_only_what_the_source_shows() -> None:
    """Without the notebook's names a receiver's kind is unknown: only a
    ``getLogger(...)`` (or a name bound to one) is surely a logger."""
    assert process_state_calls("for lg in app_loggers:\n    lg.setLevel(10)\n", 1) == []
    src = "for i in range(2):\n    logging.getLogger('a').addHandler(h)\n"
    assert process_state_calls(src, 1) == [(2, "logging.getLogger('a').addHandler")]
    assert logger_message(1, "os.chdir") is None
