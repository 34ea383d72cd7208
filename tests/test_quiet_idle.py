"""``GpuCell.quiet_idle`` (off by default, on in these tests): engines leave out
the "idle" status after a chunk that sent nothing on IOPub (engine/quietidle);
the kernel marks that task's output complete itself.  A chunk that prints or displays
keeps its "idle", so its output still arrives whole and in order."""

from __future__ import annotations

import pytest

import gpucell
from gpucell import config
from gpucell.kernel import executor


@pytest.fixture
def quiet(ip, cluster, monkeypatch):
    """quiet_idle on for one test; the tasks the kernel completed itself."""
    completed: list[str] = []
    real = executor.output_complete

    def counting(client, ar):
        pending = [
            m
            for m in ar.msg_ids
            if (f := client._output_futures.get(m)) and not f.done()
        ]
        completed.extend(pending)
        real(client, ar)

    monkeypatch.setattr(executor, "output_complete", counting)
    ip.run_line_magic("config", "GpuCell.quiet_idle = True")
    # every chunk a task of its own (GpuCell.chunk_channel sends most as none)
    monkeypatch.setattr(config.settings(), "chunk_channel", False)
    try:
        yield completed
    finally:
        ip.run_line_magic("config", "GpuCell.quiet_idle = False")  # (the default)


def _pending_outputs(client) -> list[str]:
    """Tasks whose output is still awaited, once the "idle" of any task just
    done (a probe's, a tidy's) had 2 s to come: a left-out one never comes."""
    import concurrent.futures

    pending = [f for f in list(client._output_futures.values()) if not f.done()]
    concurrent.futures.wait(pending, timeout=2.0)
    return [m for m, f in list(client._output_futures.items()) if not f.done()]


def _skipped() -> int:
    from gpucell.engine import quietidle

    return quietidle.skipped[0]


def _idles_left_out(cluster) -> int:
    return sum(cluster.client.direct_view(cluster.ids).apply_sync(_skipped))


def test_a_silent_loop_sends_no_idle_and_leaves_no_task_behind(ip, cluster, quiet):
    before = _idles_left_out(cluster)
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --chunksize 4",
        "sq = []\nfor i in range(16):\n    sq.append(i * i)\n",
    )
    assert ip.user_ns["sq"] == [i * i for i in range(16)]
    chunks = len(gpucell.last_run.chunks)
    # every chunk's reply said "no idle follows": none arrived to complete it
    assert len(quiet) == chunks >= 4
    assert _idles_left_out(cluster) - before == chunks
    assert not _pending_outputs(cluster.client)


def test_printed_and_displayed_output_keeps_its_idle_and_arrives_whole(
    ip, cluster, quiet, capsys, monkeypatch
):
    before = _idles_left_out(cluster)
    shown: list[dict] = []
    monkeypatch.setattr(
        ip.display_pub, "publish", lambda data, metadata=None, **kw: shown.append(data)
    )
    ip.run_cell_magic(
        "gpu_parallel",
        "--quiet --schedule dynamic --chunksize 1",
        "from IPython.display import display, Markdown\n"
        "for i in range(12):\n"
        "    if i % 2:\n        print('line', i)\n"
        "    else:\n        display(Markdown(f'**item {i}**'))\n",
    )
    out = capsys.readouterr().out
    lines = [int(x.split("line ")[1]) for x in out.splitlines() if "line " in x]
    assert lines == list(range(1, 12, 2))
    md = sorted(d["text/markdown"] for d in shown if "text/markdown" in d)
    assert md == sorted(f"**item {i}**" for i in range(0, 12, 2))
    assert quiet == []  # each chunk sent output: each kept its "idle"
    assert _idles_left_out(cluster) == before
    assert not _pending_outputs(cluster.client)


def test_off_means_every_idle_is_sent(ip, cluster, monkeypatch):
    called: list[object] = []
    monkeypatch.setattr(executor, "output_complete", lambda c, ar: called.append(ar))
    before = _idles_left_out(cluster)
    ip.run_line_magic("config", "GpuCell.quiet_idle = False")
    try:
        ip.run_cell_magic("gpu_parallel", "--quiet", "for i in range(8):\n    v = i\n")
    finally:
        ip.run_line_magic("config", "GpuCell.quiet_idle = False")  # (the default)
    assert called == [] and not _pending_outputs(cluster.client)
    assert _idles_left_out(cluster) == before


def test_outside_an_engine_nothing_is_touched():
    from gpucell.engine import quietidle

    quietidle.begin()
    assert quietidle.finish() is False
