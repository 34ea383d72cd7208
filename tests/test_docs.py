"""The docs cite only what the repository has."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# a repository file named in backticks: a folder of the repo, then a file name
CITED = re.compile(r"`((?:bench|docs|examples|tests|gpucell)/[\w./-]+\.\w+)`")


def _tracked() -> set[str]:
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(out.split())


def test_readme_cites_only_files_in_the_repository():
    text = (ROOT / "README.md").read_text()
    cited = set(CITED.findall(text))
    assert "examples/notebooks/quickstart.ipynb" in cited  # the pattern finds some
    missing = sorted(cited - _tracked())
    assert not missing, f"README.md cites files git does not have: {missing}"
