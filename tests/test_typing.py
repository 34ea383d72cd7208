"""The pure core stays strictly typed, and the import graph stays one-directional.

STYLE.md asks for strict mypy on the pure core (analysis, merge, schedule,
topology, runstate, provenance).  The core must not reach up into the engine,
cluster or IPython layers, and the IPython magics are imported only by the
extension's load/unload functions.
"""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "gpucell"

STRICT_CORE = [
    "gpucell/analysis",
    "gpucell/merge.py",
    "gpucell/schedule.py",
    "gpucell/topology.py",
    "gpucell/runstate.py",
    "gpucell/provenance.py",
]


def test_pure_core_passes_strict_mypy() -> None:
    if importlib.util.find_spec("mypy") is None:
        pytest.skip("mypy is not installed (pip install -e '.[test]')")
    proc = subprocess.run(
        [sys.executable, "-m", "mypy", "--strict", *STRICT_CORE],
        cwd=ROOT,  # picks up [tool.mypy] in pyproject.toml
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --------------------------------------------------------------------------- #
# import graph
# --------------------------------------------------------------------------- #


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_package(name: str) -> bool:
    return (ROOT / name.replace(".", "/") / "__init__.py").is_file()


def _imports(path: Path, tree: ast.Module) -> Iterator[tuple[str, ast.AST]]:
    """Every absolute module name ``path`` (parsed as ``tree``) imports, with the
    importing node.  ``from pkg import name`` of one of our packages counts as
    importing ``pkg.name`` (the name may be a submodule; if not, it still comes
    from ``pkg/__init__.py``).
    """
    mod = _module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base = ".".join(base_parts[: len(base_parts) - (node.level - 1)])
                full = f"{base}.{node.module}" if node.module else base
            else:
                full = node.module or ""
            if _is_package(full):
                for a in node.names:
                    yield f"{full}.{a.name}", node
            else:
                yield full, node


def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def _core_files() -> list[Path]:
    return sorted((PKG / "analysis").glob("*.py")) + [
        PKG / "merge.py",
        PKG / "schedule.py",
    ]


def _core_may_import(name: str) -> bool:
    if name != "gpucell" and not name.startswith("gpucell."):
        return True  # stdlib / third party
    return (
        name == "gpucell.errors"
        or name.startswith("gpucell.errors.")
        or name == "gpucell.analysis"
        or name.startswith("gpucell.analysis.")
    )


def test_core_import_graph_is_one_directional() -> None:
    """analysis/, merge and schedule import from gpucell only errors and analysis."""
    bad = [
        f"{path.relative_to(ROOT)}:{node.lineno}: {name}"
        for path in _core_files()
        for name, node in _imports(path, _parse(path))
        if not _core_may_import(name)
    ]
    assert not bad, "the pure core reaches up the layers:\n" + "\n".join(bad)


MAGIC_MODULES = ("gpucell.magics", "gpucell.parallel_magic")
LOAD_FUNCTIONS = ("load_ipython_extension", "unload_ipython_extension")


def _inside_load_functions(tree: ast.Module) -> set[int]:
    """ids of the nodes inside gpucell/__init__.py's extension load functions."""
    inside: set[int] = set()
    for f in tree.body:
        if isinstance(f, ast.FunctionDef) and f.name in LOAD_FUNCTIONS:
            inside.update(id(n) for n in ast.walk(f))
    return inside


def test_magics_are_imported_only_by_the_extension_loader() -> None:
    bad: list[str] = []
    for path in sorted(PKG.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if rel.as_posix() == "gpucell/magics.py":
            # the line magics register the %%gpu_parallel cell magic themselves
            allowed: set[int] | None = None
        else:
            allowed = set()
        tree = _parse(path)
        if rel.as_posix() == "gpucell/__init__.py":
            allowed = _inside_load_functions(tree)
        for name, node in _imports(path, tree):
            if not any(name == m or name.startswith(m + ".") for m in MAGIC_MODULES):
                continue
            if allowed is None and name.startswith("gpucell.parallel_magic"):
                continue
            if allowed is not None and id(node) in allowed:
                continue
            bad.append(f"{rel}:{getattr(node, 'lineno', '?')}: {name}")
        # lazy imports by name (importlib.import_module("gpucell.magics"), _LAZY)
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Constant)
                and node.value in MAGIC_MODULES
                and not (allowed and id(node) in allowed)
            ):
                bad.append(f"{rel}:{node.lineno}: {node.value!r} (by name)")
    assert not bad, "IPython magics imported outside the extension loader:\n" + (
        "\n".join(bad)
    )
