"""One writer per folder: the lock a tokenize job holds on its --output and a trainer run (its
primary process) on its run_dir, for the life of the job or run.

    with FolderLock(folder, "python -m trainer.main").acquire():   # LockHeld names the holder
        ...
    probe(folder)                                                   # creates nothing

The lock is `folder/.olmax.lock` (a dot name: never a source name, never a job's output). Its
content names the holder: pid, host, the process's start time (so a reused pid is not taken for
the holder) and when and why it took the lock.

- **Local and NFS file systems**: `fcntl.flock` on that file, held open for the lock's life. The
  kernel releases it when the holder ends, however it ends (SIGKILL too), so a stale lock is
  simply free: the next process takes it and logs the holder it replaces. The file is never
  deleted (deleting a flock'ed file lets two processes each lock another inode); release empties it.
- **Where flock does not exist** (a FUSE mount without lock support, e.g. gcsfuse; an object store
  such as gs:// through `ObjectLockStore`): the file's content is the lock. A holder on this host is
  taken over only when its process is gone (pid absent, or another process with its pid); a holder on
  another host is never presumed dead: the refusal names it and says to delete the file if it is
  gone. This is best effort, plainly: reading and writing the file is not atomic, so two processes
  starting within the same moment may both take it; it protects against a second job started while
  one runs, the case that happens.

Hand-written: the standard library has flock but no lock file naming its holder with stale-holder
recognition, and no package the project uses provides one for both a local folder and gs://.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from .errors import Refused

LOCK_NAME = ".olmax.lock"
# flock is not supported here: fall back to the content protocol (ENOLCK: NFS without lockd)
_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL}

log = logging.getLogger(__name__)


class LockHeld(Refused, RuntimeError):
    """Another process holds the folder: the message names it (pid, host, since, command)."""

    def __init__(self, folder: str, holder: dict[str, Any] | None, hint: str = ""):
        self.folder, self.holder = folder, holder
        super().__init__(
            f"{folder} is in use by {describe(holder)}: refusing to write into it at the same time"
            + (f"; {hint}" if hint else "")
        )


def describe(holder: dict[str, Any] | None) -> str:
    if not holder:
        return "another process (it does not say which)"
    return (
        f"pid {holder.get('pid')} on host {holder.get('host')} since {holder.get('since')} "
        f"({holder.get('purpose')}: {holder.get('command')})"
    )


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), None where
    there is no /proc or no such process. A pid reused by another process has another start time."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    return int(stat.rsplit(b")", 1)[1].split()[19])  # fields after "(comm)": state is field 3


def this_process(purpose: str) -> dict[str, Any]:
    return {
        "pid": os.getpid(),
        "host": socket.gethostname(),
        "start_ticks": _start_ticks(os.getpid()),
        "since": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "purpose": purpose,
        "command": " ".join(sys.argv)[:500],
    }


def alive(holder: dict[str, Any]) -> bool | None:
    """Is the recorded holder still running? True/False on its own host; None (unknown) elsewhere."""
    if holder.get("host") != socket.gethostname() or not isinstance(holder.get("pid"), int):
        return None
    pid = holder["pid"]
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's
        pass
    ticks = _start_ticks(pid)
    return ticks is None or holder.get("start_ticks") in (None, ticks)


def parse(raw: bytes) -> dict[str, Any] | None:
    """A lock file's holder, None when it is empty (released) or unreadable."""
    try:
        holder = json.loads(raw)
    except ValueError:
        return None
    return holder if isinstance(holder, dict) else None


def _refuse_live(folder: str, path: str, holder: dict[str, Any] | None) -> None:
    """The content protocol: refuse unless the recorded holder is certainly gone."""
    if holder is None:
        return
    state = alive(holder)
    if state is False:
        log.warning("%s: taking over the lock of %s, which ended without releasing it", folder, describe(holder))
        return
    raise LockHeld(
        folder, holder, "" if state else f"if that process is no longer running, delete {path} and start again"
    )


class ObjectLockStore:
    """The content protocol over any store without flock (gs:// through Beam's FileSystems):
    read() -> bytes (b"" when absent), write(bytes), delete()."""

    def __init__(
        self, path: str, read: Callable[[], bytes], write: Callable[[bytes], object], delete: Callable[[], object]
    ):
        self.path, self.read, self.write, self.delete = path, read, write, delete


class FolderLock:
    """The lock on `folder` (created when missing). acquire() raises LockHeld naming the holder."""

    def __init__(self, folder: str | os.PathLike[str], purpose: str, store: ObjectLockStore | None = None):
        self.folder, self.purpose, self.store = os.fspath(folder), purpose, store
        self.path = store.path if store else os.path.join(self.folder, LOCK_NAME)
        self._fd: int | None = None
        self._me: dict[str, Any] | None = None

    def acquire(self) -> FolderLock:
        me = this_process(self.purpose)
        data = (json.dumps(me) + "\n").encode()
        if self.store is not None:
            _refuse_live(self.folder, self.path, parse(self.store.read()))
            self.store.write(data)
            self._me = me
            return self
        import fcntl  # POSIX only: imported where a lock is taken (the module imports anywhere)

        os.makedirs(self.folder, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)  # less the umask, as open()
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise LockHeld(self.folder, parse(_read_fd(fd))) from None
            except OSError as e:
                if e.errno not in _NO_FLOCK:
                    raise
                log.warning(
                    "%s: this file system has no flock (%s): the lock is its content only, "
                    "best effort (see contract.lock)",
                    self.folder,
                    e.strerror,
                )
                _refuse_live(self.folder, self.path, parse(_read_fd(fd)))
            else:
                previous = parse(_read_fd(fd))
                if previous is not None:  # flock is free, so its holder is gone
                    log.warning(
                        "%s: taking over the lock of %s, which ended without releasing it",
                        self.folder,
                        describe(previous),
                    )
            os.ftruncate(fd, 0)
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        self._fd, self._me = fd, me
        return self

    def release(self) -> None:
        """Empty the lock file (an object: delete it) and let go. Idempotent."""
        if self._me is None:
            return
        try:
            if self.store is not None:
                if parse(self.store.read()) == self._me:  # never delete another holder's lock
                    self.store.delete()
            elif self._fd is not None:
                os.ftruncate(self._fd, 0)
                os.close(self._fd)  # closing releases the flock
        finally:
            self._fd, self._me = None, None

    def __enter__(self) -> FolderLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _read_fd(fd: int) -> bytes:
    return os.pread(fd, 1 << 16, 0)


def probe(folder: str | os.PathLike[str]) -> None:
    """Raise LockHeld when a live process holds `folder` (local folders); creates nothing, so a
    process can refuse before any check whose work would be wasted."""
    folder = os.fspath(folder)
    path = os.path.join(folder, LOCK_NAME)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return  # no lock file (or no folder): nobody holds it
    try:
        import fcntl  # POSIX only: imported where a lock is taken (the module imports anywhere)

        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise LockHeld(folder, parse(_read_fd(fd))) from None
        except OSError as e:
            if e.errno not in _NO_FLOCK:
                raise
            _refuse_live(folder, path, parse(_read_fd(fd)))
    finally:
        os.close(fd)  # a shared lock taken here goes with it
