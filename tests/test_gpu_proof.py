"""bench/gpu_proof.py on a machine without a GPU: the command runs, skips every
check with its reason, writes its files and exits 0; and its pure parts (table,
exit code, JSON schema, the checks' judgements) are right.  The checks themselves
run in tests/test_gpu.py where a GPU is present."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import gpu_proof  # noqa: E402
from gpu_proof import FAIL, PASS, SKIP, Check, Result  # noqa: E402


def _results() -> list[Result]:
    return [
        Result("pinning", "cuda:0 is its GPU", "2 engines", PASS),
        Result("oom", "names the device", "-", FAIL, "no device named"),
        Result("scaling", "1, 2, 4 engines", "-", SKIP, "no GPU"),
    ]


def _meta() -> dict:
    return {
        "machine": {
            "host": "h",
            "cpus": 2,
            "python": "3.11",
            "platform": "linux",
            "torch": None,
            "gpucell": "0.1.0",
        },
        "gpus": [],
        "unavailable": "no GPU",
    }


# ---- the command ------------------------------------------------------------------


def test_command_without_a_gpu_skips_every_check_and_exits_0(tmp_path):
    if gpu_proof.unavailable_reason() is None:
        pytest.skip("this machine has a GPU: tests/test_gpu.py runs the checks")
    out = tmp_path / "proof"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "gpu_proof.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"^path +check +figure +status$", proc.stdout, re.M)
    for c in gpu_proof.CHECKS:
        assert re.search(rf"^{re.escape(c.path)} +.* skip$", proc.stdout, re.M), c.path
    assert f"0 pass, 0 fail, {len(gpu_proof.CHECKS)} skip" in proc.stdout

    report = json.loads((out / "gpu_proof.json").read_text())
    assert gpu_proof.validate_report(report) == []
    assert [r["path"] for r in report["results"]] == list(gpu_proof.BY_PATH)
    assert all(r["status"] == SKIP and r["reason"] for r in report["results"])
    assert report["exit_code"] == 0 and report["unavailable"]
    md = (out / "gpu_proof.md").read_text()
    assert "| path | check | figure | status | reason |" in md
    assert md.count("| skip |") == len(gpu_proof.CHECKS)


def test_unknown_path_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as info:
        gpu_proof.main([str(tmp_path), "--only", "nope"])
    assert info.value.code == 2
    assert "unknown path" in capsys.readouterr().err


# ---- table, exit code, report ------------------------------------------------------


def test_table_has_aligned_columns_and_the_reasons_once():
    rs = _results() + [Result("overlap", "copies overlap", "-", SKIP, "no GPU")]
    lines = gpu_proof.format_table(rs).splitlines()
    assert lines[0].split() == ["path", "check", "figure", "status"]
    status_col = lines[0].index("status")
    assert all(line[status_col:] in (PASS, FAIL, SKIP) for line in lines[2:6])
    text = "\n".join(lines)
    assert "  oom (fail): no device named" in text
    assert "  scaling, overlap (skip): no GPU" in text  # one line per reason
    assert lines[-1] == "1 pass, 1 fail, 2 skip"
    assert gpu_proof.format_table([]).splitlines()[-1] == "0 pass, 0 fail, 0 skip"


def test_exit_code_is_1_only_when_a_check_failed():
    rs = _results()
    assert gpu_proof.exit_code(rs) == 1
    assert gpu_proof.exit_code([r for r in rs if r.status != FAIL]) == 0
    assert gpu_proof.exit_code([]) == 0
    assert gpu_proof.summarize(rs) == {PASS: 1, FAIL: 1, SKIP: 1}


def test_judge_passes_without_problems_and_fails_saying_the_first_few():
    assert gpu_proof.Result("p", "c").judge([]).status == PASS
    r = gpu_proof.Result("p", "c").judge([f"problem {i}" for i in range(6)])
    assert r.status == FAIL and r.reason.startswith("problem 0; problem 1")
    assert r.reason.endswith("(and 2 more)") and len(r.details["problems"]) == 6


def test_report_follows_its_schema_and_json_round_trips():
    report = gpu_proof.build_report(_results(), _meta(), 1.5)
    assert gpu_proof.validate_report(json.loads(json.dumps(report))) == []
    assert report["summary"] == {PASS: 1, FAIL: 1, SKIP: 1}
    assert report["exit_code"] == 1
    md = gpu_proof.markdown(report)
    assert "| oom | names the device | - | fail | no device named |" in md


@pytest.mark.parametrize(
    "breaks, complaint",
    [
        (lambda d: d.pop("results"), "missing 'results'"),
        (lambda d: d.update(schema=99), "schema 99"),
        (lambda d: d["results"][0].update(status="maybe"), "status 'maybe'"),
        (lambda d: d["results"][2].update(reason=""), "has no reason"),
        (lambda d: d["results"][0].pop("figure"), "figure missing"),
        (lambda d: d.update(exit_code=0), "exit_code 0, expected 1"),
        (lambda d: d["summary"].update(skip=5), "summary"),
    ],
)
def test_schema_violations_are_named(breaks, complaint):
    report = gpu_proof.build_report(_results(), _meta(), 1.0)
    breaks(report)
    assert any(complaint in e for e in gpu_proof.validate_report(report))


# ---- running checks ----------------------------------------------------------------


def _raises(r: Result) -> Result:
    raise RuntimeError("engine 3 vanished")


def _passes(r: Result) -> Result:
    r.figure = "42 ms"
    return r.judge([])


def test_a_check_is_skipped_with_the_machines_reason(monkeypatch):
    monkeypatch.setattr(gpu_proof, "unavailable_reason", lambda: "no NVIDIA GPU here")
    r = gpu_proof.run_check(Check("x", "what", _raises))
    assert (r.status, r.reason, r.path, r.check) == (
        SKIP,
        "no NVIDIA GPU here",
        "x",
        "what",
    )


def test_a_raising_check_fails_with_its_error_and_the_others_still_run(
    monkeypatch, tmp_path
):
    monkeypatch.setattr(gpu_proof, "unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu_proof, "_gpus", lambda: [])
    checks = [Check("a", "raises", _raises), Check("b", "passes", _passes)]
    said: list[str] = []
    rs = gpu_proof.run_all(tmp_path, checks=checks, echo=said.append)
    assert [(r.path, r.status) for r in rs] == [("a", FAIL), ("b", PASS)]
    assert rs[0].reason == "RuntimeError: engine 3 vanished"
    assert "Traceback" in rs[0].details["traceback"]
    assert rs[1].figure == "42 ms"
    report = json.loads((tmp_path / "gpu_proof.json").read_text())
    assert gpu_proof.validate_report(report) == [] and report["exit_code"] == 1
    assert (tmp_path / "gpu_proof.md").exists() and len(said) == 4


def test_checks_after_the_budget_are_skipped_saying_so(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_proof, "unavailable_reason", lambda: None)
    monkeypatch.setattr(gpu_proof, "_gpus", lambda: [])
    checks = [Check("a", "passes", _passes)]
    (r,) = gpu_proof.run_all(tmp_path, budget=-1, checks=checks, echo=lambda s: None)
    assert r.status == SKIP and "budget" in r.reason


def test_every_check_is_listed_once_with_a_function():
    paths = [c.path for c in gpu_proof.CHECKS]
    assert len(paths) == len(set(paths)) == 9
    assert all(callable(c.run) and c.what for c in gpu_proof.CHECKS)


# ---- the checks' judgements (pure) --------------------------------------------------


def _probe(**over):
    p = {
        "tensor_device": "cuda:0",
        "current_device": 0,
        "gpucell_device": "cuda",
        "env": {
            "CUDA_VISIBLE_DEVICES": "1,0",
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "OMP_NUM_THREADS": "4",
        },
        "affinity": [4, 5, 6, 7],
        "device_count": 2,
        "name": "NVIDIA H100",
        "uuid": "abcd-1234",
        "memory_total": 80 * 2**30,
    }
    p.update(over)
    return p


PLAN = {
    "CUDA_VISIBLE_DEVICES": "1,0",
    "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
    "OMP_NUM_THREADS": "4",
}
NVML = {"name": "NVIDIA H100", "uuid": "GPU-ABCD-1234", "memory_total": 81 * 2**30}


def test_pinning_as_planned_has_no_problem():
    assert gpu_proof.pin_problems("e0", _probe(), PLAN, (4, 5, 6, 7), (), NVML) == []
    # no near cores known: the engine keeps the kernel's affinity
    assert gpu_proof.pin_problems("e0", _probe(), PLAN, (), [4, 5, 6, 7], NVML) == []


@pytest.mark.parametrize(
    "probe, says",
    [
        (_probe(tensor_device="cuda:1"), ".cuda() lands on cuda:1"),
        (_probe(gpucell_device="cpu"), "gpucell.device() is cpu"),
        (_probe(env={**PLAN, "CUDA_VISIBLE_DEVICES": "0,1"}), "planned '1,0'"),
        (_probe(env={**PLAN, "CUDA_DEVICE_ORDER": None}), "CUDA_DEVICE_ORDER"),
        (_probe(affinity=[0, 1]), "CPU affinity [0, 1]"),
        (_probe(device_count=1), "torch sees 1 GPUs"),
        (_probe(name="NVIDIA A100"), "NVML's GPU is 'NVIDIA H100'"),
        (_probe(uuid="ffff-0000"), "UUID ffff-0000"),
        (_probe(memory_total=40 * 2**30), "ratio 0.494"),
    ],
)
def test_pinning_problems_say_what_differs(probe, says):
    problems = gpu_proof.pin_problems("e0", probe, PLAN, (4, 5, 6, 7), (), NVML)
    assert len(problems) == 1 and says in problems[0], problems


class _Gpu:
    def __init__(self, index: int, name: str, memory_total: int) -> None:
        self.index, self.name, self.memory_total = index, name, memory_total


def test_oom_message_from_gpucell_is_accepted_and_gaps_are_named():
    from gpucell.engine.worker import describe_oom

    gpus = [_Gpu(0, "NVIDIA H100", 80 * 2**30), _Gpu(1, "NVIDIA H100", 80 * 2**30)]
    asked = 160 * 2**30
    note = describe_oom(
        "CUDA out of memory. Tried to allocate 160.00 GiB. GPU 0 has ...",
        "NVIDIA H100 (GPU 1)",
        int(79.6 * 2**30),
        78 * 2**30,
        2**20,
    )
    assert gpu_proof.oom_problems(note, gpus, asked) == []
    problems = gpu_proof.oom_problems("CUDA out of memory.", gpus, asked)
    assert len(problems) == 3
    wrong = gpu_proof.oom_problems(note, gpus, 2 * asked)
    assert wrong == ["asked for 160.00 GiB, the cell asked 320.00 GiB"]


def test_overlap_figures():
    t = {"base": 0.1, "compute": 0.5, "copy": 0.4, "async": 0.6, "sync": 0.8}
    f = gpu_proof.overlap_figures(t)
    assert f["sum"] == pytest.approx(0.8)  # 0.1 + 0.4 of compute + 0.3 of copy
    assert f["hidden"] == pytest.approx(0.2 / 0.3)
    assert f["gain"] == pytest.approx(0.8 / 0.6)


def test_sample_figures_count_ok_samples_of_each_engine_in_the_window():
    from gpucell.protocol.telemetry import DeviceSample

    def s(engine, t, util=50.0, state="ok"):
        return DeviceSample(
            engine, "h", "gpu", 0, "G", t, util, 2**30, state=state, pid=1
        )

    samples = [s(0, 10.0), s(0, 10.5, 90.0), s(0, 11.0, state="error"), s(0, 20.0)]
    samples += [s(1, 10.2, None)]
    got = gpu_proof.sample_figures(samples, [0, 1, 2], 10.0, 12.0)
    assert got[0] == {"samples": 2, "hz": 1.0, "max_util": 90.0, "max_mem": 2**30}
    assert got[1]["max_util"] == 0.0 and got[1]["samples"] == 1
    assert got[2]["samples"] == 0


def test_scaling_judgement():
    assert gpu_proof.scaling_problems(2.0, {1: 2.2, 2: 1.2, 4: 0.8}) == []
    slow = gpu_proof.scaling_problems(2.0, {1: 3.5, 2: 2.1, 4: 2.4})
    assert len(slow) == 2 and "1 engine took 3.50 s" in slow[0]


def test_spread_same_and_uneven():
    assert gpu_proof.spread([5.0, 4.5, 5.0]) == pytest.approx(0.1)
    assert gpu_proof.spread([0.0, 0.0]) == 0.0
    ks = gpu_proof.uneven(100)
    assert min(ks) == 1 and max(ks) == 13 and len(set(ks)) == 13
    import torch

    a = [torch.ones(3), {"k": 1.0}, (2, "x")]
    assert gpu_proof.same(a, [torch.ones(3), {"k": 1.0 + 1e-9}, (2, "x")])
    assert not gpu_proof.same(a, [torch.ones(3) * 2, {"k": 1.0}, (2, "x")])
    assert not gpu_proof.same([torch.ones(3)], [torch.ones(3, dtype=torch.float64)])
    assert not gpu_proof.same([1.0], (1.0,))


def test_modules_and_optimizers_are_the_same_by_class_and_state():
    """The sweep's `net` and `opt` come back from the engines as CPU copies of the
    serial run's CUDA objects: equal state is what the proof asks of them."""
    import torch

    torch.manual_seed(0)
    a = torch.nn.Linear(4, 2)
    b = torch.nn.Linear(4, 2)
    b.load_state_dict(a.state_dict())
    assert gpu_proof.same(a, b)
    with torch.no_grad():
        b.weight[0, 0] += 1
    assert not gpu_proof.same(a, b)
    assert not gpu_proof.same(a, torch.nn.Sequential(torch.nn.Linear(4, 2)))
    oa = torch.optim.SGD(a.parameters(), lr=0.1)
    ob = torch.optim.SGD(b.parameters(), lr=0.1)
    assert gpu_proof.same(oa, ob)
    assert not gpu_proof.same(oa, torch.optim.SGD(b.parameters(), lr=0.2))
    assert gpu_proof._cpu_tensors_only(a) and gpu_proof._cpu_tensors_only(oa)


