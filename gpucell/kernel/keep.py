"""Where kept chunk results live: kernel memory, and ``--checkpoint DIR`` on disk.

Memory: the last few cells that did not finish, by their text (the newest
replaces an older entry of the same cell).  Disk: one folder per cell under
``DIR`` (``cell-<digest>``) holding ``cell.json`` (the cell's text and its
key: what the results depend on) and one file per finished chunk.  Every file
is written whole or not at all (temporary file, fsync, rename, fsync of the
folder), carries a digest of its bytes, and a file whose bytes do not match is
reported and its iterations run again, never merged.  The folder is removed
once the cell's results are merged.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import shutil
import struct
import tempfile
import threading
import time
import zlib
from collections import OrderedDict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpucell.core.resume import CellKey, Kept

__all__ = ["Checkpoint", "cell_key", "check_folder", "forget", "kept_for", "remember"]

#: cells whose unfinished work stays in kernel memory (oldest dropped first)
MAX_KEPT_CELLS = 4


def _kept() -> OrderedDict[str, Kept]:
    """The kept cells: the kernel's session holds them (kernel/session.py)."""
    from gpucell.kernel.session import current

    return current().kept


_MAGIC = b"GPUCELL-CHUNK-3\n"
_RANGE = struct.Struct("<QQ")  # start, stop: inside the checksummed body
_TRAILER = struct.Struct("<QI")  # body length, crc32 of the body


def check_folder(root: str | os.PathLike[str]) -> None:
    """Refuse a ``--checkpoint`` folder this kernel's user cannot trust or
    use, before the prelude runs (:class:`gpucell.errors.CheckpointRefused`,
    saying what, where and how to fix it).

    Kept chunks are unpickled, so a folder another user owns, or may write
    into, could make this kernel run that user's code.  A path that cannot be
    a folder here (``~user`` of no user, a name longer than the file system
    takes, something under ``/proc`` or a read-only folder) would only fail
    once the loop runs, after the prelude: the folder is made (0700) and a file
    written in it now, and both are removed again (the run makes it anew).
    """
    import stat

    from gpucell.errors import CheckpointRefused
    from gpucell.kernel.usage import path_problem, shorten

    text = os.fspath(root)
    shown = shorten(text) if len(text) > 60 else text
    problem = path_problem(text)
    if problem:
        raise CheckpointRefused(f"--checkpoint {shown}: {problem} Nothing ran.")
    path = Path(text).expanduser()
    try:
        found = [path, *path.glob("cell-*")] if path.is_dir() else [path]
    except OSError as e:
        raise CheckpointRefused(
            f"--checkpoint {shown}: cannot read {path} ({e.strerror}). Name a "
            "folder of yours. Nothing ran."
        ) from None
    for p in found:
        try:
            st = os.lstat(p)
        except FileNotFoundError:
            continue
        except OSError as e:
            raise CheckpointRefused(
                f"--checkpoint {shown}: cannot read {p} ({e.strerror}). Name a "
                "folder of yours. Nothing ran."
            ) from None
        if not stat.S_ISDIR(st.st_mode):
            raise CheckpointRefused(
                f"--checkpoint {shown}: {p} is not a folder. Name a folder of "
                "yours (it is made if missing). Nothing ran."
            )
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            who = "another user" if st.st_uid != os.getuid() else "you"
            raise CheckpointRefused(
                f"--checkpoint {shown}: {p} is owned by {who} and writable by "
                f"{'others' if st.st_mode & 0o022 else 'its owner'} (mode "
                f"{stat.S_IMODE(st.st_mode):o}); kept chunks are unpickled, so "
                "gpucell loads them only from folders that are yours alone. "
                "Use a folder of yours (`chmod go-w` it). Nothing ran."
            )
    _check_writable(path, shown)


