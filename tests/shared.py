"""Session fixtures built once per test session, however many pytest-xdist workers run it.

`make test` runs the suite on two workers (`-n 2 --dist loadfile`): each worker is its own pytest
session, so a session fixture would otherwise be built twice — a Beam job or a trainer run each
time. `build_once` is pytest-xdist's documented recipe for that (a file lock in the folder all
workers of one run share), with `fcntl` rather than the filelock package so that the test extra
needs nothing more.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

T = TypeVar("T")


def build_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], T]) -> T:
    """`build(folder)` for the whole run: the first worker to ask builds it into a folder every
    worker sees, under a lock, and pickles the value; the others wait for the lock and load it.
    Without xdist it is `build(tmp_path_factory.mktemp(name))`. The folder is shared, so a test that
    changes what the value points at works on a copy (as it must already: later tests read it too)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return build(tmp_path_factory.mktemp(name))
    root = tmp_path_factory.getbasetemp().parent / "shared"  # above each worker's own basetemp
    root.mkdir(exist_ok=True)
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        done = root / f"{name}.pickle"
        if done.exists():
            return pickle.loads(done.read_bytes())
        folder = root / name
        shutil.rmtree(folder, ignore_errors=True)  # left by a build that failed in the other worker
        folder.mkdir()
        value = build(folder)
        done.write_bytes(pickle.dumps(value))
        return value
