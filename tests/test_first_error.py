"""The run stops at the first iteration error it hears of, which need not be
the first one serially: the error says which earlier iterations had not
finished on other engines."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.cluster


def test_an_error_heard_before_earlier_iterations_finished_says_so(ip, cluster):
    ip.user_ns["out"] = "before"
    cell = (
        "import time\nout = []\nfor i in range(6):\n"
        "    if i == 0:\n        time.sleep(1.5)\n"
        "    if i in (0, 3):\n        raise ValueError(f'bad {i}')\n"
        "    out.append(i)\n"
    )
    with pytest.raises(ValueError, match="bad 3") as e:
        ip.run_cell_magic("gpu_parallel", "--quiet --schedule static", cell)
    notes = "\n".join(getattr(e.value, "__notes__", []))
    assert "iterations 0-2, before it, had not finished" in notes
    assert ip.user_ns["out"] == []  # the prelude ran; nothing from the loop merged


def test_an_error_with_nothing_earlier_unfinished_says_nothing_more(ip, cluster):
    cell = "out = []\nfor i in range(6):\n    if i == 0:\n        raise KeyError(i)\n"
    with pytest.raises(KeyError) as e:
        ip.run_cell_magic("gpu_parallel", "--quiet --schedule static", cell)
    assert "had not finished" not in "\n".join(getattr(e.value, "__notes__", []))
