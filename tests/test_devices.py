"""Device discovery and engine planning, with a fake NVML (there is no GPU here)."""

from __future__ import annotations

from dataclasses import replace

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


# --- MIG slices ---------------------------------------------------------------


def _mig_host():
    """GPU 0 in MIG mode (two 1g.10gb and one 3g.40gb slice), GPU 1 whole."""
    from fake_nvml import a100_mig

    return [a100_mig(0, ["1g.10gb", "1g.10gb", "3g.40gb"], cores_per_gpu=4)] + [
        replace(a100s(2, cores_per_gpu=4)[1])
    ]


def test_an_allocation_of_two_mig_slices_gives_two_gpu_engines(monkeypatch):
    """A shared A100 server hands out MIG-<uuid>,MIG-<uuid>: two GPU engines,
    each seeing its slice alone, named and sized as the slice."""
    from fake_nvml import a100_mig

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-a100-0-2,MIG-a100-0-0")
    nvml = FakeNvml([a100_mig(0, ["1g.10gb", "2g.20gb", "3g.40gb"], 4)])
    d = discover(nvml)
    assert d.source == "nvml"
    assert [(g.uuid, g.index) for g in d.gpus] == [
        ("MIG-a100-0-2", 0),
        ("MIG-a100-0-0", 0),
    ]
    specs = plan_engines(d.gpus, cpu=CPU, cores=list(range(8)))
    assert [s.device.kind for s in specs] == ["gpu", "gpu"]
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == [
        "MIG-a100-0-2",
        "MIG-a100-0-0",
    ]
    assert all("CUDA_DEVICE_ORDER" not in s.env for s in specs)
    assert [s.label for s in specs] == ["gpu0.mig0", "gpu0.mig1"]
    assert [s.device.name for s in specs] == [
        "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb",
    ]
    assert [s.device.memory_total for s in specs] == [40 * 2**30, 10 * 2**30]
    # the two slices of GPU 0 split its near cores
    assert [s.cpu_affinity for s in specs] == [(0, 1), (2, 3)]


