"""Bad input is one clear error before anything runs (issue 29): every option
of both magics bounded, a non-ASCII digit, an unbalanced quote, a name of 5,000
characters, a --checkpoint folder that cannot be made or written, IPython
syntax in the loop's body.  Each case runs the magic in the real IPython shell
and checks the error names the option and the fix, the namespace is as it was,
the prelude did not run, and no cluster was started (or the running one is
untouched)."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest
from IPython.core.error import UsageError

import gpucell.cluster.lifecycle as gc_mod
from gpucell.core.topology import MAX_ENGINES, engine_limit
from gpucell.errors import CheckpointRefused

#: a cell whose prelude leaves a mark, then a loop
CELL = "prelude_ran = True\nout = []\nfor x in range(6):\n    out.append(x * x)\n"


def snapshot(ip) -> dict[str, object]:
    return dict(ip.user_ns)


def unchanged(ip, before: dict[str, object]) -> bool:
    now = ip.user_ns
    return now.keys() == before.keys() and all(now[k] is before[k] for k in before)


def refused_cell(ip, line: str, cell: str = CELL, error: type = UsageError) -> str:
    """Run ``%%gpu_parallel line`` expecting ``error``; its message.  The
    namespace must be untouched and the prelude not run."""
    for name in ("prelude_ran", "out"):  # (left by other modules' cells)
        ip.user_ns.pop(name, None)
    before = snapshot(ip)
    with pytest.raises(error) as e:
        ip.run_cell_magic("gpu_parallel", line, cell)
    assert unchanged(ip, before), "the namespace changed"
    assert "prelude_ran" not in ip.user_ns and "out" not in ip.user_ns
    return str(e.value)


def refused_line(ip, line: str) -> str:
    before = snapshot(ip)
    with pytest.raises(UsageError) as e:
        ip.run_line_magic("gpu_cluster", line)
    assert unchanged(ip, before)
    return str(e.value)


def children() -> set[int]:
    out = subprocess.run(
        ["ps", "-o", "pid=", "--ppid", str(os.getpid())],
        capture_output=True,
        text=True,
    ).stdout
    return {int(p) for p in out.split()}


@pytest.fixture
def no_cluster_started(no_active_cluster):
    """No cluster is active, and the test starts no process."""
    before = children()
    yield
    assert gc_mod._current is None, "a cluster was started"
    time.sleep(0.2)
    new = children() - before
    assert not [p for p in new if os.path.exists(f"/proc/{p}")], "a process started"


# ---- %gpu_cluster ----------------------------------------------------------


def test_a_huge_n_is_refused_at_once_with_the_limit(ip, no_cluster_started):
    t0 = time.perf_counter()
    msg = refused_line(ip, "start -n 100000000 --gpus none")
    assert time.perf_counter() - t0 < 10  # it hung, holding 12 GB
    limit = engine_limit(len(os.sched_getaffinity(0)))
    assert limit <= MAX_ENGINES
    assert f"-n 100000000: at most {limit} engines" in msg
    assert "4 per core" in msg and f"Pass -n {limit} or less" in msg


@pytest.mark.parametrize(
    ("line", "option"),
    [
        ("start --gpus none --cpu-engines 100000", "--cpu-engines 100000"),
        ("start --per-gpu 100000", "--per-gpu 100000"),
        ("start -n -3", "-n -3"),
        ("start --per-gpu 0", "--per-gpu 0"),
    ],
)
def test_engine_counts_are_bounded(ip, no_cluster_started, line, option):
    assert option in refused_line(ip, line)


@pytest.mark.parametrize("value", ["-1", "0", "nan", "inf", "1e12"])
@pytest.mark.parametrize("cmd", ["start --gpus none -n 1", "connect --profile p"])
def test_start_and_connect_timeouts_are_bounded(ip, no_cluster_started, cmd, value):
    msg = refused_line(ip, f"{cmd} --timeout {value}")
    assert "--timeout" in msg and "more than 0 and at most 86,400" in msg
    assert "leave it out for the default" in msg


@pytest.mark.parametrize(
    ("line", "option"),
    [
        ("start --slurm --nodes 100000", "--nodes 100000: must be 1 or more"),
        ("start --slurm --gpus-per-node 1000", "--gpus-per-node 1000"),
    ],
)
def test_slurm_sizes_are_bounded(ip, no_cluster_started, line, option):
    msg = refused_line(ip, line)
    assert option in msg and "at most" in msg


@pytest.mark.parametrize(
    ("line", "option"),
    [("start --gpus ٣", "--gpus"), ("start --gpus 0,١", "--gpus"), ("select ٣", "")],
)
def test_non_ascii_digits_are_refused(ip, no_cluster_started, line, option):
    msg = refused_line(ip, line)
    assert option in msg and "digits 0-9" in msg and "like '0,1'" in msg


def test_an_unbalanced_quote_is_said_as_such(ip, no_cluster_started):
    msg = refused_line(ip, "start --profile 'abc")
    assert msg.startswith("%gpu_cluster:") and "quote is not closed" in msg
    assert "Close the quote" in msg


@pytest.mark.parametrize("option", ["--profile", "--cluster-id"])
def test_a_5000_character_name_is_refused(ip, no_cluster_started, option):
    cmd = "start" if option == "--profile" else "connect"
    msg = refused_line(ip, f"{cmd} {option} {'p' * 5000}")
    assert option in msg and "Pass a shorter value" in msg
    msg = refused_line(ip, f"{cmd} {option} {'p' * 300}")
    assert option in msg and "1 to 200 characters" in msg


def test_paths_that_cannot_exist_are_refused(ip, no_cluster_started):
    msg = refused_line(ip, f"connect --file /tmp/{'f' * 300}.json")
    assert "--file" in msg and "255" in msg
    msg = refused_line(ip, "connect --profile p --ssh u@h --ssh-key ~nosuchuser/k")
    assert "--ssh-key" in msg and "no user 'nosuchuser'" in msg


def test_a_bad_option_leaves_the_running_cluster_alone(ip, cluster):
    ids = list(cluster.client.ids)
    for line in ("start -n 100000000 --gpus none", "start --timeout -1", "select ٣"):
        refused_line(ip, line)
        assert gc_mod._current is cluster
    assert list(cluster.client.ids) == ids
    refused_cell(ip, "--seed -1")
    assert gc_mod._current is cluster and list(cluster.client.ids) == ids


# ---- %%gpu_parallel --------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        ("--timeout 0", "--timeout 0: must be a number of seconds more than 0"),
        ("--timeout -1", "--timeout -1"),
        ("--timeout nan", "--timeout nan"),
        ("--timeout inf", "--timeout inf"),
        ("--timeout 1e12", "at most 2,592,000 (30 days)"),
        ("--retries -1", "--retries -1: must be 0 or more and at most 100"),
        ("--retries 1000000000", "--retries 1000000000"),
        ("--chunksize 0", "--chunksize 0: must be 1 or more"),
        ("--chunksize 100000000000000000000", "at most 1,000,000,000"),
        ("--seed -1", "--seed -1: must be 0 or more and at most 4,294,967,295"),
        ("--seed 4294967296", "what numpy.random.seed takes"),
        (f"--seed {10**30}", "--seed"),
    ],
)
def test_every_number_is_bounded(ip, no_cluster_started, line, expect):
    msg = refused_cell(ip, line)
    assert msg.startswith("%%gpu_parallel") and expect in msg
    assert "Nothing ran" in msg or "leave it out" in msg


@pytest.mark.parametrize(
    ("line", "token"),
    [
        ("--devices ٣", "'٣'"),
        ("--devices ٠", "'٠'"),  # int('٠') == 0: GPU 0 was picked silently
        ("--devices 0,١", "'١'"),
        ("--targets ٣", "'٣'"),
        ("-t 0,١", "'١'"),
    ],
)
def test_non_ascii_digits_in_devices_and_targets(ip, no_cluster_started, line, token):
    msg = refused_cell(ip, line)
    option = "--devices" if "devices" in line else "--targets"
    assert option in msg and token in msg and "digits 0-9" in msg


def test_an_unbalanced_quote_in_the_cell_line(ip, no_cluster_started):
    msg = refused_cell(ip, "--checkpoint 'abc")
    assert "%%gpu_parallel" in msg and "quote is not closed" in msg


def test_a_5000_character_checkpoint_name(ip, no_cluster_started, tmp_path):
    msg = refused_cell(ip, f"--checkpoint {'d' * 5000}", error=CheckpointRefused)
    assert "--checkpoint" in msg and "255" in msg and "shorter" in msg
    msg = refused_cell(
        ip, f"--checkpoint {tmp_path}/{'d' * 300}", error=CheckpointRefused
    )
    assert "a name in it is 300 bytes long" in msg


@pytest.mark.parametrize("quote", ["", "'", '"'])
def test_a_checkpoint_of_a_user_that_does_not_exist(ip, no_cluster_started, quote):
    cwd = set(os.listdir("."))
    line = f"--checkpoint {quote}~nosuchuser/x{quote}"
    msg = refused_cell(ip, line, error=CheckpointRefused)
    assert "--checkpoint ~nosuchuser/x" in msg
    assert "no user 'nosuchuser'" in msg and "~/ for your own home" in msg
    assert set(os.listdir(".")) == cwd  # no folder named "'~nosuchuser" made here


def test_a_quoted_checkpoint_path_loses_its_quotes(ip, cluster, tmp_path):
    where = tmp_path / "with space"
    cwd = set(os.listdir("."))
    ip.user_ns["xs"] = list(range(6))
    ip.run_cell_magic(
        "gpu_parallel",
        f"--quiet --checkpoint '{where}'",
        "out = []\nfor x in xs:\n    out.append(x * x)\n",
    )
    assert ip.user_ns.pop("out") == [x * x for x in range(6)]
    # kept quotes made the path relative: a folder "'" in the working folder
    assert set(os.listdir(".")) == cwd
    ip.user_ns.pop("xs")


def test_a_checkpoint_in_proc(ip, no_cluster_started):
    msg = refused_cell(ip, "--checkpoint /proc/x", error=CheckpointRefused)
    assert "--checkpoint /proc/x: cannot create /proc/x" in msg
    assert "Name a folder you can write to" in msg
    assert not os.path.exists("/proc/x")


def test_a_checkpoint_that_is_not_a_folder(ip, no_cluster_started):
    msg = refused_cell(ip, "--checkpoint /dev/null", error=CheckpointRefused)
    assert "/dev/null is not a folder" in msg


@pytest.fixture
def read_only(tmp_path):
    """A folder this user cannot write into (for root: a read-only mount)."""
    d = tmp_path / "ro"
    d.mkdir(mode=0o700)
    if os.geteuid() != 0:
        os.chmod(d, 0o500)
        yield d
        os.chmod(d, 0o700)
        return
    p = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "ro,size=64k,mode=0700", "tmpfs", str(d)],
        capture_output=True,
        text=True,
    )
    if p.returncode != 0:
        pytest.skip(f"root cannot be kept from a folder here: {p.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", str(d)], check=False)


def test_a_read_only_checkpoint_folder(ip, no_cluster_started, read_only):
    msg = refused_cell(ip, f"--checkpoint {read_only}", error=CheckpointRefused)
    assert f"cannot write a file in {read_only}" in msg
    msg = refused_cell(ip, f"--checkpoint {read_only}/sub", error=CheckpointRefused)
    assert f"cannot create {read_only}/sub" in msg
    assert os.listdir(read_only) == []


def test_a_good_checkpoint_folder_is_checked_without_a_trace(tmp_path):
    from gpucell.kernel.keep import check_folder

    where = tmp_path / "a" / "b"
    check_folder(where)
    assert not (tmp_path / "a").exists()  # made, written, removed again
    where.mkdir(parents=True)
    check_folder(where)
    assert list(where.iterdir()) == []


@pytest.mark.parametrize(
    ("body", "line", "what"),
    [
        # the editor's lines: the magic's own line is line 1
        ("    y = !echo hi\n", "line 6 (`y = !echo hi`)", "a shell command"),
        ("    !echo hi\n", "line 6 (`!echo hi`)", "a shell command"),
        ("    y = %env HOME\n", "line 6 (`y = %env HOME`)", "a line magic"),
        ("    if x:\n        get_ipython()\n", "line 7", "get_ipython()"),
    ],
)
def test_ipython_syntax_in_the_loops_body(ip, no_cluster_started, body, line, what):
    cell = CELL + body
    msg = refused_cell(ip, "", cell)
    assert msg.startswith("%%gpu_parallel: " + line) and what in msg
    assert "Run it before the loop" in msg and "subprocess.run" in msg


def test_ipython_syntax_around_the_loop_is_left_to_the_kernel(ip, no_cluster_started):
    cell = "files = !echo a\n" + CELL + "done = !echo b\n"
    msg = refused_cell(ip, "", cell)  # no cluster: refused for that alone
    assert "No cluster" in msg


def test_nothing_is_left_in_the_working_folder(tmp_path):
    """(The old path made a folder named "'~nosuchuser" where the kernel ran.)"""
    assert not Path("~nosuchuser").exists() and not Path("'~nosuchuser").exists()