def _check_writable(path: Path, shown: str) -> None:
    """Make ``path`` (0700, with its missing parents) and a file in it, then
    remove what was made: a ``CheckpointRefused`` naming the step that failed."""
    from gpucell.errors import CheckpointRefused
    from gpucell.protocol import private

    missing: list[Path] = []
    p = path
    while not os.path.lexists(p) and p != p.parent:
        missing.append(p)
        p = p.parent
    made: list[Path] = []
    step = f"create {missing[-1]}" if missing else f"write a file in {path}"
    try:
        for folder in reversed(missing):
            step = f"create {folder}"
            os.mkdir(folder, 0o700)
            made.append(folder)
        step = f"write a file in {path}"
        probe = path / f".gpucell-probe-{os.urandom(8).hex()}"
        os.close(private.create(probe))
        os.unlink(probe)
    except OSError as e:
        where = f" ({p} exists)" if missing else ""
        raise CheckpointRefused(
            f"--checkpoint {shown}: cannot {step}{where}: {e.strerror or e}. "
            "Name a folder you can write to (it is made if missing, 0700), "
            "for example ~/checkpoints. Nothing ran."
        ) from None
    finally:
        for folder in reversed(made):
            try:
                os.rmdir(folder)
            except OSError:
                pass


def content_digest(value: Any) -> str | None:
    """A digest of ``value``'s content (not its identity): the same after a
    kernel restart for the same data.  ``None`` when it cannot be serialised."""
    from gpucell.protocol import wire

    try:
        frames = wire.dumps(value)
    except Exception:
        return None
    h = hashlib.blake2b(digest_size=16)
    for f in frames:
        mv = memoryview(f).cast("B")
        h.update(mv.nbytes.to_bytes(8, "little"))
        h.update(mv)
    return h.hexdigest()


def cell_digest(src: str) -> str:
    return hashlib.blake2b(src.encode(), digest_size=16).hexdigest()


def cell_key(
    src: str, inputs: dict[str, Any], chunker: Any, seed: int | None
) -> CellKey:
    """What the cell's chunk results depend on."""
    n = chunker.count
    return CellKey(
        cell=cell_digest(src),
        inputs=tuple((k, content_digest(v)) for k, v in sorted(inputs.items())),
        items=content_digest(chunker.chunk(0, n)) if n else "",
        count=n,
        seed=seed,
    )


def kept_for(src: str) -> Kept | None:
    return _kept().get(cell_digest(src))


def latest_kept() -> Kept | None:
    """The most recently kept unfinished run, of any cell."""
    return next(reversed(_kept().values()), None)


def remember(src: str, kept: Kept) -> None:
    d, cells = cell_digest(src), _kept()
    cells.pop(d, None)
    cells[d] = kept
    while len(cells) > MAX_KEPT_CELLS:
        cells.popitem(last=False)


def forget(src: str) -> None:
    _kept().pop(cell_digest(src), None)


