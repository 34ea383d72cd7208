"""The layout by process is a rule, not a habit: each folder imports only the
layers below it (docs/ARCHITECTURE.md, "Layout").

Where a line runs is answered by its path: ``protocol/`` (both sides),
``core/`` (pure, kernel side), ``devices/`` (this host's devices, wherever it
runs), ``engine/`` (engine processes), ``cluster/`` and ``kernel/`` (the IPython
kernel), ``ui/`` (widgets).  These tests parse every module's imports, including
imports inside functions, so a lazy import cannot break a rule unseen.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "gpucell"

#: folder -> the gpucell folders (and top-level modules) it may import
ALLOWED: dict[str, set[str]] = {
    "protocol": {"errors", "protocol"},
    "core": {"errors", "protocol", "core"},
    "devices": {"errors", "protocol", "devices"},
    "engine": {"errors", "protocol", "devices", "engine"},
    "cluster": {"errors", "config", "protocol", "core", "devices", "engine", "cluster"},
    "ui": {"errors", "protocol", "core", "ui", "cluster"},
    "kernel": {
        "errors",
        "config",
        "protocol",
        "core",
        "devices",
        "engine",
        "cluster",
        "kernel",
        "ui",
    },
}
#: third-party packages only these folders may import
IPYPARALLEL_FOLDERS = {"kernel", "cluster"}


def _py(root: Path) -> list[Path]:
    """The package's Python modules (not the Lab extension's node_modules)."""
    return sorted(
        p for p in root.rglob("*.py") if "labextension" not in p.relative_to(PKG).parts
    )


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[tuple[str, int]]:
    """Every absolute module name ``path`` imports (``from pkg import name`` as
    ``pkg.name``), with its line."""
    tree = ast.parse(path.read_text(), filename=str(path))
    mod = _module_name(path)
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - (node.level - 1)]
                full = ".".join(base + ([node.module] if node.module else []))
            else:
                full = node.module or ""
            yield full, node.lineno
            for a in node.names:
                yield f"{full}.{a.name}", node.lineno


def _folder(path: Path) -> str | None:
    rel = path.relative_to(PKG).parts
    return rel[0] if len(rel) > 1 else None


def _layer_of(name: str) -> str | None:
    """``gpucell.core.merge`` -> ``core``; ``gpucell.errors`` -> ``errors``."""
    parts = name.split(".")
    if parts[0] != "gpucell" or len(parts) < 2:
        return None
    return parts[1]


def _known_layer(layer: str) -> bool:
    return (PKG / layer).is_dir() or (PKG / f"{layer}.py").is_file()


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_folder_imports_only_the_layers_below_it(folder: str) -> None:
    bad = []
    for path in _py(PKG / folder):
        for name, line in _imports(path):
            layer = _layer_of(name)
            if layer is None or not _known_layer(layer):
                continue  # stdlib, third party, or a name from gpucell/__init__
            if layer not in ALLOWED[folder]:
                bad.append(f"{path.relative_to(ROOT)}:{line}: {name}")
    assert not bad, f"gpucell/{folder}/ reaches outside its layers:\n" + "\n".join(bad)


def test_every_folder_has_a_rule() -> None:
    folders = {p.name for p in PKG.iterdir() if (p / "__init__.py").is_file()}
    assert folders <= set(ALLOWED) | {"labextension"}, folders - set(ALLOWED)


def test_only_kernel_and_cluster_import_ipyparallel() -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in _py(PKG)
        for name, line in _imports(path)
        if name.split(".")[0] == "ipyparallel"
        and _folder(path) not in IPYPARALLEL_FOLDERS
    ]
    assert not bad, "ipyparallel imported outside kernel/ and cluster/:\n" + "\n".join(
        bad
    )


def test_boot_imports_only_the_standard_library() -> None:
    """``python -m gpucell.cluster.boot`` runs before the engine's own imports:
    it must not pull in anything that could initialise CUDA or read config."""
    path = PKG / "cluster" / "boot.py"
    bad = [
        f"boot.py:{line}: {name}"
        for name, line in _imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and not name.startswith("__future__")
    ]
    assert not bad, "\n".join(bad)


def test_cluster_package_init_imports_nothing() -> None:
    """Importing ``gpucell.cluster.boot`` runs ``gpucell/cluster/__init__.py``
    first: it must stay empty of imports (ipyparallel, traitlets)."""
    assert not list(_imports(PKG / "cluster" / "__init__.py"))


def _loaded_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
        timeout=120,
    ).stdout
    return set(out.split())


def test_an_engine_loads_only_protocol_devices_and_engine_code() -> None:
    """What an engine's first chunk imports: no analysis, kernel, cluster or UI
    code, no traitlets, no IPython magics, no ipywidgets."""
    loaded = _loaded_after("import gpucell.engine.worker")
    ours = {m for m in loaded if m.startswith("gpucell.")}
    wrong = {
        m
        for m in ours
        if _layer_of(m) not in {"errors", "protocol", "devices", "engine"}
    }
    assert not wrong, sorted(wrong)
    heavy = {
        m
        for m in loaded
        if m.split(".")[0] in {"traitlets", "ipywidgets", "ipyparallel"}
        or m.startswith("IPython.core.magic")
    }
    assert not heavy, sorted(heavy)


MAGIC_MODULES = (
    "gpucell.kernel.magics",
    "gpucell.kernel.parallel_magic",
    "gpucell.kernel.distributed_magic",
)
LOAD_FUNCTIONS = ("load_ipython_extension", "unload_ipython_extension")


def _inside_load_functions(tree: ast.Module) -> set[int]:
    """Lines inside gpucell/__init__.py's extension load functions."""
    inside: set[int] = set()
    for f in tree.body:
        if isinstance(f, ast.FunctionDef) and f.name in LOAD_FUNCTIONS:
            inside.update(getattr(n, "lineno", 0) for n in ast.walk(f))
    return inside


def test_magics_are_imported_only_by_the_extension_loader() -> None:
    """Nothing depends on the magics: they are the thin top of the kernel side."""
    bad: list[str] = []
    for path in _py(PKG):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "gpucell/kernel/magics.py":
            continue  # the line magics register the %%gpu_parallel cell magic
        tree = ast.parse(path.read_text())
        is_init = rel == "gpucell/__init__.py"
        allowed = _inside_load_functions(tree) if is_init else set()
        for name, line in _imports(path):
            if any(name == m or name.startswith(m + ".") for m in MAGIC_MODULES):
                if line not in allowed:
                    bad.append(f"{rel}:{line}: {name}")
        for node in ast.walk(tree):  # lazy imports by name
            if isinstance(node, ast.Constant) and node.value in MAGIC_MODULES:
                if node.lineno not in allowed:
                    bad.append(f"{rel}:{node.lineno}: {node.value!r} (by name)")
    assert not bad, "magics imported outside the extension loader:\n" + "\n".join(bad)
