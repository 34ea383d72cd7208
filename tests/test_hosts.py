"""The --ssh host list, each host's plan, and the probe's failures (pure)."""

from __future__ import annotations

import re

import pytest

from gpucell.cluster.remote import describe_failure
from gpucell.core.hosts import (
    HostFacts,
    SshHost,
    check_facts,
    controller_address,
    parse_ssh_hosts,
    plan_host,
)
from gpucell.errors import ClusterError


def facts(gpus: int = 2, host: str = "gpu1", client: str | None = "10.0.0.5", **kw):
    d = {
        "host": host,
        "python": "/opt/venv/bin/python",
        "gpucell": "0.1.0",
        "ipyparallel": "9.2.0",
        "cores": list(range(8)),
        "cpu": {"kind": "cpu", "index": -1, "name": "EPYC", "memory_total": 1 << 30},
        "gpus": [
            {
                "kind": "gpu",
                "index": i,
                "name": "H100",
                "uuid": f"GPU-{i}",
                "memory_total": 80 << 30,
                "cpu_affinity": [4 * i, 4 * i + 1, 4 * i + 2, 4 * i + 3],
            }
            for i in range(gpus)
        ],
        "ssh_client": client,
    }
    d.update(kw)
    return HostFacts.from_json(d)


def test_host_lists_parse_with_counts_and_users():
    assert parse_ssh_hosts("a, me@b:2,c.lab.org:1") == [
        SshHost("a"),
        SshHost("me@b", 2),
        SshHost("c.lab.org", 1),
    ]


@pytest.mark.parametrize(
    ("spec", "match"),
    [
        ("", "at least one host"),
        ("a,a:2", "named twice"),
        ("a:0", "asks for 0 engines"),
        ("a:22x", "number of engines"),
        ("a b", "not a host name"),
        ("-oProxyCommand=x", "not a host name"),  # never an ssh option
    ],
)
def test_bad_host_lists_say_what_is_wrong(spec, match):
    with pytest.raises(ClusterError, match=match):
        parse_ssh_hosts(spec)


def test_a_host_gets_one_engine_per_gpu_each_with_its_gpu_first_and_near_cores():
    specs = plan_host(facts(2), None)
    assert [s.label for s in specs] == ["gpu1/gpu0", "gpu1/gpu1"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == ["0,1", "1,0"]
    assert all(s.env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID" for s in specs)
    assert [s.cpu_affinity for s in specs] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert [s.label for s in plan_host(facts(2), 1)] == ["gpu1/gpu0"]
    assert len(plan_host(facts(2), None, per_gpu=2)) == 4


def test_a_host_without_gpus_gets_one_engine_per_core_or_n():
    assert len(plan_host(facts(0), None)) == 8
    specs = plan_host(facts(0), 2)
    assert [s.label for s in specs] == ["gpu1/cpu0", "gpu1/cpu1"]
    assert [s.cpu_affinity for s in specs] == [(0, 1, 2, 3), (4, 5, 6, 7)]


def test_asking_a_host_for_more_engines_than_gpus_names_the_host():
    with pytest.raises(ClusterError, match="--ssh host gpu1: -n 3: only 2 GPU"):
        plan_host(facts(2), 3)


def test_a_host_with_another_gpucell_or_no_ipyparallel_is_refused():
    with pytest.raises(ClusterError, match="has gpucell 0.0.9.*install gpucell 0.1.0"):
        check_facts("gpu1", facts(gpucell="0.0.9"), "0.1.0")
    with pytest.raises(ClusterError, match="no ipyparallel"):
        check_facts("gpu1", facts(ipyparallel=None), "0.1.0")
    check_facts("gpu1", facts(), "0.1.0")


def test_the_controller_listens_where_every_host_saw_this_machine():
    assert controller_address([facts(), facts(host="gpu2")]) == "10.0.0.5"
    assert controller_address([facts(), facts(client="192.168.1.2")]) is None
    assert controller_address([facts(client=None)]) is None


@pytest.mark.parametrize(
    ("code", "stderr", "match"),
    [
        (255, "root@h: Permission denied (publickey).", "refused the login to h"),
        (255, "Host key verification failed.", "host key is not in"),
        (255, "ssh: connect to host h port 22: Connection refused", "unreachable"),
        (1, "/x/python: No module named gpucell", "has no gpucell"),
        (127, "bash: /x/python: No such file or directory", "no Python at"),
        (1, "Traceback ...\nRuntimeError: boom", "probe` failed \\(RuntimeError"),
    ],
)
def test_probe_failures_say_how_to_fix_them(code, stderr, match):
    msg = describe_failure("h", "/x/python", code, stderr)
    assert "Nothing was started" in msg
    assert re.search(match, msg), msg


def test_displays_list_this_hosts_engines_first_then_each_hosts_together():
    from types import SimpleNamespace as E

    from gpucell.core.runstate import EngineProgress, RunSnapshot
    from gpucell.ui import model

    engines = {
        0: E(local=False, host="b"),
        1: E(local=True, host="here"),
        2: E(local=False, host="a"),
        3: E(local=False, host="b"),
        4: E(local=True, host="here"),
    }
    assert model.engine_order(engines) == [1, 4, 2, 0, 3]
    snap = RunSnapshot(
        total=10,
        done=0,
        elapsed=0.0,
        engines=tuple(
            EngineProgress(engine=i, host=h, device="CPU", name="CPU", pid=0)
            for i, h in enumerate(["here", "b", "here", "a", "b"])
        ),
    )
    assert [r.engine for r in model.run_view(snap).rows] == [0, 2, 1, 4, 3]
