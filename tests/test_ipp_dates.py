"""gpucell.kernel.ippdates: ipyparallel's reply stamps read by datetime's own
ISO parser give the instants dateutil gives; anything else goes to
ipyparallel's parser as before."""

from __future__ import annotations

import warnings
from datetime import datetime, timezone

import pytest

from gpucell.kernel import ippdates


@pytest.fixture()
def installed():
    from ipyparallel import util
    from ipyparallel.client import asyncresult

    ippdates.install()
    assert util._parse_date is ippdates.parse_date
    assert asyncresult._parse_date is ippdates.parse_date
    return ippdates._original


@pytest.mark.parametrize(
    "stamp",
    [
        "2026-11-27T06:41:13.123456Z",
        "2026-11-27T06:41:13.1Z",
        "2026-11-27T06:41:13Z",
        "2026-11-27T06:41:13.123+01:00",
        "2026-11-27T06:41:13.123456-0530",
        "1999-12-31T23:59:59.999999+00:00",
    ],
)
def test_the_same_instant_as_ipyparallels_parser(installed, stamp):
    got = ippdates.parse_date(stamp)
    want = installed(stamp)
    assert isinstance(got, datetime) and got.tzinfo is not None
    assert got == want
    assert got.utcoffset() == want.utcoffset()


def test_anything_else_is_ipyparallels_own_reading(installed):
    for s in (None, "", "not a date", "2026-11-27", "2026-11-27T06:41:13+25:00"):
        assert ippdates.parse_date(s) == installed(s)
    naive = "2026-11-27T06:41:13.5"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got, want = ippdates.parse_date(naive), installed(naive)
    assert got == want and got.tzinfo is not None  # (ipyparallel adds local)


def test_install_twice_keeps_the_original(installed):
    ippdates.install()
    assert ippdates._original is installed
    assert ippdates.parse_date("2026-11-27T06:41:13Z") == datetime(
        2026, 11, 27, 6, 41, 13, tzinfo=timezone.utc
    )
