"""gpucell.cluster.slurm_check, the job script's check that its controller still
answers, read without Slurm: where it looks and what it decides."""

from __future__ import annotations

import json
import socket

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
