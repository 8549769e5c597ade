"""Where a command writes: checked before its work, written atomically (standard library only).

    check_out_dir(out, own=KIND)  --out is a folder this process can write into (made if absent)
                                  that holds no other command's output
    check_out_file(path)          a file's folder is (or can be made) writable, the path is no
                                  folder and no other command's output file
    check_output_kind(folder, own)  the folder holds no output of another command than `own`
    write_atomic(path, data)      a temporary name in the same folder, then os.replace over `path`
    open_temp(folder, name)       that temporary file: exclusive, with a plain open()'s mode

A place that cannot be written is an `OutputRefused` (a Refused: exit 2, nothing done yet); a write
that fails once the work is done (a full disk, a folder removed meanwhile) is a `WriteFailed` (a
Stopped), and leaves the old file or none, never a half: the temporary file is removed.
Hand-written: the standard library has no atomic replace-write (tempfile + os.replace is the idiom),
and tempfile.mkstemp makes its file 0600 whatever the umask, so a report written through it would
be hidden from the teammates and the web server that read every other output: `open_temp` makes
it as open() does (0666 less the umask, and the folder's default ACL).

One output folder, one command: each command's output is told by the files only it writes at the
top of its folder (`KINDS`: a tokenize output's manifest.json, a training run's run.json, an
audit's audit.json and report.html, ...), and every command refuses an output folder that holds
another command's output (a run trained into a tokenize output, an audit written into a run).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Iterable

from .errors import Refused, Stopped
from .manifest import MANIFEST_NAME
from .run import RUN_RECORD_NAME, SUMMARY_NAME
from .rundir import RunDir


class OutputRefused(Refused, OSError):
    """A place the command would write to that it cannot (checked before its work)."""


class WriteFailed(Stopped, OSError):
    """Writing an output failed (after the work): the old file, or none, is left."""


# ----------------------------------------------------------------------------- one folder, one command


@dataclasses.dataclass(frozen=True)
class OutputKind:
    """One command's output folder: what it is (``what``), who writes it (``command``) and the files
    at its top that only that command writes (``markers``; any one of them tells the kind)."""

    what: str
    command: str
    markers: tuple[str, ...]


TOKENIZE_MARKER = "olmax-output.json"  # pipelines.outdir's marker, written before the job's first shard
DOWNSTREAM_TASKS_FORMAT = "olmax-downstream-tasks"  # contract.downstream.FORMAT: its manifest.json's "format"
TOKENIZE_OUTPUT = OutputKind("a tokenize output", "python -m pipelines.tokenize", (MANIFEST_NAME, TOKENIZE_MARKER))
TASK_BUILD = OutputKind("a downstream task build", "python -m pipelines.downstream_tasks", (MANIFEST_NAME,))
TRAINING_RUN = OutputKind("a training run", "python -m trainer.main", (RUN_RECORD_NAME, RunDir.METRICS, SUMMARY_NAME))
AUDIT_REPORT = OutputKind("an audit report", "python -m audit", ("audit.json", "report.html"))
COMPARE_REPORT = OutputKind("a compare report", "python -m compare", ("compare.json", "compare.html"))
LESSONS_REPORT = OutputKind("a lessons report", "python -m lessons", ("lessons.json", "lessons.md"))
KINDS = (TOKENIZE_OUTPUT, TASK_BUILD, TRAINING_RUN, AUDIT_REPORT, COMPARE_REPORT, LESSONS_REPORT)


def _manifest_kind(data: bytes | None) -> OutputKind:
    """Whose manifest.json: a downstream task build's names its format; any other is a tokenize
    output's (an unreadable or damaged one too: the tokenize job's own check tells those apart)."""
    try:
        raw = json.loads(data) if data is not None else None
    except ValueError:
        raw = None
    is_tasks = isinstance(raw, dict) and raw.get("format") == DOWNSTREAM_TASKS_FORMAT
    return TASK_BUILD if is_tasks else TOKENIZE_OUTPUT


def kinds_in(names: Iterable[str], read: Callable[[str], bytes | None]) -> list[tuple[OutputKind, str]]:
    """The outputs a folder holds, each with the marker that tells it, from the names at its top
    and `read(name)` (a file's bytes, None when unreadable; only manifest.json is read)."""
    names = set(names)
    found = []
    for kind in KINDS:
        for marker in kind.markers:
            if marker in names and (marker != MANIFEST_NAME or _manifest_kind(read(marker)) is kind):
                found.append((kind, marker))
                break
    return found


def output_kinds(folder: str | os.PathLike) -> list[tuple[OutputKind, str]]:
    """`kinds_in` of a local folder ([] when it is no folder)."""
    folder = os.fspath(folder)

    def read(name: str) -> bytes | None:
        try:
            with open(os.path.join(folder, name), "rb") as f:
                return f.read()
        except OSError:
            return None

    try:
        names = os.listdir(folder)
    except OSError:  # absent, or no folder: nothing in it
        return []
    return kinds_in(names, read)


def other_output_refusal(folder: str, found: list[tuple[OutputKind, str]], own: OutputKind, what: str) -> str | None:
    """The refusal of `own`'s output folder `folder` holding `found` (`kinds_in`), or None."""
    other = [(kind, marker) for kind, marker in found if kind is not own]
    if not other:
        return None
    kind, marker = other[0]
    return (
        f"{what} {folder} holds {kind.what} ({marker}, written by {kind.command}): {own.command} does not "
        f"write into another command's output; name a new or empty folder (or one of its own outputs)"
    )


def check_output_kind(folder: str | os.PathLike, own: OutputKind, what: str = "--out") -> None:
    """OutputRefused when local `folder` holds another command's output than `own`'s."""
    problem = other_output_refusal(os.fspath(folder), output_kinds(folder), own, what)
    if problem:
        raise OutputRefused(problem)


def _nearest_existing(path: str) -> str:
    p = os.path.abspath(path)
    while not os.path.exists(p) and os.path.dirname(p) != p:
        p = os.path.dirname(p)
    return p


REMOTE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:/")  # gs://b/x, and gs:/b/x (a pathlib.Path of it)


def _refuse_remote(out: str, what: str) -> None:
    """These outputs are written with local file calls: a URL would become a local folder "gs:"."""
    if REMOTE.match(out):
        raise OutputRefused(
            f"{what} {out}: a remote location; this command writes a local folder: name one (and copy it there after)"
        )


def check_out_dir(out: str, what: str = "--out", own: OutputKind | None = None) -> None:
    """`out` is a folder this process can create files in, or can be made one (its nearest existing
    ancestor a writable folder), holding no other command's output than `own`'s (when given);
    OutputRefused otherwise. Nothing is created: a refused command leaves no trace (write_atomic
    makes the folder)."""
    if not out:
        raise OutputRefused(f"{what} is empty: name a folder")
    _refuse_remote(out, what)
    near = _nearest_existing(out)
    if not os.path.isdir(near):
        same = near == os.path.abspath(out)
        raise OutputRefused(f"{what} {out} " + ("exists and is not a folder" if same else f"is under {near}, a file"))
    try:
        with tempfile.TemporaryFile(dir=near):
            pass
    except OSError as e:
        raise OutputRefused(f"{what} {out}: cannot write in {near} ({e.strerror or e})") from None
    if own is not None:
        check_output_kind(out, own, what)


def check_out_file(path: str, what: str = "--out") -> None:
    """`path` is not a folder nor a file that tells another command's output (an audit's audit.json,
    a run's summary.json), and its folder is (or is made) writable; OutputRefused otherwise."""
    if not path:
        raise OutputRefused(f"{what} is empty: name a file")
    _refuse_remote(path, what)
    if os.path.isdir(path):
        raise OutputRefused(f"{what} {path} is a folder, not a file")
    folder = os.path.dirname(os.path.abspath(path))
    for kind, _ in output_kinds(folder):
        if os.path.basename(path) in kind.markers:
            raise OutputRefused(
                f"{what} {path} is a file of {kind.what} (written by {kind.command}): name another file"
            )
    check_out_dir(folder, f"{what} {path}: its folder")


def open_temp(folder: str, name: str) -> tuple[int, str]:
    """A new file `folder/.NAME.<random>.tmp` open for writing, and its path: exclusive (O_EXCL) as
    tempfile.mkstemp's, but made as open() makes a file (mode 0666 less the umask, the folder's
    default ACL), so that once renamed into place it reads as every other output does."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
    for _ in range(tempfile.TMP_MAX):
        path = os.path.join(folder, f".{name}.{secrets.token_hex(6)}.tmp")
        try:
            return os.open(path, flags, 0o666), path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free temporary name for {name} in {folder}")


def write_atomic(path: str | os.PathLike, data: str | bytes) -> None:
    """Write `data` to a temporary file beside `path` (its folder made if absent; `open_temp`: the
    modes of a plain open() and makedirs), flush it to disk, rename it over `path`; WriteFailed (one
    line naming `path`) on any OSError, the temporary file removed."""
    path = os.fspath(path)
    target = os.path.abspath(path)  # where check_out_dir looked: DIR/missing/.. is DIR (the kernel finds no missing/)
    folder = os.path.dirname(target)
    tmp = None
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = open_temp(folder, os.path.basename(path))
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
        tmp = None
    except OSError as e:
        raise WriteFailed(f"cannot write {path}: {e.strerror or e}") from None
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)
