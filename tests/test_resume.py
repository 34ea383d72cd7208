"""Never lose finished work: keep chunks of an unfinished run, ``--resume`` the rest.

Each test interrupts (or fails) a real run on a real cluster, then resumes it and
compares the namespace with the serial cell's, asserting from ``gpucell.last_run``
that only the missing iterations ran the second time.
"""

from __future__ import annotations

import _thread
import os
import threading
import time

import pytest

import gpucell
from gpucell.errors import ResumeRefused
from gpucell.kernel.session import current, using

pytestmark = pytest.mark.cluster

CELL = (
    "import time\nout = []\ntotal = 0\nfor i in range(40):\n"
    "    time.sleep(0.05)\n    out.append(i * scale)\n    total += i\n"
)
SERIAL_OUT = [i * 3 for i in range(40)]


@pytest.fixture
def fresh(ip, private_cluster):
    for k in ("out", "total", "scale"):
        ip.user_ns.pop(k, None)
    ip.user_ns["scale"] = 3
    with using():  # a session of its own: no cell kept from another test
        yield ip


def _interrupt_after(
    ip, cell: str, chunks: int, line: str = "", chunksize: int = 2
) -> None:
    """Run ``cell`` and press the stop button once ``chunks`` chunks are done
    (watched from another thread, as a user watches the progress bar)."""
    before = gpucell.last_run
    stop = threading.Event()

    def watch() -> None:
        # pressed again while the run still runs: an interrupt that lands in a
        # C finaliser (pyzmq's Frame.__dealloc__) is swallowed there, as a
        # user's first press of the stop button occasionally is
        last = 0.0
        while not stop.wait(0.01):
            r = gpucell.last_run
            if r is before or r is None or r.done_chunks() < chunks:
                continue
            if r.status != "running":
                return
            if time.monotonic() - last > 0.5:
                last = time.monotonic()
                _thread.interrupt_main()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            ip.run_cell_magic(
                "gpu_parallel",
                f"--quiet --schedule dynamic --chunksize {chunksize} {line}",
                cell,
            )
    finally:
        stop.set()
        t.join()


def _ran(record) -> set[int]:
    return {
        i for c in record.chunks if c.state == "done" for i in range(c.start, c.stop)
    }


def test_an_interrupted_cell_resumes_running_only_the_missing_iterations(fresh, capsys):
    _interrupt_after(fresh, CELL, 6)
    first = _ran(gpucell.last_run)
    assert 0 < len(first) < 40
    assert fresh.user_ns["out"] == []  # the prelude ran; nothing merged
    said = capsys.readouterr().out
    assert f"{len(first)} of 40 iterations finished and are kept" in said
    assert "`%%gpu_parallel --resume` runs only" in said
    fresh.run_cell_magic("gpu_parallel", "--quiet --resume", CELL)
    assert fresh.user_ns["out"] == SERIAL_OUT
    assert fresh.user_ns["total"] == sum(range(40))
    second = _ran(gpucell.last_run)
    assert second == set(range(40)) - first  # only the missing ones ran
    assert sum(b - a for a, b in gpucell.last_run.resumed) == len(first)
    assert (
        f"{len(first)} kept from an unfinished run"
        in gpucell.last_run.timeline().title()
    )
    assert "resuming: " in capsys.readouterr().out
    # merged: nothing is kept any more, a second --resume runs everything
    fresh.run_cell_magic("gpu_parallel", "--quiet --resume", CELL)
    assert _ran(gpucell.last_run) == set(range(40))
    assert fresh.user_ns["out"] == SERIAL_OUT


def test_a_changed_input_refuses_to_resume_naming_it(fresh):
    _interrupt_after(fresh, CELL, 6)
    fresh.user_ns["scale"] = 4
    with pytest.raises(ResumeRefused, match=r"`scale` changed"):
        fresh.run_cell_magic("gpu_parallel", "--quiet --resume", CELL)
    assert fresh.user_ns["out"] == []
    changed = CELL.replace("total += i", "total += 2 * i")
    fresh.user_ns["scale"] = 3
    with pytest.raises(ResumeRefused, match="the cell's code changed"):
        fresh.run_cell_magic("gpu_parallel", "--quiet --resume", changed)
    with pytest.raises(ResumeRefused, match="--seed is 1, it was None"):
        fresh.run_cell_magic("gpu_parallel", "--quiet --resume --seed 1", CELL)


