"""Opens the engines note however ``open`` was reached (engine/fileaccess.py):
``os.open``, ``from io import open as o``, a library's module-level alias of
``open`` hold the function itself, which patching ``builtins.open`` missed;
two iterations writing one file through them were merged in engine order,
silently.  Python's audit event ``open`` sees them all."""

from __future__ import annotations

import io
import os

import pytest

import gpucell
from gpucell.engine.fileaccess import FileAccess

_open_alias = io.open  # as a library binds it at import time


class _Where:
    def __init__(self) -> None:
        self.i: int | None = 0

    def current(self) -> int | None:
        return self.i


def test_every_way_to_open_is_noted_in_its_iteration(tmp_path) -> None:
    w = _Where()
    a, b, c = (str(tmp_path / n) for n in ("a.txt", "b.bin", "c.txt"))
    with FileAccess(w) as fa:
        with _open_alias(a, "w") as fh:
            fh.write("x")
        w.i = 1
        os.close(os.open(b, os.O_WRONLY | os.O_CREAT))
        os.close(os.open(a, os.O_RDONLY))
        with open(c, "a"):
            pass
        w.i = None  # (between iterations: nothing is noted)
        with open(c, "w"):
            pass
    folder = str(tmp_path) + os.sep  # (files made in it: its listing changes)
    assert fa.files == {a: ([0], [1]), b: ([1], []), c: ([1], []), folder: ([0, 1], [])}
    with open(tmp_path / "after.txt", "w"):  # the chunk is over
        pass
    assert len(fa.files) == 4


def test_an_import_bytecode_cache_is_not_a_file_the_loop_shares(tmp_path) -> None:
    w = _Where()
    with FileAccess(w) as fa:
        os.close(os.open(tmp_path / "__pycache__.txt", os.O_WRONLY | os.O_CREAT))
        (tmp_path / "__pycache__").mkdir()
        with open(tmp_path / "__pycache__" / "m.cpython-311.pyc.123", "wb"):
            pass
    assert list(fa.files) == [str(tmp_path / "__pycache__.txt"), str(tmp_path) + os.sep]


def test_a_folder_listed_by_one_iteration_and_written_in_by_another_is_refused(
    tmp_path,
) -> None:
    from gpucell.core.fileconflicts import check_files, conflicts
    from gpucell.errors import NotParallelizable

    w = _Where()
    with FileAccess(w) as fa:
        n = len(os.listdir(tmp_path))  # `ckpt_{n}`: named by what is there
        with open(tmp_path / f"ckpt_{n}.txt", "w"):
            pass
        w.i = 1
        n = len(os.listdir(tmp_path))
        with open(tmp_path / f"ckpt_{n}.txt", "w"):
            pass
    assert conflicts([fa]) == [(str(tmp_path) + os.sep, 1, 0, False)]
    with pytest.raises(NotParallelizable, match="listed the folder"):
        check_files([fa])
    # each iteration making its own file in one folder, nothing listed: fine
    w.i = 0
    with FileAccess(w) as fb:
        for i in range(2):
            w.i = i
            with open(tmp_path / f"out_{i}.txt", "w"):
                pass
    assert conflicts([fb]) == []


@pytest.mark.cluster
def test_one_file_written_through_os_open_or_an_alias_is_refused(
    ip, cluster, tmp_path
) -> None:
    ip.run_cell(
        "import os\nfrom io import open as o\n"
        "def save(path, text):\n    with o(path, 'w') as fh:\n        fh.write(text)\n"
    ).raise_error()
    ip.user_ns.update(D=str(tmp_path), done="before")
    cells = [
        "done = []\nfor i in range(4):\n"
        "    fd = os.open(os.path.join(D, f'raw{i % 2}'), os.O_WRONLY | os.O_CREAT)\n"
        "    os.write(fd, b'%d' % i)\n    os.close(fd)\n    done.append(i)\n",
        "done = []\nfor i in range(4):\n"
        "    save(os.path.join(D, f'alias{i % 2}.txt'), str(i))\n    done.append(i)\n",
    ]
    for cell in cells:
        with pytest.raises(gpucell.NotParallelizable, match=r"0 and 2 both wrote"):
            ip.run_cell_magic("gpu_parallel", "--quiet --schedule static", cell)
        assert ip.user_ns["done"] == []  # the prelude ran; nothing merged
