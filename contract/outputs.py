"""Where a command writes: checked before its work, written atomically (standard library only).

    check_out_dir(out)        --out is a folder this process can write into (made if absent)
    check_out_file(path)      a file's folder is (or can be made) writable, and the path is no folder
    write_atomic(path, data)  a temporary name in the same folder, then os.replace over `path`

A place that cannot be written is an `OutputRefused` (a Refused: exit 2, nothing done yet); a write
that fails once the work is done (a full disk, a folder removed meanwhile) is a `WriteFailed` (a
Stopped), and leaves the old file or none, never a half: the temporary file is removed.
Hand-written: the standard library has no atomic replace-write (tempfile + os.replace is the idiom).
"""

from __future__ import annotations

import os
import tempfile

from .errors import Refused, Stopped


class OutputRefused(Refused, OSError):
    """A place the command would write to that it cannot (checked before its work)."""


class WriteFailed(Stopped, OSError):
    """Writing an output failed (after the work): the old file, or none, is left."""


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


def check_out_dir(out: str, what: str = "--out") -> None:
    """`out` is a folder this process can create files in, or can be made one (its nearest existing
    ancestor a writable folder); OutputRefused otherwise. Nothing is created: a refused command
    leaves no trace (write_atomic makes the folder)."""
    if not out:
        raise OutputRefused(f"{what} is empty: name a folder")
    near = _nearest_existing(out)
    if not os.path.isdir(near):
        same = near == os.path.abspath(out)
        raise OutputRefused(f"{what} {out} " + ("exists and is not a folder" if same else f"is under {near}, a file"))
    try:
        with tempfile.TemporaryFile(dir=near):
            pass
    except OSError as e:
        raise OutputRefused(f"{what} {out}: cannot write in {near} ({e.strerror or e})") from None


def check_out_file(path: str, what: str = "--out") -> None:
    """`path` is not a folder, and its folder is (or is made) writable; OutputRefused otherwise."""
    if not path:
        raise OutputRefused(f"{what} is empty: name a file")
    if os.path.isdir(path):
        raise OutputRefused(f"{what} {path} is a folder, not a file")
    check_out_dir(os.path.dirname(os.path.abspath(path)), f"{what} {path}: its folder")


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write `data` to a temporary file beside `path` (its folder made if absent), flush it to disk,
    rename it over `path`; WriteFailed (one line naming `path`) on any OSError, the temporary file
    removed."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=folder)
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        tmp = None
    except OSError as e:
        raise WriteFailed(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
