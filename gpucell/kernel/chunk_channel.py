"""The kernel's end of the chunk channel (``gpucell.protocol.chunk_channel``):
a cell's later chunks to its local engines through ``/dev/shm``, one
ipyparallel task per engine per cell instead of one per chunk.

Each chunk sent this way is a :class:`ChannelTask`, shaped as the
``AsyncResult`` the dispatcher and the output relay read (``get``, ``done``,
``msg_ids``, ``metadata``, ``wait_for_output``), so the run state and the
executor handle it as they handle a task.  A thread of the run reads the
engines' replies and settles each task; an engine that dies leaves its tasks
to the dispatcher's own check (by pid), which calls :meth:`engine_gone`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import pickle
import select
import shutil
import tempfile
import threading
from typing import Any

from gpucell.protocol import chunk_channel as cc
from gpucell.protocol.conversation import ChunkTask

#: (chunk, its task, timed), as kernel/sending sends them
Outgoing = tuple[Any, ChunkTask, bool]

__all__ = ["ChannelTask", "ChunkChannel", "channel_for", "channel_setting", "route"]


class ChannelTask(concurrent.futures.Future):  # type: ignore[type-arg]
    """A chunk in the channel, read by the dispatcher as an ``AsyncResult``."""

    def __init__(self, client: Any, header: dict[str, Any], engine: int) -> None:
        super().__init__()
        mid = header["msg_id"]
        self.msg_ids = [mid]
        self.engine = engine
        # the client files the engine's output for this id here (its IOPub
        # handler), and resolves the output future at the "idle" that follows
        self.metadata = client.metadata[mid]
        self._output: concurrent.futures.Future[Any] = concurrent.futures.Future()
        client._output_futures[mid] = self._output

    @property
    def data(self) -> Any:
        """What the engine published with ``publish_data`` during the chunk
        (its device telemetry, where the kernel cannot sample it)."""
        return self.metadata.get("data")

    def get(self, timeout: float | None = None) -> Any:
        return self.result(timeout)

    def wait_for_output(self, timeout: float | None = None) -> bool:
        try:
            self._output.result(timeout)
        except concurrent.futures.TimeoutError:
            return False
        return True

    def output_done(self) -> None:
        with contextlib.suppress(concurrent.futures.InvalidStateError):
            self._output.set_result(None)


class ChunkChannel:
    """One run's channel to its local engines (``open`` each after its first
    chunk, which travels as a task with the program and inputs)."""

    def __init__(self, client: Any, engines: list[int]) -> None:
        self.client = client
        self.folder = tempfile.mkdtemp(
            prefix=f"gpucell-chunks-{os.getpid()}-", dir="/dev/shm"
        )
        self._to: dict[int, int] = {}
        self._from: dict[int, int] = {}
        self._engine_of_fd: dict[int, int] = {}
        self._buffer: dict[int, bytes] = {}
        self._pending: dict[int, ChannelTask] = {}  # request number -> task
        self._serving: dict[int, Any] = {}  # engine -> its serve task
        self._next = 0
        self._given_up: set[int] = set()  # engines whose chunks went back to tasks
        self.tasked: set[int] = set()  # engines that had a chunk as a task
        self._lock = threading.Lock()
        self._closed = False
        for eid in engines:
            for path in (
                cc.to_engine(self.folder, eid),
                cc.from_engine(self.folder, eid),
            ):
                os.mkfifo(path, 0o600)
            # read-write: opening never waits for the engine, and the engine's
            # end never sees end-of-file before the kernel's END
            self._to[eid] = os.open(cc.to_engine(self.folder, eid), os.O_RDWR)
            fd = os.open(cc.from_engine(self.folder, eid), os.O_RDONLY | os.O_NONBLOCK)
            self._from[eid], self._engine_of_fd[fd] = fd, eid
            self._buffer[fd] = b""
        self._wake_r, self._wake_w = os.pipe()
        self._reader = threading.Thread(
            target=self._read_replies, name="gpucell-chunk-channel", daemon=True
        )
        self._reader.start()

    # -- sending -------------------------------------------------------------------

    def reaches(self, eid: int) -> bool:
        """Whether ``eid`` is one of the channel's engines (and may still be)."""
        return eid in self._to and eid not in self._given_up

    def serves(self, eid: int) -> bool:
        """Whether ``eid``'s chunks go through the channel now."""
        return eid in self._serving and eid not in self._given_up

    def open(self, eid: int, view: Any) -> None:
        """Queue ``eid``'s serving task (behind its first chunk's task)."""
        from gpucell.engine import worker

        if eid in self._serving or eid not in self._to:
            return
        ar = view.apply_async(worker.SERVE, self.folder, eid)
        self._serving[eid] = ar
        ar.add_done_callback(lambda f, eid=eid: self._served(eid, f))

    def send_all(
        self, opening: list[int], routed: list[Outgoing], views: dict[int, Any]
    ) -> list[tuple[Any, ChannelTask, bool]]:
        """Start the serving tasks of ``opening`` (queued behind their first
        chunk's task), then send ``routed``; each chunk with its task."""
        for eid in opening:
            self.open(eid, views[eid])
        sent: list[tuple[Any, Any, bool]] = []
        for c, task, timed in routed:
            if c.engine not in self._given_up:
                try:
                    sent.append((c, self.send(c.engine, task), timed))
                    continue
                except OSError:  # /dev/shm full (a container's 64 MiB default)
                    self._give_up(c.engine)
            # a task, queued behind the serving task, which END lets finish
            sent.append((c, views[c.engine].apply_async(_run(), *task), timed))
        return sent

    def _give_up(self, eid: int) -> None:
        """``eid`` takes its chunks as tasks from now on: its serving task
        answers what is queued in the channel, then ends."""
        self._given_up.add(eid)
        with contextlib.suppress(OSError):
            os.write(self._to[eid], cc.pack(cc.END))

    def send(self, eid: int, task: ChunkTask) -> ChannelTask:
        header = self.client.session.msg_header("apply_request")
        plain = task._replace(
            chunk_frames=cc.plain_frames(task.chunk_frames),
            input_frames=cc.plain_frames(task.input_frames),
            quiet_idle=False,
        )
        with self._lock:
            n = self._next
            self._next += 1
        path = cc.request_path(self.folder, n)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                pickle.dump(
                    cc.ChannelRequest(plain, dict(header)),
                    f,
                    protocol=pickle.HIGHEST_PROTOCOL,
                )
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(path)
            raise
        out = ChannelTask(self.client, header, eid)
        with self._lock:
            self._pending[n] = out
        os.write(self._to[eid], cc.pack(n))
        return out

    # -- replies -------------------------------------------------------------------

    def _read_replies(self) -> None:
        fds = [*self._from.values(), self._wake_r]
        while not self._closed:
            try:
                ready, _, _ = select.select(fds, [], [], 1.0)
            except (OSError, ValueError):
                return
            for fd in ready:
                if fd == self._wake_r:
                    return
                self._read(fd)

    def _read(self, fd: int) -> None:
        try:
            data = self._buffer[fd] + os.read(fd, 65536)
        except BlockingIOError:
            return
        except OSError:
            return
        size = cc.NOTICE.size
        whole = len(data) - len(data) % size
        self._buffer[fd] = data[whole:]
        for at in range(0, whole, size):
            self._settle(cc.unpack(data[at : at + size]))

    def _settle(self, n: int) -> None:
        with self._lock:
            task = self._pending.pop(n, None)
        path = cc.reply_path(self.folder, n)
        try:
            with open(path, "rb") as f:
                reply = pickle.load(f)
            os.unlink(path)
        except (OSError, pickle.UnpicklingError, EOFError) as e:
            reply = cc.Raised(type(e).__name__, str(e), "")
        if task is None:
            return
        if isinstance(reply, cc.Answered):
            if not reply.printed:
                task.output_done()  # no "idle" follows a silent chunk
            _set(task, result=reply.frames)
            return
        task.output_done()
        if isinstance(reply, cc.Raised):
            from ipyparallel.error import RemoteError

            _set(task, error=RemoteError(reply.ename, reply.evalue, reply.traceback))
        else:
            from ipyparallel.error import TaskAborted

            _set(task, error=TaskAborted(f"chunk withdrawn from engine {task.engine}"))

    # -- engines that end ------------------------------------------------------------

    def engine_gone(self, eid: int) -> None:
        """``eid`` died or was ended: its chunks in the channel are lost."""
        from ipyparallel.error import EngineError

        self._fail(eid, EngineError(f"engine {eid} died"))

    def _served(self, eid: int, ar: Any) -> None:
        """``eid``'s serving task ended.  It ends by itself only at ``END``
        (the run's end, or the engine given up), having answered every chunk
        queued before it, whose replies the reader may not have read yet: they
        stay pending.  One that raised loses them, with its error."""
        try:
            ar.get(0)
        except BaseException as e:  # noqa: BLE001 - what ended it ends its chunks
            self._fail(eid, e)

    def _fail(self, eid: int, error: BaseException) -> None:
        with self._lock:
            lost = [(n, t) for n, t in self._pending.items() if t.engine == eid]
            for n, _t in lost:
                del self._pending[n]
        for _n, task in lost:
            task.output_done()
            _set(task, error=error)

    # -- the end ---------------------------------------------------------------------

    def serving_tasks(self) -> list[Any]:
        return list(self._serving.values())

    def close(self) -> None:
        """The run is over: every serving task ends (chunks still queued are
        withdrawn), the folder goes."""
        if self._closed:
            return
        self._closed = True
        for fd in self._to.values():
            with contextlib.suppress(OSError):
                os.write(fd, cc.pack(cc.END))
        with contextlib.suppress(OSError):
            os.write(self._wake_w, b"x")
        self._reader.join(timeout=5)
        for eid in self._to:
            for path in (
                cc.to_engine(self.folder, eid),
                cc.from_engine(self.folder, eid),
            ):
                with contextlib.suppress(OSError):
                    os.unlink(path)
        for fd in [
            *self._to.values(),
            *self._from.values(),
            self._wake_r,
            self._wake_w,
        ]:
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.folder, ignore_errors=True)
        with self._lock:
            left, self._pending = list(self._pending.values()), {}
        from ipyparallel.error import TaskAborted

        for task in left:
            task.output_done()
            _set(task, error=TaskAborted("the run ended"))

    def forget(self, msg_ids: list[str]) -> None:
        """The client's records of this run's chunks, dropped."""
        for mid in msg_ids:
            self.client.metadata.pop(mid, None)
            self.client._output_futures.pop(mid, None)


