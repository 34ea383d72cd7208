"""The controller's direct queue tells its hub about each message, not its data.

Runs inside the controller process (our controller launcher starts
:mod:`gpucell.cluster.controller`, which installs it).  ipyparallel's
direct (MUX) queue is a *monitored* queue: besides relaying each request to its
engine and each reply back, it publishes a copy of the whole message, buffers
included, to the controller's hub, which only reads the routing and header frames
(to keep its task records; the buffers are not signed and ``NoDB`` drops them).
Without shared memory (remote engines, ``GpuCell.shared_memory = False``) that copy
of every input and result crossed a TCP socket into the hub and was copied again
into Python bytes: measured on 2 local engines, a 1 GiB input to both had the
controller hold 3.8 GiB at the cell's end, freed only seconds later, as the hub
caught up.

Here the direct queue relays every frame as before (zero-copy, the same sockets and
identities) and publishes to the hub only the frames the hub reads: the topic and
routing identities up to the delimiter, then signature, header, parent header,
metadata and content.  The other queues (control, IOPub) keep pyzmq's own device.
"""

from __future__ import annotations

from typing import Any

__all__ = ["install", "monitor_frames"]

_DELIMITER = b"<IDS|MSG>"
#: after the delimiter: signature, header, parent header, metadata, content
_SIGNED_PARTS = 5
#: the prefixes ipyparallel gives the direct queue's monitor messages
_DIRECT_QUEUE = (b"in", b"out")


def monitor_frames(frames: list[Any]) -> list[Any]:
    """The frames of a relayed message the hub reads: everything up to the
    delimiter and the five signed parts after it (all of a message that has no
    delimiter, which the hub will reject as before)."""
    for i, f in enumerate(frames):
        if getattr(f, "bytes", f) == _DELIMITER:
            return frames[: i + 1 + _SIGNED_PARTS]
    return frames


def _relay(frm: Any, to: Any, mon: Any, prefix: bytes, swap: bool) -> None:
    frames = frm.recv_multipart(copy=False)
    if swap:  # ROUTER to ROUTER: the receiving side's identity goes first
        frames[0], frames[1] = frames[1], frames[0]
    to.send_multipart(frames, copy=False)
    mon.send_multipart([prefix, *monitor_frames(frames)], copy=False)


def _lean_monitored_queue(ins: Any, outs: Any, mons: Any, inp: bytes, outp: bytes):
    import zmq

    swap = ins.type == zmq.ROUTER and outs.type == zmq.ROUTER
    poller = zmq.Poller()
    poller.register(ins, zmq.POLLIN)
    poller.register(outs, zmq.POLLIN)
    while True:
        events = dict(poller.poll())
        if ins in events:
            _relay(ins, outs, mons, inp, swap)
        if outs in events:
            _relay(outs, ins, mons, outp, swap)


def install() -> None:
    """Make the controller's direct queue publish lean monitor messages."""
    from zmq.devices import monitoredqueuedevice as mqd

    base = mqd.MonitoredQueueBase
    if getattr(base.run_device, "_gpucell_lean", False):
        return
    original = base.run_device

    def run_device(self: Any) -> None:
        if (self._in_prefix, self._out_prefix) != _DIRECT_QUEUE:
            return original(self)  # type: ignore[no-any-return]
        ins, outs, mons = self._setup_sockets()
        _lean_monitored_queue(ins, outs, mons, self._in_prefix, self._out_prefix)

    run_device._gpucell_lean = True  # type: ignore[attr-defined]
    base.run_device = run_device  # type: ignore[method-assign]