def test_an_iteration_error_keeps_the_other_chunks(fresh, tmp_path):
    flag = tmp_path / "fail"
    flag.write_text("")
    fresh.user_ns["flag"] = str(flag)
    cell = (
        "import os\nout = []\nfor i in range(30):\n"
        "    if i == 25 and os.path.exists(flag):\n"
        "        raise RuntimeError('transient')\n    out.append(i)\n"
    )
    with pytest.raises(RuntimeError, match="transient"):
        fresh.run_cell_magic(
            "gpu_parallel", "--quiet --chunksize 5 --schedule dynamic", cell
        )
    first = _ran(gpucell.last_run)
    assert 25 not in first
    os.unlink(flag)  # the cause is gone (a full disk, a busy device...)
    fresh.run_cell_magic(
        "gpu_parallel", "--quiet --chunksize 5 --schedule dynamic --resume", cell
    )
    assert fresh.user_ns["out"] == list(range(30))
    assert _ran(gpucell.last_run) == set(range(30)) - first


def test_a_checkpoint_survives_losing_kernel_memory_and_is_removed_after(
    fresh, tmp_path
):
    ckpt = tmp_path / "ckpt"
    _interrupt_after(fresh, CELL, 6, f"--checkpoint {ckpt}")
    first = _ran(gpucell.last_run)
    (folder,) = ckpt.iterdir()
    assert (folder / "cell.json").exists()
    assert len(list(folder.glob("chunk-*.bin"))) == len(
        [c for c in gpucell.last_run.chunks if c.state == "done"]
    )
    current().kept.clear()  # what a kernel restart loses
    fresh.run_cell_magic("gpu_parallel", f"--quiet --resume --checkpoint {ckpt}", CELL)
    assert fresh.user_ns["out"] == SERIAL_OUT
    assert _ran(gpucell.last_run) == set(range(40)) - first
    assert not ckpt.exists()  # removed once merged


