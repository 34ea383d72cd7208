"""``GpuCell.encrypt`` / ``%gpu_cluster start --no-encrypt`` (issue 29): a
cluster whose heavy traffic to other hosts should not pay CurveZMQ's per-byte
cost starts without it, runs cells, and ``status`` says ``encrypted: no``.
Encrypted stays the default (tests/test_security_local_users.py,
tests/test_ssh_curve.py probe it)."""

from __future__ import annotations

import pytest

import gpucell
import gpucell.cluster.lifecycle as gc_mod
from gpucell import config
from gpucell.kernel.magics import _build_parsers

pytestmark = pytest.mark.cluster


def test_a_cluster_started_with_encryption_off_runs_and_says_so(
    ip, no_active_cluster, monkeypatch, capsys
):
    monkeypatch.setattr(config.settings(), "encrypt", False)
    gc = gpucell.start_cluster(1, gpus="none")
    assert not gc.client.curve_serverkey
    assert "--IPController.enable_curve=True" not in gc.cluster.controller_args
    ip.run_cell_magic(
        "gpu_parallel", "--quiet", "sq = []\nfor i in range(6):\n    sq.append(i * i)\n"
    )
    assert ip.user_ns["sq"] == [i * i for i in range(6)]
    capsys.readouterr()
    ip.run_line_magic("gpu_cluster", "status")
    assert "gpucell: encrypted: no (" in capsys.readouterr().out
    gpucell.stop()
    assert gc_mod.current_or_none() is None


def test_encrypted_is_the_default_and_status_is_quiet_about_it(ip, cluster, capsys):
    assert config.GpuCell().encrypt is True
    assert cluster.client.curve_serverkey  # the session's cluster: Curve
    capsys.readouterr()
    ip.run_line_magic("gpu_cluster", "status")
    assert "encrypted" not in capsys.readouterr().out


def test_the_start_option_turns_it_off_for_one_start():
    start = _build_parsers()["start"]
    assert start.parse_args(["--no-encrypt"]).encrypt is False
    assert start.parse_args([]).encrypt is None  # GpuCell.encrypt decides
