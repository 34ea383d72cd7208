"""A release as users get it: the wheel built from the repo installs into a fresh
virtualenv, with no Node on PATH, and JupyterLab lists the prebuilt panel enabled.

The version is written once (gpucell/__init__.py, read by hatch); the panel's
package.json repeats it for npm and must agree.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import zipfile
from pathlib import Path

import pytest

import gpucell

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: hatchling (a test extra) brings tomli
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
LABEXT = "gpucell/labextension"


def test_version_is_written_once():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in meta["project"], "the version lives in gpucell/__init__.py"
    assert "version" in meta["project"]["dynamic"]
    assert meta["tool"]["hatch"]["version"]["path"] == "gpucell/__init__.py"
    assert re.fullmatch(r"\d+\.\d+\.\d+([ab]|rc|\.dev)?\d*", gpucell.__version__)
    package = json.loads((ROOT / LABEXT / "package.json").read_text())
    assert package["version"] == gpucell.__version__, (
        "gpucell/labextension/package.json's version must be gpucell.__version__"
    )


def test_classifiers_say_prebuilt_jupyterlab_4_extension():
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    want = {
        "Framework :: Jupyter",
        "Framework :: Jupyter :: JupyterLab",
        "Framework :: Jupyter :: JupyterLab :: 4",
        "Framework :: Jupyter :: JupyterLab :: Extensions",
        "Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt",
        "License :: OSI Approved :: BSD License",
    }
    assert want <= set(meta["classifiers"])
    low = meta["requires-python"].removeprefix(">=")
    assert f"Programming Language :: Python :: {low}" in meta["classifiers"]


def _why_no_build() -> str | None:
    for module, pkg in [
        ("build", "build"),
        ("hatchling", "hatchling"),
        ("hatch_jupyter_builder", "hatch-jupyter-builder"),
        ("jupyter_builder", "jupyter-builder"),
    ]:
        if importlib.util.find_spec(module) is None:
            return (
                f"building the wheel without network needs {pkg} installed "
                "(pip install -e '.[test]' brings it)"
            )
    if shutil.which("npm") is None:
        return (
            "building the wheel builds the panel, which needs Node.js >= 20.19 with "
            "npm (a wheel's users need no Node)"
        )
    return None


def _sources(dest: Path) -> None:
    """The repo's files as a fresh clone has them (plus new, unignored ones)."""
    names = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in names:
        if not raw:
            continue
        src = ROOT / os.fsdecode(raw)
        if not src.is_file():  # deleted in the work tree
            continue
        out = dest / os.fsdecode(raw)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, out)


def _link_node_modules(dest: Path) -> Path | None:
    """The repo's installed npm packages, hard-linked into the copy (its
    ``.package-lock.json``, which npm rewrites in place, copied): the build's
    ``npm install`` then checks them against the lock file in about a second
    instead of unpacking 829 packages (20 s); what it compiles is the copy's
    own sources.  ``None`` where the repo has none (npm installs them)."""
    src = ROOT / LABEXT / "node_modules"
    if not (src / ".package-lock.json").is_file() or not shutil.which("cp"):
        return None
    out = dest / LABEXT / "node_modules"
    subprocess.run(["cp", "-al", str(src), str(out)], check=True, timeout=120)
    (out / ".package-lock.json").unlink()
    shutil.copy2(src / ".package-lock.json", out / ".package-lock.json")
    return src