def test_the_kernels_own_items_are_not_results_to_check_for_cuda():
    """The loop variable ends as the kernel's last item, which may be a CUDA tensor
    in a kernel that used CUDA; only values the engines made must be CPU."""
    import torch

    xs = [torch.ones(2), torch.ones(2)]
    ns = {"xs": xs}
    kept = gpu_proof._kernel_objects(ns, ["xs"])
    assert id(xs[-1]) in kept and id(xs) in kept
    assert gpu_proof._compare("c", {"x": xs[-1]}, {"x": xs[-1]}, kept) == []
    assert gpu_proof._compare("c", {"y": 1.0}, {"y": 2.0}, kept) == [
        "c: y differs from the serial run's"
    ]


def test_mig_figures_need_discovery_to_offer_what_nvml_reports():
    from gpucell.devices.nvml import GpuInfo, MigInfo
    from gpucell.protocol.devices import Device

    whole = GpuInfo(0, "H100", "GPU-a", 80 << 30)
    sliced = GpuInfo(
        1,
        "A100",
        "GPU-b",
        80 << 30,
        mig_enabled=True,
        migs=(MigInfo(0, "A100 MIG 1g.10gb", "MIG-x", 10 << 30),),
    )
    offered = [Device("gpu", 0, "H100", "GPU-a"), Device("gpu", 1, "A100 MIG", "MIG-x")]
    figure, problems = gpu_proof.mig_figures([whole, sliced], offered)
    assert problems == [] and "GPU 0: MIG off" in figure and "1 slice(s)" in figure
    _, problems = gpu_proof.mig_figures([whole, sliced], offered[:1])
    assert problems == ["slice MIG-x of GPU 1 not discovered"]
