"""A throwaway JupyterLab server for the browser tests.

It listens on loopback only, on a free port, with a random token, and keeps every
Jupyter and IPython directory under one temporary folder, so the user's own
settings, kernels and workspaces neither leak in nor get written to.  Its kernel is
this interpreter (the project's virtualenv), declared as the ``python3`` kernelspec
in the private data dir.  :meth:`LabServer.stop` ends the server and everything it
started (kernels, and the engines and controllers those started).
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import quote

import psutil

__all__ = ["LabServer", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LabServer:
    """``jupyter lab`` on ``127.0.0.1:<port>``, rooted at ``base / "root"``.

    Parameters
    ----------
    base
        An empty folder the server owns (a pytest ``tmp_path``).
    env
        Extra environment variables for the server and its kernels.
    app
        ``"lab"`` (JupyterLab) or ``"notebook"`` (Jupyter Notebook 7, the same
        server and lab extensions with Notebook's one-document pages).
    """

    def __init__(
        self, base: Path, env: dict[str, str] | None = None, app: str = "lab"
    ) -> None:
        if app not in ("lab", "notebook"):
            raise ValueError(f"LabServer app must be 'lab' or 'notebook', not {app!r}")
        self.app = app
        self.base = Path(base)
        self.root = self.base / "root"
        self.port = free_port()
        self.token = secrets.token_hex(16)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = self.base / "lab.log"
        self._extra_env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None

    # ------------------------------------------------------------- lifecycle

    def _env(self) -> dict[str, str]:
        dirs = {
            "JUPYTER_CONFIG_DIR": self.base / "config",
            "JUPYTER_DATA_DIR": self.base / "data",
            "JUPYTER_RUNTIME_DIR": self.base / "runtime",
            "IPYTHONDIR": self.base / "ipython",
            "JUPYTERLAB_SETTINGS_DIR": self.base / "lab-settings",
            "JUPYTERLAB_WORKSPACES_DIR": self.base / "lab-workspaces",
        }
        for d in dirs.values():
            d.mkdir(parents=True, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("JUPYTER")}
        env.update({k: str(v) for k, v in dirs.items()})
        # the venv's share/jupyter (lab extensions: ipywidgets' manager) stays on
        # the data path: jupyter_core always adds sys.prefix; say it explicitly
        env["JUPYTER_PATH"] = str(Path(sys.prefix) / "share" / "jupyter")
        env["JUPYTER_PLATFORM_DIRS"] = "1"
        env["PYTHONUNBUFFERED"] = "1"
        env.update(self._extra_env)
        return env

    def _write_kernelspec(self) -> None:
        spec = self.base / "data" / "kernels" / "python3"
        spec.mkdir(parents=True, exist_ok=True)
        (spec / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [
                        sys.executable,
                        "-m",
                        "ipykernel_launcher",
                        "-f",
                        "{connection_file}",
                    ],
                    "display_name": "Python 3 (ipykernel)",
                    "language": "python",
                    "metadata": {"debugger": False},
                }
            )
        )

    def _write_lab_settings(self) -> None:
        """No news pop-up, no update check: nothing reaches for the network and
        no toast covers the notebook in the screenshots."""
        d = self.base / "lab-settings" / "@jupyterlab" / "apputils-extension"
        d.mkdir(parents=True, exist_ok=True)
        (d / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False})
        )

    def start(self, timeout: float = 60.0) -> LabServer:
        self.root.mkdir(parents=True, exist_ok=True)
        env = self._env()
        self._write_kernelspec()
        self._write_lab_settings()
        cmd = [
            sys.executable,
            "-m",
            "jupyterlab" if self.app == "lab" else "notebook",
            "--no-browser",
            "--ip=127.0.0.1",
            f"--port={self.port}",
            "--port-retries=0",
            f"--IdentityProvider.token={self.token}",
            f"--ServerApp.root_dir={self.root}",
            "--ServerApp.open_browser=False",
            "--ServerApp.allow_remote_access=False",
            "--ServerApp.terminals_enabled=False",
        ]
        if self.app == "lab":
            cmd += [
                "--LabApp.news_url=None",
                "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
                "--LabApp.extension_manager=readonly",
            ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI containers run as root
        self._log = open(self.log_path, "wb")  # closed in stop()
        self.proc = subprocess.Popen(
            cmd,
            cwd=self.root,
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"jupyter lab exited with {self.proc.returncode}:\n" + self.log()
                )
            try:
                with urllib.request.urlopen(
                    f"{self.url}/api/status?token={self.token}", timeout=2
                ) as r:
                    if r.status == 200:
                        return self
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"jupyter lab did not answer in {timeout} s:\n" + self.log())

    def stop(self, timeout: float = 15.0) -> set[int]:
        """Shut the server down with everything it started.

        Returns the PIDs of processes that outlived a clean shutdown by 10 s (none,
        normally); they have been killed by then.
        """
        proc = self.proc
        if proc is None:
            return set()
        try:
            family = psutil.Process(proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            family = []
        if proc.poll() is None:
            # SIGTERM is jupyter_server's clean stop (it shuts its kernels
            # down, and the kernels take their engines with them).  Not two
            # SIGINTs: on a loaded host the second can arrive before the first
            # is handled, and the pair then reads as one, which asks "Shut down
            # this Jupyter server (y/[n])?" and waits for the timeout.
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        # stragglers: only processes this server started, named by PID
        _, stragglers = psutil.wait_procs(family, timeout=10)
        for p in stragglers:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(stragglers, timeout=5)
        self.proc = None
        self._log.close()
        return {p.pid for p in stragglers}

    def __enter__(self) -> LabServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- helpers

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def lab_url(self, path: str) -> str:
        """The Lab URL that opens ``path`` (relative to the root dir)."""
        return f"{self.url}/lab/tree/{quote(path)}?token={self.token}"

    def notebook_url(self, path: str) -> str:
        """The Notebook 7 URL that opens ``path`` (``app="notebook"``)."""
        return f"{self.url}/notebooks/{quote(path)}?token={self.token}"

    def descendants(self) -> set[int]:
        if self.proc is None:
            return set()
        try:
            return {
                p.pid for p in psutil.Process(self.proc.pid).children(recursive=True)
            }
        except psutil.NoSuchProcess:
            return set()
