"""Checks that need a real NVIDIA GPU; skipped with a reason everywhere else."""

from __future__ import annotations

import pytest

import gpucell
from gpucell.devices.discovery import discover

pytestmark = [pytest.mark.gpu, pytest.mark.cluster]


def test_nvml_discovery_finds_the_gpus():
    d = discover()
    assert d.source == "nvml" and d.gpus
    assert all(g.memory_total > 0 and g.uuid.startswith("GPU-") for g in d.gpus)


def test_each_engine_has_its_own_gpu_as_cuda0(no_active_cluster):
    c = gpucell.start_cluster(gpus="all")
    try:

        def probe():
            import torch

            return (
                torch.cuda.device_count(),
                torch.cuda.get_device_name(0),
                str(__import__("gpucell").device()),
            )

        got = {eid: c.client[eid].apply_sync(probe) for eid in c.ids}
        names = sorted(g.name for g in discover().gpus)
        assert sorted(v[1] for v in got.values()) == names
        assert all(v[2] == "cuda" for v in got.values())
    finally:
        gpucell.stop()
