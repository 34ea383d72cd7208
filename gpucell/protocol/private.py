"""Files only this user can read, made where other local users can look.

gpucell writes small files in ``/dev/shm`` (the pace, verdict and hand-back
flags of a cell, an input a host's engines share), in the IPython profile (the
cluster's state, its placement, the processes' logs) and in ``--checkpoint``
folders.  On a shared GPU server other users see ``/dev/shm`` and may guess
every name there (``gpucell-<pid>-...``); where ``fs.protected_symlinks`` is 0
a link one of them plants at a name this process is about to open would make it
write through that link into any file its user owns.  So everything is created
here: with ``O_CREAT|O_EXCL|O_NOFOLLOW`` (a name that exists, link or not, is
never opened for writing), mode 0600, under a temporary name nobody can guess
(random bytes, not the pid), then renamed into place (a rename replaces a link
planted at the final name instead of following it); folders are 0700.  Readers
open with ``O_NOFOLLOW`` too.  Standard library only (engines and the
controller's boot import it).
"""

from __future__ import annotations

import contextlib
import os
import stat

__all__ = [
    "FILE_MODE",
    "FOLDER_MODE",
    "create",
    "make_folder",
    "open_to_read",
    "read",
    "temporary_name",
    "tighten_folder",
    "touch",
    "write",
]

FILE_MODE = 0o600
FOLDER_MODE = 0o700

_NEW = os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def temporary_name(path: str | os.PathLike[str]) -> str:
    """A name beside ``path`` no other user can guess (16 random hex digits;
    the name starts with ``path``, so sweeps of ``path``'s prefix take it)."""
    return f"{os.fspath(path)}.{os.urandom(8).hex()}.tmp"


def create(path: str | os.PathLike[str], flags: int = os.O_WRONLY) -> int:
    """A descriptor of a new file at ``path``, 0600: ``FileExistsError`` when
    the name exists (a file, or a link someone planted: never followed)."""
    fd = os.open(path, flags | _NEW, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # exactly 0600, whatever the umask
    except OSError:
        os.close(fd)
        raise
    return fd


def write(path: str | os.PathLike[str], data: bytes, *, sync: bool = False) -> None:
    """``data`` as ``path``, whole or not at all: written to a new 0600 file
    under a temporary name, then renamed over ``path`` (which is replaced, not
    followed, when it is a link).  ``sync``: flushed to disk before the rename."""
    tmp = temporary_name(path)
    fd = create(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if sync:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def touch(path: str | os.PathLike[str]) -> None:
    """Make sure ``path`` is a regular 0600 file of this user's before another
    program appends to it (a log): created 0600 if missing; an existing file of
    ours is made 0600; a link or another user's file is an ``OSError``."""
    try:
        fd = create(path)
    except FileExistsError:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
                raise PermissionError(f"{os.fspath(path)} is not a file of yours")
            if stat.S_IMODE(st.st_mode) != FILE_MODE:
                os.fchmod(fd, FILE_MODE)
        finally:
            os.close(fd)
        return
    os.close(fd)


def open_to_read(path: str | os.PathLike[str]) -> int:
    """A read-only descriptor of a regular file of this user's at ``path``:
    never through a link, and a file another user made there (say, planted
    in ``/dev/shm`` under a name it guessed) is a ``PermissionError``."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid():
            raise PermissionError(
                f"{os.fspath(path)} is not a file of this user's: not read"
            )
    except BaseException:
        os.close(fd)
        raise
    return fd


def read(path: str | os.PathLike[str], limit: int = -1) -> bytes:
    """The bytes of ``path`` (at most ``limit``), a file of this user's read
    never through a link (see :func:`open_to_read`)."""
    with os.fdopen(open_to_read(path), "rb") as f:
        return f.read(limit)


def tighten_folder(path: str | os.PathLike[str]) -> bool:
    """Make an existing folder of this user's 0700 (a link, or another user's
    folder, is left alone).  True when it is (now) 0700."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_DIRECTORY", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return False  # missing, a link, not a folder
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            return False
        if stat.S_IMODE(st.st_mode) != FOLDER_MODE:
            os.fchmod(fd, FOLDER_MODE)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def make_folder(path: str | os.PathLike[str]) -> None:
    """A folder at ``path``, 0700: made if missing (its parents must exist), an
    existing one of ours tightened; anything else there (a link, a file,
    another user's folder) is a ``FileExistsError``."""
    try:
        os.mkdir(path, FOLDER_MODE)
    except FileExistsError:
        pass
    if not tighten_folder(path):
        raise FileExistsError(
            f"{os.fspath(path)} exists and is not a folder of this user's"
        )
