"""gpucell.cluster.slurm_check, the job script's check that its controller still
answers, read without Slurm: where it looks and what it decides."""

from __future__ import annotations

import json
import socket
import time

import pytest

from gpucell.cluster import slurm_check


@pytest.mark.parametrize(
    "interface, location, want",
    [
        ("tcp://10.1.2.3", "10.1.2.3", "10.1.2.3"),
        ("tcp://*", "10.9.8.7", "10.9.8.7"),  # listening everywhere: its location
        ("tcp://0.0.0.0", "10.9.8.7", "10.9.8.7"),
        ("tcp://*", "", "127.0.0.1"),
    ],
)
def test_the_registration_address_is_where_engines_reach_the_controller(
    monkeypatch, interface, location, want
) -> None:
    """A controller bound to every interface writes `*`: the check must connect
    to its location, as engines do, or every job would cancel itself."""
    info = {"interface": interface, "location": location, "registration": 4321}
    monkeypatch.setenv("IPP_CONNECTION_INFO", json.dumps(info))
    assert slurm_check.registration_address("/nonexistent", "c1") == (want, 4321)


def test_a_listening_controller_answers_and_a_closed_port_does_not(monkeypatch) -> None:
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        assert slurm_check.controller_answers(("127.0.0.1", port), patience=2)
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    info = {"interface": "tcp://127.0.0.1", "location": "", "registration": port}
    monkeypatch.setenv("IPP_CONNECTION_INFO", json.dumps(info))
    monkeypatch.setattr(slurm_check, "PATIENCE", 0.5)
    assert slurm_check.main(["/nonexistent", "c1"]) == 1


@pytest.mark.parametrize(
    "value, want", [("2.5", 2.5), ("0", 0.0), ("", 30.0), ("soon", 30.0), ("-1", 30.0)]
)
def test_the_file_patience_is_a_setting_and_a_bad_one_keeps_the_default(
    monkeypatch, value, want
) -> None:
    monkeypatch.setattr(slurm_check, "FILE_PATIENCE", 30.0)
    monkeypatch.setenv("GPUCELL_SLURM_FILE_PATIENCE", value)
    assert slurm_check.file_patience() == want


def test_the_file_is_waited_for_from_the_jobs_submission(monkeypatch) -> None:
    """A job that pended past the patience finds the file now or never: its
    controller wrote it within seconds of the submission, so a missing file
    means a dead controller (no wait); a job that starts at once waits."""
    monkeypatch.delenv("GPUCELL_SLURM_FILE_PATIENCE", raising=False)
    monkeypatch.delenv("IPP_CONNECTION_INFO", raising=False)
    now = time.time()
    for since, least, most in [(now - 600, -0.5, 0.5), (now - 10, 19.0, 20.5)]:
        monkeypatch.setattr(slurm_check, "submitted_at", lambda job, s=since: s)
        left = slurm_check.file_deadline("7") - time.monotonic()
        assert least <= left <= most, (since, left)
    monkeypatch.setattr(slurm_check, "submitted_at", lambda job: None)  # unknown
    assert 29.0 <= slurm_check.file_deadline("7") - time.monotonic() <= 30.5
    assert slurm_check.submitted_at("") is None  # not in a job: no squeue asked
    t0 = time.monotonic()
    assert slurm_check.registration_address("/nonexistent", "c1", t0) is None
    assert time.monotonic() - t0 < 1.0