def _set(
    task: ChannelTask, result: Any = None, error: BaseException | None = None
) -> None:
    with contextlib.suppress(concurrent.futures.InvalidStateError):
        if error is not None:
            task.set_exception(error)
        else:
            task.set_result(result)


def channel_setting() -> bool:
    """``GpuCell.chunk_channel``."""
    from gpucell import config

    return bool(config.settings().chunk_channel)


def channel_for(gc: Any, alive: list[int]) -> ChunkChannel | None:
    """A run's channel to the engines on this host that map its /dev/shm
    (None: every chunk is a task)."""
    near = [
        e
        for e in alive
        if gc.sees_shm(e) and getattr(gc.engines.get(e), "local", False)
    ]
    return ChunkChannel(gc.client, near) if near else None


def route(
    channel: ChunkChannel | None, outgoing: list[Outgoing]
) -> tuple[list[Outgoing], list[Outgoing], list[int]]:
    """Which chunks go as tasks and which through ``channel``: an engine's
    first chunk of the cell is a task (it carries the program and inputs), its
    later ones take the channel, whose serving task starts with the second;
    and the engines whose serving task starts now."""
    if channel is None:
        return outgoing, [], []
    tasks: list[Outgoing] = []
    routed: list[Outgoing] = []
    opening: list[int] = []
    for item in outgoing:
        eid = item[0].engine
        if channel.serves(eid) or eid in opening:
            routed.append(item)
        elif channel.reaches(eid) and eid in channel.tasked:
            # its second chunk: a serving task is worth starting only now (a
            # loop of one chunk an engine would pay for it and use it never)
            opening.append(eid)
            routed.append(item)
        else:
            tasks.append(item)
            channel.tasked.add(eid)
    return tasks, routed, opening


def _run() -> Any:
    """``worker.RUN``: a chunk as a task of its own."""
    from gpucell.engine import worker

    return worker.RUN
