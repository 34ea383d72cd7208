"""What gpucell writes where other local users can look (/dev/shm, the IPython
profile) is created O_EXCL|O_NOFOLLOW, 0600 (folders 0700), under names no one
can plant a link at: a link planted at the old, guessable ``<name>.<pid>.tmp``
is never followed (where ``fs.protected_symlinks`` is 0 it overwrote a file of
the user's), and a link at the final name is replaced, not written through."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from gpucell.cluster import profiles, shm_channel
from gpucell.engine import hostcopy
from gpucell.protocol import private, shm, wire


def mode(p: str | Path) -> int:
    return stat.S_IMODE(os.lstat(p).st_mode)


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file of the user's that a planted link points at."""
    outside = tmp_path / "outside"
    outside.mkdir()
    v = outside / "precious.txt"
    v.write_bytes(b"the user's own data\n")
    return v


@pytest.fixture
def shm_dir(tmp_path) -> Path:
    d = tmp_path / "shm"
    d.mkdir()
    return d


def untouched(v: Path) -> bool:
    return v.read_bytes() == b"the user's own data\n"


def test_a_flag_is_written_0600_and_never_through_a_planted_link(shm_dir, victim):
    ch = shm.Channel(token="4242-" + os.urandom(6).hex(), directory=str(shm_dir))
    for path in (
        shm.verdict_path(ch, "cellabc"),
        shm.hand_back_path(ch, "cellabc"),
        shm.pace_path(ch, "cellabc", 1, 40),
    ):
        os.symlink(victim, f"{path}.{os.getpid()}.tmp")  # the old temporary name
        assert shm.put(path, b"1")
        assert untouched(victim)
        assert mode(path) == 0o600 and shm.peek(path) == b"1"
        os.unlink(path)
        os.symlink(victim, path)  # a link at the final name: replaced
        assert shm.put(path, b"0")
        assert untouched(victim)
        assert not os.path.islink(path) and mode(path) == 0o600
    # only what put wrote is left: no temporary file of ours
    names = [n for n in os.listdir(shm_dir) if not os.path.islink(shm_dir / n)]
    assert all(not n.endswith(".tmp") for n in names)


def test_a_link_is_not_read_as_a_flag(shm_dir, victim):
    path = str(shm_dir / "gpucell-1-x-verdict-abc")
    os.symlink(victim, path)
    assert shm.peek(path) is None


@pytest.mark.skipif(os.geteuid() != 0, reason="making another user's file needs root")
def test_a_file_another_user_made_is_not_read(shm_dir):
    path = shm_dir / "gpucell-1-x-handback-abc"
    path.write_bytes(shm.HAND_BACK.pack(0.5))
    os.chown(path, 65534, 65534)  # nobody
    assert shm.peek(str(path)) is None
    with pytest.raises(PermissionError):
        private.read(path)


def test_a_hosts_shared_input_is_published_0600_without_following_links(
    shm_dir, victim, monkeypatch
):
    monkeypatch.setattr(shm, "room", lambda directory: 1 << 40)
    ch = shm.Channel(token="t" + os.urandom(4).hex(), directory=str(shm_dir))
    path = ch.path("host-a-0")
    os.symlink(victim, f"{path}.ready.{os.getpid()}.tmp")
    frames = wire.dumps({"x": np.arange(300_000, dtype=np.float64)})
    mine = hostcopy.receive(shm.lead(frames, ch, "host-a-0"), "cell1", "k1")
    assert shm.spilled(mine) and untouched(victim)
    assert mode(path) == 0o600 and mode(path + ".ready") == 0o600
    theirs = hostcopy.receive(shm.follow(ch, "host-a-0", os.getpid(), 0), "c", "k2")
    assert wire.loads(shm.unspill(theirs, shared=True))["x"][-1] == 299_999
    hostcopy.unpublish("k1")
    hostcopy.unpublish("k2")


