"""One writer per folder (contract.lock): a second writer is refused naming the first;
a holder that died is recognised and its lock taken over; where flock does not exist the lock
file's content decides, never presuming a holder on another host dead."""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import subprocess
import sys

import pytest

from contract import lock as lk
from tests.modes import modes, umask

HOLD = (
    "import sys, time; from contract.lock import FolderLock; "
    "FolderLock(sys.argv[1], 'test holder').acquire(); print('held', flush=True); time.sleep(120)"
)


def hold(folder):
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(folder)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_a_second_writer_is_refused_naming_the_holder_and_a_killed_holders_lock_is_taken_over(tmp_path, caplog):
    proc = hold(tmp_path / "out")
    try:
        with pytest.raises(lk.LockHeld, match=rf"is in use by pid {proc.pid} on host .* \(test holder: ") as e:
            lk.FolderLock(str(tmp_path / "out"), "second").acquire()
        assert e.value.holder["pid"] == proc.pid
        with pytest.raises(lk.LockHeld, match=f"pid {proc.pid}"):
            lk.probe(str(tmp_path / "out"))
    finally:
        proc.send_signal(signal.SIGKILL)  # dies holding it: the kernel drops its flock
        proc.wait()
    with caplog.at_level(logging.WARNING, logger=lk.__name__):
        taken = lk.FolderLock(str(tmp_path / "out"), "second").acquire()
    assert f"taking over the lock of pid {proc.pid}" in caplog.text
    assert json.loads((tmp_path / "out" / lk.LOCK_NAME).read_text())["pid"] == os.getpid()
    taken.release()
    assert (tmp_path / "out" / lk.LOCK_NAME).read_bytes() == b""  # released: empty, never deleted
    lk.probe(str(tmp_path / "out"))
    lk.FolderLock(str(tmp_path / "out"), "third").acquire().release()


@pytest.mark.parametrize(
    "mask,mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)], ids=["umask022", "umask077", "umask002"]
)
def test_the_lock_file_has_a_plain_files_mode_under_the_umask(tmp_path, mask, mode):
    """A group-shared folder (umask 002) gave every output 0664 but its lock 0644 (os.open's 0o644):
    a teammate in the group could not open the lock to take the folder after the holder ended."""
    with umask(mask):
        lk.FolderLock(str(tmp_path / "out"), "test").acquire().release()
    assert modes(tmp_path / "out", [lk.LOCK_NAME]) == {lk.LOCK_NAME: mode}


def test_probe_creates_nothing(tmp_path):
    lk.probe(str(tmp_path / "new"))
    assert not (tmp_path / "new").exists()


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


@pytest.fixture
def no_flock(monkeypatch):
    import fcntl

    def flock(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", flock)


def write_holder(folder, **holder):
    folder.mkdir(parents=True, exist_ok=True)
    (folder / lk.LOCK_NAME).write_text(json.dumps({"since": "then", "purpose": "p", "command": "c", **holder}))


def test_without_flock_a_live_holder_or_one_on_another_host_is_refused_and_a_gone_one_taken_over(tmp_path, no_flock):
    me = lk.this_process("x")
    write_holder(tmp_path, pid=os.getppid(), host=me["host"], start_ticks=lk._start_ticks(os.getppid()))
    with pytest.raises(lk.LockHeld, match=f"pid {os.getppid()}"):
        lk.FolderLock(str(tmp_path), "t").acquire()
    write_holder(tmp_path, pid=os.getppid(), host="another-host", start_ticks=1)
    with pytest.raises(lk.LockHeld, match=f"if that process is no longer running, delete {tmp_path / lk.LOCK_NAME}"):
        lk.FolderLock(str(tmp_path), "t").acquire()
    write_holder(tmp_path, pid=dead_pid(), host=me["host"], start_ticks=None)  # gone
    lk.FolderLock(str(tmp_path), "t").acquire().release()
    if me["start_ticks"] is not None:  # its pid now another process (started at another time): gone too
        write_holder(tmp_path, pid=os.getpid(), host=me["host"], start_ticks=me["start_ticks"] + 1)
        lock = lk.FolderLock(str(tmp_path), "t").acquire()
        assert json.loads((tmp_path / lk.LOCK_NAME).read_text())["start_ticks"] == me["start_ticks"]
        lock.release()


def test_an_object_store_lock_refuses_a_second_writer_and_deletes_only_its_own(tmp_path):
    objects: dict[str, bytes] = {}
    path = "gs://bucket/out/" + lk.LOCK_NAME

    def store():
        return lk.ObjectLockStore(
            path, lambda: objects.get(path, b""), lambda b: objects.__setitem__(path, b), lambda: objects.pop(path)
        )

    first = lk.FolderLock("gs://bucket/out", "job", store()).acquire()
    objects[path] = objects[path].replace(b'"host": "', b'"host": "elsewhere-')  # as seen from another host
    with pytest.raises(lk.LockHeld, match="if that process is no longer running, delete gs://bucket/out/"):
        lk.FolderLock("gs://bucket/out", "job", store()).acquire()
    first.release()
    assert path in objects  # not ours any more: left alone
    objects.pop(path)
    lk.FolderLock("gs://bucket/out", "job", store()).acquire().release()
    assert path not in objects
