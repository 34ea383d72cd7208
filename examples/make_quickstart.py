"""Write examples/notebooks/quickstart.ipynb from the cells below (kept as code so
the notebook diff stays reviewable).  Run: python examples/make_quickstart.py"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    (
        "md",
        "# gpucell quickstart\n\nRun a cell's loop on every GPU of a cluster. "
        "On a machine without GPUs, CPU engines stand in for them, so this "
        "notebook runs anywhere.",
    ),
    ("code", "%load_ext gpucell"),
    (
        "md",
        "Start a local cluster: one engine per GPU, pinned to its device "
        "(one per core, each with its share of threads, when there is no GPU).",
    ),
    ("code", "%gpu_cluster start"),
    ("code", "%gpu_cluster status"),
    (
        "md",
        "Each engine knows its device: `cuda` (its own GPU, as `cuda:0`) on a GPU "
        "engine, `cpu` otherwise.",
    ),
    (
        "code",
        "import gpucell\n"
        "rc = gpucell.current().client\n"
        "rc[:].apply_sync(lambda: str(__import__('gpucell').device()))",
    ),
    ("md", "The same as a Python API:"),
    ("code", "[(e.id, e.device, e.name, e.threads) for e in gpucell.status()]"),
    ("code", "%gpu_cluster stop"),
]


def build() -> nbformat.NotebookNode:
    nb = new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    for kind, src in CELLS:
        nb.cells.append(new_markdown_cell(src) if kind == "md" else new_code_cell(src))
    return nb


if __name__ == "__main__":
    out = Path(__file__).parent / "notebooks" / "quickstart.ipynb"
    nbformat.write(build(), out)
    print(f"wrote {out}")
