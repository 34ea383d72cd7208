"""MIG slices end to end: a real local cluster on an allocation of MIG slices,
NVML faked (tests/fake_nvml.py): there is no GPU here."""

from __future__ import annotations

import pytest
from fake_nvml import FakeNvml, a100_mig, a100s

import gpucell
import gpucell.cluster.lifecycle as gc_mod

pytestmark = pytest.mark.cluster


def _engine_env():
    import os

    from gpucell.engine.runtime import device_string

    return os.environ.get("CUDA_VISIBLE_DEVICES"), device_string()


def test_an_allocation_of_mig_slices_starts_one_gpu_engine_per_slice(
    monkeypatch, no_active_cluster
):
    """CUDA_VISIBLE_DEVICES=MIG-...,MIG-... (what a shared A100 server or Slurm
    hands out) was read as "no GPU" and started CPU engines; now each slice is
    a GPU engine that sees its slice alone, and the status names the slice."""
    gpus = [a100_mig(0, ["1g.10gb", "1g.10gb", "3g.40gb"], 1)] + a100s(2, 1)[1:]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-a100-0-2,MIG-a100-0-0")
    fake = FakeNvml(gpus)
    c = gpucell.start_cluster(nvml=fake)
    try:
        facts = {c.engines[e].label: c.client[e].apply_sync(_engine_env) for e in c.ids}
        assert facts == {
            "gpu0.mig0": ("MIG-a100-0-2", "cuda"),
            "gpu0.mig1": ("MIG-a100-0-0", "cuda"),
        }
        rows = sorted(c.engines.values(), key=lambda e: e.label)
        assert [(e.kind, e.index, e.device) for e in rows] == [
            ("gpu", 0, "GPU 0 MIG-a100-0-2"),  # the start of the slice's UUID
            ("gpu", 0, "GPU 0 MIG-a100-0-0"),
        ]
        assert [(e.name, e.memory_total) for e in rows] == [
            ("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 40 * 2**30),
            ("NVIDIA A100-SXM4-80GB MIG 1g.10gb", 10 * 2**30),
        ]
        table = gc_mod.format_status(rows)
        assert "NVIDIA A100-SXM4-80GB MIG 3g.40gb" in table and "40.0 GiB" in table
        # telemetry: each slice's memory, utilisation unknown (not 0%)
        from gpucell.kernel.telemetry import for_cluster

        tele = for_cluster(c, nvml=fake)
        samples = {s.engine: s for s in tele.sample()}
        tele.close()
        for e in rows:
            s = samples[e.id]
            assert s.state == "ok" and s.utilization is None
            assert s.memory_total == e.memory_total
        assert sorted(fake.mig_usage_calls) == ["MIG-a100-0-0", "MIG-a100-0-2"]
    finally:
        gpucell.stop()


@pytest.mark.parametrize(
    ("rank", "visible", "want", "index", "label"),
    [
        ("1", "MIG-a,MIG-b", "MIG-b", "1", "/mig1"),  # the slice alone
        ("0", "MIG-a,MIG-b", "MIG-a", "0", "/mig0"),
        ("1", "0,1", "1,0", "1", "/gpu1"),  # whole GPUs: own first, as before
        ("0", "GPU-x,GPU-y", "GPU-x,GPU-y", "0", "/gpuGPU-x"),  # a UUID: no index
    ],
)
def test_slurm_tasks_on_mig_slices_are_pinned_by_rank(
    rank, visible, want, index, label
):
    """gpucell.cluster.boot, for engines one srun starts: a task's slice by its
    SLURM_LOCALID, alone in CUDA_VISIBLE_DEVICES; its index stays a number."""
    from gpucell.cluster.boot import _pin_by_local_rank

    env = {
        "GPUCELL_PIN_BY_RANK": "1",
        "SLURM_LOCALID": rank,
        "CUDA_VISIBLE_DEVICES": visible,
    }
    _pin_by_local_rank(env)  # type: ignore[arg-type]
    assert env["CUDA_VISIBLE_DEVICES"] == want
    assert env["GPUCELL_DEVICE_KIND"] == "gpu"
    assert env["GPUCELL_DEVICE_INDEX"] == index
    assert env["GPUCELL_ENGINE_LABEL"].endswith(label)
    assert ("CUDA_DEVICE_ORDER" in env) == (not want.startswith("MIG-"))