def _changed_since(folder: Path, marker: Path) -> list[str]:
    """Files under ``folder`` modified after ``marker`` was written."""
    found = subprocess.run(
        ["find", str(folder), "-newer", str(marker), "-type", "f"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return found[:10]


def _ignored_state() -> str:
    """What git ignores in the panel's folder, and when it changed."""
    rows = []
    for name in ("lib", "prebuilt", "node_modules"):
        p = ROOT / LABEXT / name
        rows.append(f"{name}:{p.stat().st_mtime_ns if p.exists() else None}")
    return " ".join(rows)


@pytest.mark.release
@pytest.mark.timeout(420)
def test_wheel_installs_without_node_and_lists_the_panel():
    why = _why_no_build()
    if why:
        pytest.skip(why)
    before = _ignored_state()
    with tempfile.TemporaryDirectory(prefix="gpucell-wheel-") as tmp:
        work = Path(tmp)
        src, dist, venv = work / "src", work / "dist", work / "venv"
        _sources(src)
        marker = work / "started"
        marker.write_text("")
        linked = _link_node_modules(src)
        # a release build: no isolation (so no download of the build backend),
        # npm installs and builds the panel in the copy, never in the repo; the
        # panel's build script runs `jupyter-builder`, from this venv's scripts
        scripts = sysconfig.get_paths()["scripts"]
        with_scripts = os.pathsep.join([scripts, os.environ.get("PATH", "")])
        build = subprocess.run(
            [sys.executable, "-m", "build", "--wheel", "--no-isolation"]
            + ["--outdir", str(dist), str(src)],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "PATH": with_scripts},
        )
        assert build.returncode == 0, build.stdout[-4000:] + build.stderr[-4000:]
        if linked is not None:  # nothing written through a link into the repo
            assert _changed_since(linked, marker) == []
        (wheel,) = dist.glob("gpucell-*.whl")
        assert wheel.name.startswith(f"gpucell-{gpucell.__version__}-py3-none-any")

        names = zipfile.ZipFile(wheel).namelist()
        share = f"gpucell-{gpucell.__version__}.data/data/share/jupyter/labextensions"
        shipped = {n.removeprefix(share + "/gpucell/") for n in names if share in n}
        assert {"package.json", "install.json", "static/style.js"} <= shipped
        assert "static/third-party-licenses.json" in shipped  # a production build
        assert any(re.fullmatch(r"static/remoteEntry\.\w+\.js", n) for n in shipped)
        assert not [n for n in names if n.endswith((".ts", ".tsx"))]
        assert not [n for n in names if "node_modules" in n or LABEXT in n]
        meta = zipfile.ZipFile(wheel).read(
            f"gpucell-{gpucell.__version__}.dist-info/METADATA"
        )
        assert b"Framework :: Jupyter :: JupyterLab :: Extensions :: Prebuilt" in meta

        # (no pip of its own: ensurepip costs seconds; this interpreter's pip
        # installs into it, --python)
        subprocess.run(
            [sys.executable, "-m", "venv", "--without-pip", str(venv)],
            check=True,
            timeout=120,
        )
        # a user's machine: no Node and nothing else on PATH, no index to reach
        env = {
            "PATH": str(venv / "bin"),
            "HOME": str(work),
            "LANG": "C.UTF-8",
            "PYTHONNOUSERSITE": "1",
        }
        py = str(venv / "bin" / "python")
        subprocess.run(
            [sys.executable, "-m", "pip", "--python", py, "install", "-q"]
            + ["--no-deps", "--no-index", str(wheel)],
            check=True,
            env=env,
            cwd=work,
            timeout=120,
        )
        # the dependencies (jupyterlab, ipyparallel, ...) are borrowed from this
        # interpreter's site-packages, after the venv's own: a plain path line does
        # not run the .pth files there, so this repo's editable gpucell stays out
        purelib = subprocess.run(
            [py, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout.strip()
        Path(purelib, "zz_borrowed_deps.pth").write_text(
            sysconfig.get_paths()["purelib"] + "\n"
        )
        where = subprocess.run(
            [py, "-c", "import gpucell; print(gpucell.__file__, gpucell.__version__)"],
            capture_output=True,
            text=True,
            env=env,
            cwd=work,
        )
        assert where.returncode == 0, where.stderr
        file, version = where.stdout.split()
        assert file.startswith(purelib) and version == gpucell.__version__

        listed = subprocess.run(
            [py, "-m", "jupyterlab.labextensions", "list"],
            capture_output=True,
            text=True,
            env=env,
            cwd=work,
            timeout=120,
        )
        out = re.sub(r"\x1b\[[0-9;]*m", "", listed.stdout + listed.stderr)
        assert listed.returncode == 0, out
        line = re.search(r"^\s*gpucell v(\S+) enabled\s+OK.*$", out, re.M)
        assert line, out
        assert line.group(1) == gpucell.__version__
        # found where the wheel put it, in the fresh venv's prefix
        section = out[: line.start()].rsplit("labextensions", 1)[0]
        assert str(venv) in section.splitlines()[-1], out
        _quickstart_runs_from(py, env, work, purelib)
    assert _ignored_state() == before, "the build touched the repo's panel build"


def _quickstart_runs_from(
    py: str, env: dict[str, str], work: Path, purelib: str
) -> None:
    """The README's main job (the quickstart notebook, headless, on a local
    cluster) with the wheel's gpucell: a last cell says which gpucell the
    notebook's kernel imported."""
    import nbformat

    nb = nbformat.read(ROOT / "examples/notebooks/quickstart.ipynb", as_version=4)
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "import gpucell\nprint('GPUCELL_FROM', gpucell.__file__)"
        )
    )
    copy = work / "quickstart.ipynb"
    nbformat.write(nb, copy)
    ran = subprocess.run(
        [py, str(ROOT / "examples/run_quickstart.py"), str(copy)],
        capture_output=True,
        text=True,
        env=env,
        cwd=work,
        timeout=300,
    )
    if ran.returncode != 0:
        errors = [
            "\n".join(o.get("traceback", [])[-6:])
            for c in nbformat.read(work / "quickstart.executed.ipynb", 4).cells
            for o in c.get("outputs", [])
            if o.get("output_type") == "error"
        ]
        raise AssertionError(ran.stdout[-2000:] + "\n".join(errors)[-4000:])
    summary = json.loads((work / "quickstart.executed.summary.json").read_text())
    assert summary["error"] is None and summary["cells_run"] == summary["code_cells"]
    executed = (work / "quickstart.executed.ipynb").read_text()
    assert f"GPUCELL_FROM {purelib}" in executed, executed[-2000:]


def test_a_gpucell_on_pythonpath_but_not_installed_starts_its_cluster():
    """A checkout on PYTHONPATH (no dist-info, so no entry points) must start a
    cluster: ipyparallel once took the name "gpucell" for the module and failed
    with a TraitError (seen on the GPU machine, where gpucell was not installed)."""
    code = (
        "import ipyparallel.traitlets as t\n"
        "t.entry_points = lambda group: []  # as if gpucell had no dist-info\n"
        "import gpucell\n"
        "c = gpucell.start_cluster(1, gpus='none', echo=lambda s: None)\n"
        "try:\n"
        "    print('ran', c.client[:].apply_sync(lambda: 6 * 7))\n"
        "finally:\n"
        "    gpucell.stop()\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ran [42]" in done.stdout