def test_a_damaged_checkpoint_file_is_run_again_never_merged(fresh, tmp_path, capsys):
    ckpt = tmp_path / "ckpt"
    _interrupt_after(fresh, CELL, 6, f"--checkpoint {ckpt}")
    first = _ran(gpucell.last_run)
    (folder,) = ckpt.iterdir()
    victim = sorted(folder.glob("chunk-*.bin"))[0]
    _, a, b = victim.stem.split("-")
    data = victim.read_bytes()
    victim.write_bytes(data[: len(data) // 2])  # a torn write
    current().kept.clear()
    capsys.readouterr()
    fresh.run_cell_magic("gpu_parallel", f"--quiet --resume --checkpoint {ckpt}", CELL)
    assert f"{victim.name} is damaged" in capsys.readouterr().out
    assert fresh.user_ns["out"] == SERIAL_OUT
    again = _ran(gpucell.last_run)
    assert set(range(int(a), int(b))) <= again
    assert again == set(range(40)) - (first - set(range(int(a), int(b))))


def test_resume_with_nothing_kept_runs_everything_and_says_so(fresh, capsys):
    fresh.run_cell_magic("gpu_parallel", "--quiet --resume", CELL)
    assert "nothing is kept for this cell" in capsys.readouterr().out
    assert fresh.user_ns["out"] == SERIAL_OUT


def test_out_of_device_memory_once_is_retried_and_the_cell_succeeds(
    fresh, tmp_path, capsys
):
    marker = tmp_path / "oom-once"
    fresh.user_ns["marker"] = str(marker)
    cell = (
        "import os, torch\nout = []\nfor i in range(12):\n"
        "    if i == 5 and not os.path.exists(marker):\n"
        "        open(marker, 'w').close()\n"
        "        raise torch.cuda.OutOfMemoryError('CUDA out of memory. Tried to "
        "allocate 2.00 GiB')\n    out.append(i)\n"
    )
    fresh.run_cell_magic(
        "gpu_parallel", "--quiet --chunksize 3 --schedule dynamic", cell
    )
    assert fresh.user_ns["out"] == list(range(12))
    said = capsys.readouterr().out
    assert "iteration 5 ran out of device memory on engine" in said
    assert "retrying iterations 3-5 on the same engine" in said
    states = [(c.start, c.state) for c in gpucell.last_run.chunks if c.start == 3]
    assert ("failed" in [s for _a, s in states]) and ("done" in [s for _a, s in states])


def test_out_of_memory_every_time_fails_after_two_retries(fresh, capsys):
    cell = (
        "import torch\nout = []\nfor i in range(6):\n    if i == 4:\n"
        "        raise torch.cuda.OutOfMemoryError('CUDA out of memory.')\n"
        "    out.append(i)\n"
    )
    with pytest.raises(torch_oom()):
        fresh.run_cell_magic(
            "gpu_parallel", "--quiet --chunksize 2 --schedule dynamic", cell
        )
    said = capsys.readouterr().out
    assert "on the same engine" in said and "on engine" in said.split("same engine")[1]
    assert fresh.user_ns["out"] == []


def torch_oom():
    import torch

    return torch.cuda.OutOfMemoryError


# -- exactly once (issue 29) ------------------------------------------------------


def test_overlapping_checkpoint_files_of_two_runs_are_merged_once(
    fresh, tmp_path, capsys
):
    ckpt = tmp_path / "ckpt"
    _interrupt_after(fresh, CELL, 5, f"--checkpoint {ckpt}")  # chunks of 2
    (folder,) = ckpt.iterdir()
    saved = {p.name: p.read_bytes() for p in folder.glob("chunk-*.bin")}
    current().kept.clear()
    # a second run with other chunks into the same folder, stopped too
    _interrupt_after(fresh, CELL, 3, f"--checkpoint {ckpt}", chunksize=3)
    for name, data in saved.items():  # the first run's files come back beside them
        (folder / name).write_bytes(data)
    current().kept.clear()
    capsys.readouterr()
    fresh.run_cell_magic("gpu_parallel", f"--quiet --resume --checkpoint {ckpt}", CELL)
    assert fresh.user_ns["out"] == SERIAL_OUT
    assert fresh.user_ns["total"] == sum(range(40))
    out = capsys.readouterr().out
    assert "overlap ones kept already" in out
    kept = int(out.split("resuming: ")[1].split(" of ")[0])
    assert kept <= 40


def test_a_checkpoint_file_under_another_range_s_name_is_not_merged(
    fresh, tmp_path, capsys
):
    ckpt = tmp_path / "ckpt"
    _interrupt_after(fresh, CELL, 6, f"--checkpoint {ckpt}")
    (folder,) = ckpt.iterdir()
    files = sorted(folder.glob("chunk-*.bin"))
    victim = files[0]
    moved = folder / "chunk-000000000038-000000000040.bin"
    victim.rename(moved)  # iterations 0-1's results named as 38-39's
    current().kept.clear()
    capsys.readouterr()
    fresh.run_cell_magic("gpu_parallel", f"--quiet --resume --checkpoint {ckpt}", CELL)
    assert "not the iterations its name says" in capsys.readouterr().out
    assert fresh.user_ns["out"] == SERIAL_OUT


def test_a_checkpoint_folder_others_may_write_is_refused_before_the_prelude(
    fresh, tmp_path
):
    from gpucell.errors import CheckpointRefused

    ckpt = tmp_path / "shared"
    ckpt.mkdir()
    ckpt.chmod(0o777)
    fresh.user_ns.pop("ran", None)
    with pytest.raises(CheckpointRefused, match="writable by others"):
        fresh.run_cell_magic(
            "gpu_parallel", f"--quiet --checkpoint {ckpt}", "ran = True\n" + CELL
        )
    assert "ran" not in fresh.user_ns  # the prelude did not run
    (ckpt / "x").write_text("")
    with pytest.raises(CheckpointRefused, match="is not a folder"):
        fresh.run_cell_magic("gpu_parallel", f"--quiet --checkpoint {ckpt / 'x'}", CELL)


def test_a_new_run_into_a_checkpoint_folder_drops_the_old_run_s_chunks(fresh, tmp_path):
    ckpt = tmp_path / "ckpt"
    _interrupt_after(fresh, CELL, 6, f"--checkpoint {ckpt}")
    (folder,) = ckpt.iterdir()
    old = {p.name for p in folder.glob("chunk-*.bin")}
    assert old
    current().kept.clear()
    _interrupt_after(fresh, CELL, 2, f"--checkpoint {ckpt}")  # not --resume
    new = {p.name for p in folder.glob("chunk-*.bin")}
    assert len(new) == len([c for c in gpucell.last_run.chunks if c.state == "done"])
