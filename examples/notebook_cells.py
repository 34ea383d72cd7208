"""Build a notebook from (kind, source[, tags]) rows: the example writers share it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

Row = Sequence[object]  # ("md" | "code", source) or ("code", source, tags)


def notebook(rows: Iterable[Row]) -> nbformat.NotebookNode:
    """A Python 3 notebook with one cell per row ("md" rows are markdown)."""
    nb = new_notebook()
    nb.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    for kind, src, *tags in rows:
        if kind == "md":
            nb.cells.append(new_markdown_cell(src))
            continue
        cell = new_code_cell(src)
        if tags:
            cell.metadata["tags"] = list(tags[0])  # type: ignore[call-overload]
        nb.cells.append(cell)
    return nb