def test_a_mixed_host_gives_slices_and_whole_gpus(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    specs = plan(FakeNvml(_mig_host()), cores=8, cpu_engines=1)
    assert [s.label for s in specs] == [
        "gpu0.mig0",
        "gpu0.mig1",
        "gpu0.mig2",
        "gpu1",
        "cpu0",
    ]
    env = [s.env["CUDA_VISIBLE_DEVICES"] for s in specs]
    # the whole GPU's peers are whole GPUs only: GPU 0 cannot be used whole
    assert env == ["MIG-a100-0-0", "MIG-a100-0-1", "MIG-a100-0-2", "1", ""]
    assert specs[3].env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert specs[3].cpu_affinity == (4, 5, 6, 7)
    # --gpus 0 picks every slice of GPU 0
    specs = plan(FakeNvml(_mig_host()), select=(0,))
    assert [s.label for s in specs] == ["gpu0.mig0", "gpu0.mig1", "gpu0.mig2"]


def test_old_style_mig_names_are_honoured(monkeypatch):
    """CUDA 11.0's MIG-GPU-<gpu uuid>/<gpu instance>/<compute instance>."""
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-a100-0/3/0,MIG-GPU-a100-0/1/0")
    d = discover(FakeNvml(_mig_host()))
    assert [g.uuid for g in d.gpus] == ["MIG-a100-0-2", "MIG-a100-0-0"]
    specs = plan_engines(d.gpus, cpu=CPU, cores=list(range(8)))
    # the engine is pinned by the slice's own UUID, which CUDA 11.1+ reads too
    assert [s.env["CUDA_VISIBLE_DEVICES"] for s in specs] == [
        "MIG-a100-0-2",
        "MIG-a100-0-0",
    ]
    # an instance that does not exist is a bad entry
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-GPU-a100-0/9/0,MIG-a100-0-0")
    assert discover(FakeNvml(_mig_host())).gpus == ()


@pytest.mark.parametrize(
    ("visible", "uuids"),
    [
        ("MIG-a100-0-1,bogus,MIG-a100-0-0", ["MIG-a100-0-1"]),
        ("1,MIG-nope,MIG-a100-0-0", ["GPU-a100-1"]),
        ("MIG-a100-0-1,7,1", ["MIG-a100-0-1"]),
        ("", []),
        # a unique prefix names a device, as CUDA reads it; an ambiguous one not
        ("MIG-a100-0-2,GPU-a100-1", ["MIG-a100-0-2", "GPU-a100-1"]),
        ("MIG-a100-0,GPU-a100-1", []),
    ],
)
def test_a_bad_entry_ends_the_list_as_cuda_does(monkeypatch, visible, uuids):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    d = discover(FakeNvml(_mig_host()))
    assert [g.uuid for g in d.gpus] == uuids
    if visible and len(uuids) < visible.count(",") + 1:
        assert "CUDA ignores it and every entry after it" in d.notes[-1]


def test_a_gpu_in_mig_mode_is_no_device_without_its_slices(monkeypatch):
    from fake_nvml import a100_mig

    # named whole: no device, and the list goes on
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    d = discover(FakeNvml(_mig_host()))
    assert [g.uuid for g in d.gpus] == ["GPU-a100-1"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a100-0")
    d = discover(FakeNvml(_mig_host()))
    assert d.gpus == () and d.source == "none"
    assert "GPU 0 (NVIDIA A100-SXM4-80GB) is in MIG mode" in d.notes[0]
    # MIG mode with no slice created: nothing to run on, said why
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    d = discover(FakeNvml([a100_mig(0, [])]))
    assert d.gpus == () and "none was created" in d.notes[0]
    # so start-up falls back to CPU engines
    specs = plan(FakeNvml([a100_mig(0, [])]), cores=2)
    assert [s.device.kind for s in specs] == ["cpu", "cpu"]


def test_pynvml_api_reports_mig_slices(monkeypatch):
    """PynvmlApi over a fake pynvml: slices from their own handles (empty
    slots skipped), names from the GPU's and the slice's, instance ids."""
    import sys

    from fake_nvml import FakePynvml, a100_mig

    from gpucell.devices.nvml import PynvmlApi

    gpus = [a100_mig(0, ["1g.10gb", "3g.40gb"], slots=[0, 5])] + a100s(2)[1:]
    nv = FakePynvml(FakeNvml(gpus))
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    got = PynvmlApi().gpus()
    assert nv.initialised == 0
    assert [(g.index, g.mig_enabled) for g in got] == [(0, True), (1, False)]
    assert got[0].migs == gpus[0].migs  # names rebuilt: "MIG 3g.40gb" -> full
    assert got[1].migs == ()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    d = discover(PynvmlApi())
    assert [(g.name, g.uuid) for g in d.gpus] == [
        ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", "MIG-a100-0-0"),
        ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", "MIG-a100-0-1"),
        ("NVIDIA A100-SXM4-80GB", "GPU-a100-1"),
    ]


def test_mig_names_whatever_the_driver_returns():
    from gpucell.devices.nvml import _mig_name

    gpu = "NVIDIA A100-SXM4-80GB"
    want = "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    for driver in (want, "MIG 1g.10gb", "1g.10gb"):
        assert _mig_name(gpu, driver) == want


def test_the_status_names_the_slice():
    from gpucell.cluster.engines import EngineInfo
    from gpucell.core.topology import slice_text

    assert slice_text("MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f") == "MIG-c6d4f1ef"
    assert slice_text("MIG-GPU-e91edf3b-b297-37c1-a2a7-7601c98fe3bd/1/0") == "MIG 1/0"
    assert slice_text("0,1") == slice_text(None) == slice_text("") == ""
    row = EngineInfo(0, "h", 1, "gpu", 0, "A100 MIG 1g.10gb", 10 * 2**30)
    assert row.device == "GPU 0"
    mig = replace(row, cuda_visible_devices="MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f")
    assert mig.device == "GPU 0 MIG-c6d4f1ef"
    assert replace(mig, kind="cpu").device == "CPU"


def test_telemetry_of_a_slice_is_the_slice_s(monkeypatch):
    """Memory per slice as NVML gives it, utilisation unknown (None, not 0%),
    through the fake NVML and through PynvmlApi over the fake pynvml."""
    import os
    import sys
    from types import SimpleNamespace

    from fake_nvml import FakePynvml

    from gpucell.devices.nvml import GpuUsage, PynvmlApi
    from gpucell.devices.sampling import LocalTelemetry

    pid = os.getpid()

    def info(eid, index, visible):
        return SimpleNamespace(
            id=eid,
            pid=pid,
            host="here",
            kind="gpu",
            index=index,
            name="A100",
            cuda_visible_devices=visible,
        )

    engines = [
        info(0, 0, "MIG-a100-0-1"),
        info(1, 0, "MIG-GPU-a100-0/1/0"),  # old-style: slice 0
        info(2, 1, "1,0"),
    ]
    fake = FakeNvml(
        _mig_host(),
        mig_usages={"MIG-a100-0-1": GpuUsage(None, 3 * 2**30, 10 * 2**30, None, 40)},
        usages={1: GpuUsage(55.0, 1, 80 * 2**30, 300.0, 50.0)},
    )
    s = LocalTelemetry(engines, nvml=fake).sample()
    assert [x.state for x in s] == ["ok", "ok", "ok"]
    assert [x.utilization for x in s] == [None, None, 55.0]
    assert [x.memory_used for x in s] == [3 * 2**30, 0, 1]
    assert [x.memory_total for x in s] == [10 * 2**30, 10 * 2**30, 80 * 2**30]
    assert fake.mig_usage_calls == ["MIG-a100-0-1", "MIG-GPU-a100-0/1/0"]

    nv = FakePynvml(fake)
    monkeypatch.setitem(sys.modules, "pynvml", nv)
    api = PynvmlApi()
    tele = LocalTelemetry(engines, nvml=api)
    for _ in range(2):  # handles found once, then kept
        s = tele.sample()
        assert [x.state for x in s] == ["ok", "ok", "ok"]
        assert [x.utilization for x in s] == [None, None, 55.0]
        assert [x.memory_used for x in s] == [3 * 2**30, 0, 1]
        assert [x.memory_total for x in s] == [10 * 2**30, 10 * 2**30, 80 * 2**30]
        assert s[0].power_w is None and s[0].temperature_c == 35.0  # the GPU's
    assert nv.mig_handles == 2 * 3  # one walk over GPU 0's 3 slices per slice
    api.close()
    assert nv.initialised == 0
    # a slice that is gone: an error on its row, the others still measured
    gone = [info(0, 0, "MIG-a100-0-9"), engines[2]]
    s = LocalTelemetry(gone, nvml=fake).sample()
    assert s[0].state == "error" and "MIG-a100-0-9" in s[0].error
    assert s[1].state == "ok"


def test_an_engine_measuring_itself_on_a_slice(monkeypatch):
    """engine/telemetry passes a Target with its own pid: the slice is read from
    the engine's own CUDA_VISIBLE_DEVICES."""
    import os

    from gpucell.devices.sampling import LocalTelemetry
    from gpucell.protocol.telemetry import Target

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-a100-0-2")
    fake = FakeNvml(_mig_host())
    (s,) = LocalTelemetry(
        [Target(0, os.getpid(), "here", "gpu", 0, "A100")], nvml=fake
    ).sample()
    assert s.memory_total == 40 * 2**30 and s.utilization is None
