"""Checks that need a real NVIDIA GPU; skipped with a reason everywhere else."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import gpucell
from gpucell.devices.discovery import discover

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import gpu_proof  # noqa: E402

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


@pytest.mark.parametrize(
    "check", gpu_proof.CHECKS, ids=[c.path.replace(" ", "-") for c in gpu_proof.CHECKS]
)
def test_gpu_proof_check_passes(ip, no_active_cluster, check):
    """The checks of `python bench/gpu_proof.py OUTDIR`, one test each."""
    r = gpu_proof.run_check(check)
    assert r.status == gpu_proof.PASS, f"{r.figure}: {r.reason}"