def test_a_result_file_is_never_written_through_a_link_at_its_name(
    shm_dir, victim, monkeypatch
):
    monkeypatch.setattr(shm, "room", lambda directory: 1 << 40)
    ch = shm.Channel(token="t" + os.urandom(4).hex(), directory=str(shm_dir))
    frames = wire.dumps({"x": np.zeros(1 << 18)})
    os.symlink(victim, ch.path("r1"))
    out = shm.spill(frames, ch, "r1", own=True)
    assert not shm.spilled(out) and untouched(victim)  # sent as frames instead
    out = shm.spill(frames, ch, "r2", own=True)
    assert shm.spilled(out) and mode(ch.path("r2")) == 0o600
    shm.unspill(out)


def test_the_channel_probe_is_0600(tmp_path):
    ch = shm_channel.open_channel(str(tmp_path))
    assert ch is not None
    try:
        assert mode(ch.probe) == 0o600
    finally:
        shm_channel.close_channel(ch)


def test_the_saved_placement_is_0600_and_not_written_through_a_link(tmp_path, victim):
    path = tmp_path / profiles.PLACEMENT_FILE
    os.symlink(victim, str(path) + ".tmp")  # the old temporary name
    profiles.save_placement(str(tmp_path), {"ssh": "h1"})
    assert untouched(victim) and mode(path) == 0o600
    assert profiles.saved_placement(str(tmp_path)) == {"ssh": "h1"}


def test_folders_are_0700_and_a_link_in_their_place_is_refused(tmp_path, victim):
    d = tmp_path / "made"
    private.make_folder(d)
    assert mode(d) == 0o700
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o755)
    private.make_folder(loose)
    assert mode(loose) == 0o700
    link = tmp_path / "link"
    os.symlink(victim.parent, link)
    before = mode(victim.parent)
    with pytest.raises(FileExistsError):
        private.make_folder(link)
    assert mode(victim.parent) == before


def test_a_log_is_made_0600_before_it_is_appended_to(tmp_path, victim):
    log = tmp_path / "ipengine-x.log"
    private.touch(log)
    assert mode(log) == 0o600
    loose = tmp_path / "old.log"
    loose.write_text("x")
    os.chmod(loose, 0o644)
    private.touch(loose)
    assert mode(loose) == 0o600 and loose.read_text() == "x"
    link = tmp_path / "planted.log"
    os.symlink(victim, link)
    before = mode(victim)
    with pytest.raises(OSError):
        private.touch(link)
    assert untouched(victim) and mode(victim) == before


SCRIPT = """
import json, os, stat, sys, gpucell
c = gpucell.start_cluster(2, gpus="none")
prof = c.cluster.profile_dir
out = {"folders": {}, "files": {}, "shm": {}}
for name in ("security", "log", "pid"):
    out["folders"][name] = stat.S_IMODE(os.stat(os.path.join(prof, name)).st_mode)
for name in ("security", "log"):
    for f in os.listdir(os.path.join(prof, name)):
        p = os.path.join(prof, name, f)
        out["files"][name + "/" + f] = stat.S_IMODE(os.stat(p).st_mode)
ch = c._channel
for f in os.listdir(ch.directory):
    if f.startswith(f"gpucell-{ch.token}"):
        out["shm"][f] = stat.S_IMODE(os.stat(os.path.join(ch.directory, f)).st_mode)
gpucell.stop()
print("RESULT" + json.dumps(out))
"""


@pytest.mark.cluster
def test_a_clusters_profile_files_and_folders_are_its_users_alone(tmp_path):
    ipdir = tmp_path / "ipython"
    log = ipdir / "profile_default" / "log"
    log.mkdir(parents=True)
    os.chmod(log, 0o755)  # as IPython makes it
    env = {**os.environ, "IPYTHONDIR": str(ipdir)}
    p = subprocess.run(
        [sys.executable, "-c", SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT")]
    assert line, p.stdout + p.stderr
    out = json.loads(line[0][len("RESULT") :])
    assert out["folders"] == {"security": 0o700, "log": 0o700, "pid": 0o700}
    files = out["files"]
    assert any(f.startswith("security/cluster-") for f in files)
    assert any(f.startswith("security/ipcontroller-") for f in files)
    assert any(f.startswith("log/ipengine-") for f in files)
    assert any(f.startswith("log/ipcontroller-") for f in files)
    assert {f: m for f, m in files.items() if m != 0o600} == {}
    assert out["shm"] and set(out["shm"].values()) == {0o600}
