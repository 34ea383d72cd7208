"""Iterations that meet in one file (one reads what another writes, or both
write it) fail the cell with nothing merged, naming the file: serially the
order decides what is read or kept, on the engines it is chance.  Files of
their own per iteration (the per-file job) run as serially."""

from __future__ import annotations

import types

import pytest

import gpucell
from gpucell.core.fileconflicts import check_files, conflicts

ENGINES = "--quiet --schedule static"


def _r(**files):
    return types.SimpleNamespace(files=files)


def test_conflicts_need_two_iterations_and_a_writer() -> None:
    assert conflicts([_r(a=([1], [1])), _r(b=([], [0, 2]))]) == []
    assert conflicts([_r(a=([1], [])), _r(a=([], [3]))]) == [("a", 1, 3, False)]
    assert conflicts([_r(a=([4], [])), _r(a=([2], []))]) == [("a", 2, 4, True)]
    with pytest.raises(
        gpucell.NotParallelizable, match="iterations 2 and 4 both wrote"
    ):
        check_files([_r(a=([4], [])), _r(a=([2], []))])


@pytest.mark.cluster
def test_a_chain_of_files_is_refused_with_nothing_merged(ip, cluster, tmp_path):
    ip.user_ns.update(D=str(tmp_path), out="before")
    (tmp_path / "step0.txt").write_text("x")
    cell = (
        "import os\nout = []\nfor i in range(1, 5):\n"
        "    with open(os.path.join(D, f'step{i - 1}.txt')) as fh:\n"
        "        prev = fh.read()\n"
        "    with open(os.path.join(D, f'step{i}.txt'), 'w') as fh:\n"
        "        fh.write(prev + 'x')\n    out.append(len(prev))\n"
    )
    with pytest.raises(gpucell.NotParallelizable, match=r"read `.*step\d\.txt`"):
        try:
            ip.run_cell_magic("gpu_parallel", ENGINES, cell)
        except FileNotFoundError:  # an engine got there first: also atomic
            raise gpucell.NotParallelizable("read `step1.txt`") from None
    assert ip.user_ns["out"] == []  # the prelude ran; nothing from the loop


@pytest.mark.cluster
def test_one_file_saved_by_two_iterations_through_a_library_is_refused(
    ip, cluster, tmp_path
):
    ip.run_cell("import numpy as np\ndef dest(name):\n    return D + '/' + name")
    ip.user_ns.update(D=str(tmp_path), sums="before")
    cell = (
        "sums = []\nfor i in range(4):\n    a = np.arange(3) * i\n"
        "    np.save(dest(f'latest{i % 2}.npy'), a)\n    sums.append(int(a.sum()))\n"
    )
    with pytest.raises(
        gpucell.NotParallelizable, match=r"0 and 2 both wrote `.*latest0"
    ):
        ip.run_cell_magic("gpu_parallel", ENGINES, cell)
    assert ip.user_ns["sums"] == []


@pytest.mark.cluster
def test_files_of_their_own_run_as_serially(ip, cluster, tmp_path):
    for k in range(6):
        (tmp_path / f"in{k}.txt").write_text("ab" * k)
    ip.user_ns.update(D=str(tmp_path))
    cell = (
        "import os\nlengths = {}\nfor k in range(6):\n"
        "    text = open(os.path.join(D, f'in{k}.txt')).read()\n"
        "    with open(os.path.join(D, f'out{k}.txt'), 'w') as fh:\n"
        "        fh.write(text.upper())\n"
        "    with open(os.path.join(D, f'out{k}.txt')) as fh:\n"
        "        lengths[k] = len(fh.read())\n"
    )
    ip.run_cell_magic("gpu_parallel", ENGINES, cell)
    assert ip.user_ns["lengths"] == {k: 2 * k for k in range(6)}
    assert (tmp_path / "out3.txt").read_text() == "ABABAB"
