"""The main job: execute the quickstart notebook headless on a local cluster of this
machine's engines, and write the executed copy plus a short summary.

Usage: python examples/run_quickstart.py [notebook]
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError

HERE = Path(__file__).parent


def _strip_ansi(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _text(output: dict) -> str:
    if output.get("output_type") == "stream":
        return output.get("text", "")
    data = output.get("data", {})
    return data.get("text/plain", "")


def main(argv: list[str]) -> int:
    src = Path(argv[0]) if argv else HERE / "notebooks" / "quickstart.ipynb"
    executed = src.with_name(src.stem + ".executed.ipynb")
    nb = nbformat.read(src, as_version=4)
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(src.parent)}},
    )
    t0 = time.perf_counter()
    error = None
    detail = ""
    try:
        client.execute()
    except CellExecutionError as e:
        # which cell, and what it raised: the first line alone says neither
        error = f"{e.ename}: {e.evalue}".strip()
        detail = _strip_ansi(str(e))
    wall = time.perf_counter() - t0
    nbformat.write(nb, executed)
    code = [c for c in nb.cells if c.cell_type == "code"]
    ran = [c for c in code if c.get("execution_count")]
    gpucell_lines = [
        line
        for c in code
        for o in c.get("outputs", [])
        for line in _text(o).splitlines()
        if line.startswith("gpucell:")
    ]
    summary = {
        "notebook": str(src),
        "executed_copy": str(executed),
        "code_cells": len(code),
        "cells_run": len(ran),
        "wall_seconds": round(wall, 2),
        "error": error,
        "error_detail": detail[-4000:] or None,
        "gpucell": gpucell_lines,
    }
    (executed.with_suffix(".summary.json")).write_text(json.dumps(summary, indent=2))
    print(f"{src.name}: {len(ran)}/{len(code)} code cells ran in {wall:.1f} s")
    for line in gpucell_lines:
        print("  " + line)
    print(f"executed copy: {executed}")
    if error:
        print(f"FAILED: {error}")
        print(detail[-4000:])
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