def _write_atomic(path: Path, data: bytes | list[Any]) -> None:
    """``data`` (bytes, or buffers written one after another, no copy) as
    ``path``, whole or not at all: temporary file, fsync, rename, fsync of the
    folder."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            for part in [data] if isinstance(data, bytes) else data:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


class Checkpoint:
    """One cell's folder under ``--checkpoint DIR``."""

    def __init__(self, root: str | os.PathLike[str], src: str) -> None:
        self.root = Path(root).expanduser()
        self.src = src
        self.folder = self.root / f"cell-{cell_digest(src)}"
        self._writer: threading.Thread | None = None
        self._abort = False
        self.errors: list[str] = []

    def open(self, key: CellKey, keep: Iterable[tuple[int, int]] = ()) -> None:
        """Create the folder and say what it belongs to.  Chunk files of other
        ranges than ``keep`` (what this run resumes from) are removed: an
        earlier run's, of another key or with other chunks, would otherwise
        overlap this run's on disk."""
        from gpucell.protocol import private

        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        private.make_folder(self.folder)  # 0700, never a planted link
        manifest = self.folder / "cell.json"
        wanted = {f"chunk-{a:012d}-{b:012d}.bin" for a, b in keep}
        if self._key() != key:
            wanted = set()
        for p in self.folder.glob("chunk-*.bin"):
            if p.name not in wanted:
                p.unlink()
        text = json.dumps(
            {"format": 1, "key": key.as_json(), "source": self.src}, indent=1
        )
        _write_atomic(manifest, text.encode())

    def _key(self) -> CellKey | None:
        try:
            data = json.loads((self.folder / "cell.json").read_text())
            return CellKey.from_json(data["key"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, start: int, stop: int, result: Any) -> None:
        """Queue one finished chunk's file; a writer thread writes it, so the
        cell's dispatch does not wait for the disk."""
        if self._writer is None:
            self._queue: queue.Queue[Any] = queue.Queue()
            self._writer = threading.Thread(
                target=self._write_all, name="gpucell-checkpoint", daemon=True
            )
            self._writer.start()
        self._queue.put((start, stop, result))

    def _write_all(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None or self._abort:
                    return
                self._write_one(*job)
            except Exception as e:  # said by drain(); the chunk stays in memory
                self.errors.append(f"iterations {job[0]}-{job[1] - 1}: {e!r}")
            finally:
                self._queue.task_done()

    def _write_one(self, start: int, stop: int, result: Any) -> None:
        from gpucell.protocol import wire

        parts: list[Any] = [_MAGIC]
        crc, size = 0, 0
        # the range leads the checksummed body: a file under another name is
        # found out, never merged at the iterations its name says
        for f in [_RANGE.pack(start, stop), *wire.dumps(result)]:
            mv = memoryview(f).cast("B")
            head = mv.nbytes.to_bytes(8, "little")
            for piece in (head, mv):
                crc = zlib.crc32(piece, crc)
                size += len(piece)
                parts.append(piece)
        parts.append(_TRAILER.pack(size, crc))
        _write_atomic(self.folder / f"chunk-{start:012d}-{stop:012d}.bin", parts)

    def drain(self, timeout: float = 60.0) -> list[str]:
        """Wait until every queued chunk is on disk; the errors met."""
        if self._writer is not None:
            deadline = time.monotonic() + timeout
            while self._queue.unfinished_tasks and time.monotonic() < deadline:
                time.sleep(0.01)
        return list(self.errors)

    def load(self, expect: CellKey | None = None) -> tuple[Kept | None, list[str]]:
        """The kept chunks on disk, and a note for each damaged file (whose
        iterations will run again).  Nothing is unpickled unless the folder's
        key is ``expect`` (a different key comes back with no chunks: the
        caller says what changed); chunks that overlap one already taken are
        dropped, so every iteration is kept at most once."""
        from gpucell.protocol import wire

        key = self._key()
        if key is None:
            return None, []
        if expect is not None and key != expect:
            return Kept(key, done={-1: (-1, None)}), []
        kept, notes = Kept(key, reason="checkpoint"), []
        taken = -1
        for path in sorted(self.folder.glob("chunk-*.bin")):
            try:
                _, a, b = path.stem.split("-")
                start, stop = int(a), int(b)
                if start < taken:
                    raise ValueError(
                        f"its iterations overlap ones kept already (up to {taken - 1}"
                        "; files of another run with other chunks?)"
                    )
                raw = path.read_bytes()
                if not raw.startswith(_MAGIC) or len(raw) < len(_MAGIC) + 12:
                    raise ValueError("not a gpucell chunk file (truncated?)")
                body = memoryview(raw)[len(_MAGIC) : -_TRAILER.size]
                size, crc = _TRAILER.unpack(raw[-_TRAILER.size :])
                if size != len(body) or zlib.crc32(body) != crc:
                    raise ValueError("its bytes do not match its checksum (truncated?)")
                frames = _unframe(bytes(body))
                if not frames or frames[0] != _RANGE.pack(start, stop):
                    raise ValueError(
                        "its contents are not the iterations its name says"
                    )
                kept.add(start, stop, wire.loads(frames[1:]))
                taken = stop
            except Exception as e:
                notes.append(f"{path.name} is damaged ({e}); its iterations run again")
        return kept, notes

    def newest(self) -> Kept | None:
        """The key of the newest other cell folder under the root (its chunks
        are not loaded: only compared, to say what changed)."""
        folders = sorted(
            (p for p in self.root.glob("cell-*") if (p / "cell.json").exists()),
            key=lambda p: (p / "cell.json").stat().st_mtime,
        )
        if not folders:
            return None
        other = Checkpoint(self.root, "")
        other.folder = folders[-1]
        key = other._key()
        return Kept(key, done={-1: (-1, None)}) if key is not None else None

    def remove(self) -> None:
        self._abort = True
        if self._writer is not None:
            self._queue.put(None)
            self._writer.join(timeout=60)
        shutil.rmtree(self.folder, ignore_errors=True)
        try:
            self.root.rmdir()  # only if nothing else is in it
        except OSError:
            pass


def _unframe(body: bytes) -> list[bytes]:
    out, at = [], 0
    while at < len(body):
        n = int.from_bytes(body[at : at + 8], "little")
        at += 8
        if at + n > len(body):
            raise ValueError("a frame runs past the end of the file")
        out.append(body[at : at + n])
        at += n
    return out


class Keeping:
    """One cell run's keeping: what an earlier run left (``--resume``), every
    chunk that finishes now (``add``), and what to do when the run ends."""

    def __init__(
        self,
        src: str,
        inputs: dict[str, Any],
        chunker: Any,
        *,
        resume: bool,
        checkpoint: str | None,
        seed: int | None,
        echo: Any = print,
    ) -> None:
        self.src, self.inputs, self.chunker = src, inputs, chunker
        self.resume, self.seed, self.echo = resume, seed, echo
        self.checkpoint = Checkpoint(checkpoint, src) if checkpoint else None
        self.count = chunker.count
        self.kept = Kept(None)
        self.prior = 0  # iterations an earlier run had finished

    def key(self) -> CellKey:
        if self.kept.key is None:
            self.kept.key = cell_key(self.src, self.inputs, self.chunker, self.seed)
        return self.kept.key

    def start(self) -> list[tuple[int, int]]:
        """Before anything is sent: the ranges already done (``--resume``),
        after checking that they belong to this cell and inputs; opens the
        checkpoint folder.  Raises :class:`ResumeRefused` naming what changed."""
        from gpucell.core.resume import describe_ranges
        from gpucell.errors import ResumeRefused

        earlier: Kept | None = None
        if self.resume:
            earlier = kept_for(self.src)
            if earlier is None and self.checkpoint is not None:
                earlier, notes = self.checkpoint.load(expect=self.key())
                for note in notes:
                    self.echo(f"gpucell: warning: checkpoint: {note}")
            if earlier is None:
                # not this text: the newest unfinished run, which --resume is
                # about, if the cell was edited since (refused below, saying so)
                earlier = latest_kept() or (
                    self.checkpoint.newest() if self.checkpoint is not None else None
                )
            if earlier is None or not earlier.done:
                self.echo(
                    "gpucell: note: --resume: nothing is kept for this cell; "
                    "running every iteration."
                )
                earlier = None
            else:
                assert earlier.key is not None
                changed = self.key().differences(earlier.key)
                if changed:
                    raise ResumeRefused(
                        "%%gpu_parallel --resume: the kept results do not belong "
                        f"to this run: {'; '.join(changed)}. Run the cell without "
                        "--resume to start over (the kept results are then "
                        "dropped). Nothing from the loop ran."
                    )
        if self.checkpoint is not None:
            self.checkpoint.open(self.key(), earlier.ranges() if earlier else ())
        if earlier is None:
            return []
        for start, (stop, result) in earlier.done.items():
            self.kept.add(start, stop, result)
            if self.checkpoint is not None:
                self.checkpoint.write(start, stop, result)
        self.prior = self.kept.iterations
        missing = self.kept.missing(self.count)
        self.echo(
            f"gpucell: resuming: {self.prior} of {self.count} iterations are kept; "
            f"running {describe_ranges(missing) or 'none'}."
        )
        return self.kept.ranges()

    def add(self, start: int, stop: int, result: Any) -> None:
        self.kept.add(start, stop, result)
        if self.checkpoint is not None:
            self.checkpoint.write(start, stop, result)

    def results(self) -> list[Any]:
        """Every chunk result, kept and new, in iteration order."""
        return [r for _a, r in self.kept.results()]

    def failed(self, reason: str) -> None:
        """The run ended early: keep what finished, and say how to go on."""
        from gpucell.core.resume import describe_ranges

        if not self.kept.done:
            return
        if self.checkpoint is not None:  # the files match what is kept in memory
            for err in self.checkpoint.drain():
                self.echo(f"gpucell: warning: checkpoint could not write {err}")
        self.key()
        self.kept.reason = reason
        remember(self.src, self.kept)
        missing = self.kept.missing(self.count)
        where = (
            f" (also in {self.checkpoint.folder})"
            if self.checkpoint is not None
            else ""
        )
        self.echo(
            f"gpucell: {self.kept.iterations} of {self.count} iterations finished and "
            f"are kept{where}; `%%gpu_parallel --resume` runs only "
            f"{describe_ranges(missing) or 'the merge'}."
        )

    def merged(self) -> None:
        """The results are in the namespace: nothing to keep any more."""
        forget(self.src)
        if self.checkpoint is not None:
            self.checkpoint.remove()
