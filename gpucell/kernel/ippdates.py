"""ipyparallel's client parses each reply's ``started`` stamp with dateutil
(about 33 us, on the client's IO thread, for every chunk); ``datetime``'s own
ISO parser reads the same stamps in 0.2 us.  :func:`install` puts a parser in
its place that gives the same instants and hands anything else (a naive stamp,
a form ``fromisoformat`` does not read) to ipyparallel's own."""

from __future__ import annotations

from datetime import datetime
from typing import Any

__all__ = ["install", "parse_date"]

_original: Any = None


def parse_date(s: Any) -> Any:
    """ipyparallel's ``util._parse_date``: the same instant for an ISO 8601
    stamp with its zone; anything else as ipyparallel reads it."""
    if type(s) is str and len(s) >= 20 and s[10] == "T":
        try:
            dt = datetime.fromisoformat(s)
        except ValueError:
            pass
        else:
            if dt.tzinfo is not None:
                return dt
    return _original(s)


def install() -> None:
    """Once per process; a no-op where ipyparallel has no such function."""
    global _original
    try:
        from ipyparallel import util
        from ipyparallel.client import asyncresult
    except ImportError:  # pragma: no cover - ipyparallel is a dependency
        return
    current = getattr(util, "_parse_date", None)
    if current is None or current is parse_date:
        return
    _original = current
    util._parse_date = parse_date
    # (AsyncResult.metadata parses the stamps it reads with its own copy)
    if getattr(asyncresult, "_parse_date", None) is current:
        asyncresult._parse_date = parse_date
