"""Device discovery and engine planning, with a fake NVML (there is no GPU here)."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNvml, a100s

from gpucell.core.topology import (
    parse_gpu_selection,
    plan_engines,
    visible_devices_order,
)
from gpucell.devices.discovery import cpu_device, discover
from gpucell.devices.nvml import GpuInfo, _mask_to_cores
from gpucell.errors import DeviceSelectionError
from gpucell.protocol.devices import Device

CPU = Device(kind="cpu", index=-1, name="Test CPU", memory_total=2**34)


def plan(nvml: FakeNvml, cores: int = 8, **kw):
    return plan_engines(discover(nvml).gpus, cpu=CPU, cores=list(range(cores)), **kw)


def test_zero_gpus_gives_one_cpu_engine_per_core_each_with_its_share():
    specs = plan(FakeNvml([]), cores=4)
    assert [s.label for s in specs] == ["cpu0", "cpu1", "cpu2", "cpu3"]
    assert [s.cpu_affinity for s in specs] == [(0,), (1,), (2,), (3,)]
    for s in specs:
        assert s.device.kind == "cpu"
        assert s.env["OMP_NUM_THREADS"] == "1"
        assert s.env["MKL_NUM_THREADS"] == "1"
        assert "CUDA_VISIBLE_DEVICES" not in s.env


def test_n_cpu_engines_split_cores_and_threads():
    specs = plan(FakeNvml([]), cores=8, n=2)
    assert [s.cpu_affinity for s in specs] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert all(s.threads == 4 and s.env["OMP_NUM_THREADS"] == "4" for s in specs)


def test_more_cpu_engines_than_cores_are_not_pinned():
    specs = plan(FakeNvml([]), cores=2, n=5)
    assert len(specs) == 5
    assert all(s.cpu_affinity == () and s.threads == 1 for s in specs)


def test_one_gpu():
    specs = plan(FakeNvml(a100s(1)))
    assert len(specs) == 1
    (s,) = specs
    assert s.device.kind == "gpu" and s.device.index == 0
    assert s.env["CUDA_VISIBLE_DEVICES"] == "0"
    assert s.label == "gpu0"


def test_four_gpus_each_engine_sees_its_gpu_first_then_the_others():
    specs = plan(FakeNvml(a100s(4, cores_per_gpu=2)), cores=8)
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == [
        "0,1,2,3",
        "1,0,2,3",
        "2,0,1,3",
        "3,0,1,2",
    ]
    # near cores from NVML become the affinity and the thread count
    assert [s.cpu_affinity for s in specs] == [(0, 1), (2, 3), (4, 5), (6, 7)]
    assert all(s.threads == 2 and s.env["OMP_NUM_THREADS"] == "2" for s in specs)


def test_per_gpu_two_splits_each_gpus_near_cores():
    specs = plan(FakeNvml(a100s(2, cores_per_gpu=4)), per_gpu=2)
    assert [s.label for s in specs] == ["gpu0.0", "gpu0.1", "gpu1.0", "gpu1.1"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == [
        "0,1",
        "0,1",
        "1,0",
        "1,0",
    ]
    assert [s.cpu_affinity for s in specs] == [(0, 1), (2, 3), (4, 5), (6, 7)]


def test_mixed_gpu_models_keep_their_names_and_memory():
    gpus = [
        GpuInfo(0, "NVIDIA A100-SXM4-80GB", "GPU-a", 80 * 2**30),
        GpuInfo(1, "NVIDIA GeForce RTX 4090", "GPU-b", 24 * 2**30),
    ]
    specs = plan(FakeNvml(gpus))
    assert [(s.device.name, s.device.memory_total) for s in specs] == [
        ("NVIDIA A100-SXM4-80GB", 80 * 2**30),
        ("NVIDIA GeForce RTX 4090", 24 * 2**30),
    ]


def test_gpu_selection_and_cpu_engines_beside():
    specs = plan(FakeNvml(a100s(4)), select=(0, 2), cpu_engines=2, cores=8)
    assert [s.label for s in specs] == ["gpu0", "gpu2", "cpu0", "cpu1"]
    assert specs[1].env["CUDA_VISIBLE_DEVICES"] == "2,0,1,3"
    # CPU engines on a GPU host see no GPU at all
    assert specs[2].env["CUDA_VISIBLE_DEVICES"] == ""


def test_select_none_on_a_gpu_host_gives_cpu_engines():
    specs = plan(FakeNvml(a100s(2)), select="none", n=2, cores=2)
    assert [s.device.kind for s in specs] == ["cpu", "cpu"]


def test_n_limits_gpus():
    specs = plan(FakeNvml(a100s(4)), n=2)
    assert [s.label for s in specs] == ["gpu0", "gpu1"]
    with pytest.raises(DeviceSelectionError, match="only 4 GPU"):
        plan(FakeNvml(a100s(4)), n=5)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"select": (3,)}, "no GPU 3 on this host"),
        ({"n": 0}, "-n 0"),
        ({"per_gpu": 0}, "--per-gpu 0"),
        ({"cpu_engines": -1}, "--cpu-engines -1"),
    ],
)
def test_bad_selection_is_a_clear_error(kw, message):
    with pytest.raises(DeviceSelectionError, match=message):
        plan(FakeNvml(a100s(2)), **kw)


def test_parse_gpu_selection():
    assert parse_gpu_selection(None) == "all"
    assert parse_gpu_selection("all") == "all"
    assert parse_gpu_selection("NONE") == "none"
    assert parse_gpu_selection("0,2") == (0, 2)
    assert parse_gpu_selection([1]) == (1,)
    for bad in ("x", "0,0", "-1"):
        with pytest.raises(DeviceSelectionError):
            parse_gpu_selection(bad)


def test_nvml_failure_is_a_fallback_not_a_crash():
    d = discover(FakeNvml(broken="NVML Shared Library Not Found"))
    assert d.gpus == () and d.source == "none"
    assert "Shared Library Not Found" in d.notes[0]


def test_real_discovery_never_raises_here():
    d = discover()
    assert d.source in ("nvml", "torch", "none")


def test_cuda_visible_devices_of_the_kernel_is_honoured(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,GPU-a100-3")
    d = discover(FakeNvml(a100s(4)))
    assert [g.index for g in d.gpus] == [2, 3]


def test_visible_devices_order():
    assert visible_devices_order(2, [0, 1, 2, 3]) == "2,0,1,3"


def test_affinity_mask_decoding():
    assert _mask_to_cores([0b1011]) == (0, 1, 3)
    assert _mask_to_cores([0, 1]) == (64,)


def test_cpu_device_describes_this_host():
    d = cpu_device()
    assert d.kind == "cpu" and d.memory_total > 0 and d.name


def test_an_engine_is_local_only_when_it_shares_the_kernel_s_pids() -> None:
    from gpucell.devices.host import identity, shares_pids

    me = identity()
    assert shares_pids(me, identity())
    # a container with host networking: same hostname, its own pid namespace
    container = {**me, "pidns": "pid:[4026532999]"}
    assert not shares_pids(container, me)
    # another machine that happens to share the name
    assert not shares_pids({**me, "boot_id": "another-boot"}, me)
    # no /proc on either side: the host name is all there is
    assert shares_pids({"host": "a"}, {"host": "a", "boot_id": "x", "pidns": "y"})
    assert not shares_pids({"host": ""}, {"host": ""})


def test_engines_of_this_host_are_local(cluster) -> None:
    assert all(e.local for e in cluster.engines.values())
