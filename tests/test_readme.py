"""README.md's two set-up commands stay true: CI runs the test one verbatim."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    block = re.search(r"## Set-up\n.*?```(?:bash|sh)?\n(.*?)```", text, re.S)
    assert block, "README.md needs a '## Set-up' section with one code block"
    return [
        line.strip()
        for line in block.group(1).splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def test_readme_has_exactly_two_setup_commands():
    cmds = _commands()
    assert len(cmds) == 2, cmds
    assert "examples/run_quickstart.py" in cmds[0]
    assert "pytest" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert _commands()[1] in [line.strip() for line in ci]


def test_quickstart_notebook_is_generated_from_its_script():
    import sys

    import nbformat

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from make_quickstart import build
    finally:
        sys.path.pop(0)
    on_disk = nbformat.read(ROOT / "examples/notebooks/quickstart.ipynb", as_version=4)
    assert [c.source for c in on_disk.cells] == [c.source for c in build().cells]
