"""--checkpoint across a real kernel restart: a real ipykernel through
jupyter_client, interrupted with the kernel manager's interrupt (the stop
button), restarted, and resumed in the new kernel."""

from __future__ import annotations

import time

import pytest

pytestmark = pytest.mark.cluster

CELL = (
    "%%gpu_parallel --quiet --schedule dynamic --chunksize 2 {opts}\n"
    "import time\nout = []\nfor i in range(40):\n"
    "    time.sleep(0.05)\n    out.append(i * 3)\n"
)


def _run(kc, code: str, timeout: float = 120) -> tuple[dict, str]:
    chunks: list[str] = []

    def hook(msg: dict) -> None:
        c = msg["content"]
        if msg["msg_type"] == "stream":
            chunks.append(c["text"])
        elif msg["msg_type"] == "error":
            chunks.append("\n".join(c["traceback"]))

    reply = kc.execute_interactive(code, timeout=timeout, output_hook=hook)
    return reply["content"], "".join(chunks)


def test_a_checkpoint_resumes_in_a_restarted_kernel(tmp_path):
    from jupyter_client.manager import start_new_kernel

    ckpt = tmp_path / "ckpt"
    km, kc = start_new_kernel(kernel_name="python3", startup_timeout=60)
    try:
        start = (
            "%load_ext gpucell\nimport gpucell\ngpucell.start_cluster(2, gpus='none')"
        )
        reply, text = _run(kc, start)
        assert reply["status"] == "ok", text
        kc.execute(CELL.format(opts=f"--checkpoint {ckpt}"))
        deadline = time.monotonic() + 30
        while not list(ckpt.glob("cell-*/chunk-*.bin")):  # some chunks finished
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(0.3)
        km.interrupt_kernel()
        msg = kc.get_shell_msg(timeout=60)
        assert msg["content"]["status"] == "error"
        assert msg["content"]["ename"] == "KeyboardInterrupt"
        kept = len(list(ckpt.glob("cell-*/chunk-*.bin")))
        assert 0 < kept < 20

        km.restart_kernel(now=True)
        kc.wait_for_ready(timeout=60)
        reply, text = _run(kc, start)
        assert reply["status"] == "ok", text
        reply, text = _run(kc, CELL.format(opts=f"--resume --checkpoint {ckpt}"))
        assert reply["status"] == "ok", text
        assert f"resuming: {2 * kept} of 40 iterations are kept" in text
        check = (
            "ran = sorted({i for c in gpucell.last_run.chunks if c.state == 'done' "
            "for i in range(c.start, c.stop)})\n"
            "print(out == [i * 3 for i in range(40)], len(ran))"
        )
        reply, text = _run(kc, check)
        assert text.split() == ["True", str(40 - 2 * kept)], text
        assert not ckpt.exists()
        _run(kc, "gpucell.stop()")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
