"""The controller's direct queue tells its hub of each message without its buffers
(gpucell.cluster.lean_monitor): what the hub gets, and that it still keeps count."""

from __future__ import annotations

import numpy as np
import pytest
import zmq

from gpucell.cluster.lean_monitor import monitor_frames

DELIM = b"<IDS|MSG>"


def test_the_hub_gets_the_routing_and_signed_parts_only():
    parts = [b"client", b"engine", DELIM, b"sig", b"{h}", b"{p}", b"{md}", b"{c}"]
    frames = [zmq.Frame(p) for p in [*parts, b"x" * 1000, b"y" * 1000]]
    lean = monitor_frames(frames)
    assert [f.bytes for f in lean] == parts
    assert lean[0] is frames[0]  # the same frames: nothing copied


def test_a_message_without_a_delimiter_goes_whole():
    frames = [b"a", b"b", b"c"]
    assert monitor_frames(frames) == frames


@pytest.mark.cluster
def test_the_hub_still_counts_requests_and_replies(cluster):
    """The hub learns of each task and its completion from the lean monitor copies
    (queue_status is built from them), and big buffers still reach the engine
    and come back whole."""
    client = cluster.client
    eid = cluster.live_ids()[0]
    before = client.queue_status(targets=eid)
    a = np.arange(2**20, dtype=np.float64)  # 8 MiB: a buffer of its own
    back = client[eid].apply_sync(lambda x: x * 2, a)
    assert np.array_equal(back, a * 2)
    after = client.queue_status(targets=eid)
    assert after["queue"] == 0, after
    assert after["completed"] >= before["completed"] + 1, (before, after)
