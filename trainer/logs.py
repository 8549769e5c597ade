"""What a run writes next to its checkpoints: metrics.jsonl, data_log/, summary.json, console.

The data logs' naming and line layout and the consumed-stream hash are the data contract's
(`contract.datalog`, shared with the audit); run.json is written by `trainer.data_contract`.

Step numbering: step ``s`` (0-based) trains on the loader's global batch ``s``; its metrics
line and data-log line carry ``"step": s``; the checkpoint written after it is ``s + 1`` (updates
applied). On restart from checkpoint ``k`` the logs are cut back to the lines with step < k,
so every step appears exactly once however often the run was killed.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import jax
import numpy as np
from jax.experimental import multihost_utils

from contract import parse_data_log_name, write_atomic
from contract.rundir import RunDir

log = logging.getLogger(__name__)

# the run directory's files, as the contract names them (contract.rundir.RunDir)
METRICS = RunDir.METRICS
SUMMARY = RunDir.SUMMARY
DATA_LOG_DIR = RunDir.DATA_LOG
CONFIG = RunDir.CONFIG  # the resolved config of the latest start (for people; the audit reads run.json)
LAST_LOSSES = 10  # losses quoted in summary.json


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Complete JSON lines of a file (a torn last line from a kill is dropped)."""
    rows: list[dict[str, Any]] = []
    if not Path(path).exists():
        return rows
    with open(path) as f:
        for line in f:
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                if line.endswith("\n"):
                    raise ValueError(f"{path}: corrupt line {line[:80]!r}") from None
    return rows


BLOCK = 1 << 16  # bytes read at a time when a log is read backwards


def lines_backwards(f: BinaryIO, end: int, block: int = BLOCK) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` of each line of ``f[:end]``, the last first (a line keeps its newline;
    a torn last line has none). Reads only the lines it yields (plus one block): O(lines read)
    time, memory one block plus the longest line, whatever the file's size. Hand-written: Python
    and the libraries here read files forwards only."""
    buf, base, hi = b"", end, end  # buf holds f[base : base + len(buf)]; the current line ends at hi
    while hi > 0:
        k = hi - 1 - base  # a newline before the current line's own last byte ends the line before
        i = buf.rfind(b"\n", 0, k) if k > 0 else -1
        while i < 0 and base > 0:
            n = min(block, base)
            f.seek(base - n)
            buf = f.read(n) + buf[: hi - base]
            base -= n
            k = hi - 1 - base
            i = buf.rfind(b"\n", 0, k) if k > 0 else -1
        start = base + i + 1
        yield start, buf[start - base : hi - base]
        hi = start


def _row(path: Path, line: bytes) -> dict[str, Any] | None:
    """A log line's row; None for a torn last line that is no JSON, ValueError for a corrupt line."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        if line.endswith(b"\n"):
            raise ValueError(f"{path}: corrupt line {line[:80]!r}") from None
        return None


def tail_rows(path: str | Path) -> Iterator[dict[str, Any]]:
    """The complete rows of a JSONL log, the last first, read backwards (a torn last line is
    skipped): what the end of a run needs from its log without reading it whole."""
    path = Path(path)
    if not path.exists():
        return
    with open(path, "rb") as f:
        for _, line in lines_backwards(f, f.seek(0, os.SEEK_END)):
            row = _row(path, line)
            if row is not None:
                yield row


def truncate_jsonl(path: str | Path, before_step: int) -> int:
    """Keep only the lines with step < before_step, cut in place: the log's lines are in step
    order (each run appends after cutting), so it is truncated at the byte offset of its first
    line with step >= before_step, found by reading backwards from the end (lines_backwards:
    O(lines removed) time, O(1) memory). A torn last line is dropped, or kept with its newline
    when it is a whole row of an earlier step (the bytes the old whole-file rewrite made;
    tests/trainer/test_logs_cut.py proves them equal). Returns the lines removed."""
    path = Path(path)
    if not path.exists():
        return 0
    removed = 0
    with open(path, "r+b") as f:
        size = f.seek(0, os.SEEK_END)
        cut, newline = size, False
        for start, line in lines_backwards(f, size):
            row = _row(path, line)
            if row is not None and row["step"] < before_step:
                newline = not line.endswith(b"\n")
                break
            cut, removed = start, removed + 1
        if cut < size:
            f.truncate(cut)
        if newline:
            f.seek(0, os.SEEK_END)
            f.write(b"\n")
    return removed


class JsonlWriter:
    """Appends one JSON object per line, flushed at once (a kill loses at most a torn line)."""

    def __init__(self, path: str | Path, before_step: int):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        truncate_jsonl(self.path, before_step)
        self._f = open(self.path, "a")  # noqa: SIM115 - held for the run, closed by close()

    def write(self, row: dict[str, Any]) -> None:
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def truncate_other_data_logs(run: RunDir, process_count: int, before_step: int) -> int:
    """Cut back the data logs of other host counts (an elastic restart leaves them behind), once:
    ``data_logs_settled.json`` (RunDir.data_logs_settled) records each one's cut as name → [the
    step it was cut before, its size then], so a later restart from a step at or past that cut,
    with the file's size unchanged (a stat, no open), leaves it unopened. A log is only ever cut or
    appended to, so the same size after a cut at k is the same bytes: its lines all before step k.
    Logs of this host count leave the record (this run appends to them). Returns the logs cut."""
    settled = read_settled(run.data_logs_settled)
    changed, cut = False, 0
    for path in run.data_logs():
        parsed = parse_data_log_name(path.name)
        if parsed is not None and parsed[1] == process_count:
            changed |= settled.pop(path.name, None) is not None
            continue
        entry = settled.get(path.name)
        if entry is not None and entry[0] <= before_step and entry[1] == path.stat().st_size:
            continue  # cut at an earlier restart and untouched since: nothing at or past before_step
        truncate_jsonl(path, before_step)
        settled[path.name], changed, cut = [before_step, path.stat().st_size], True, cut + 1
    if changed:
        write_atomic(run.data_logs_settled, json.dumps({"version": SETTLED_VERSION, "logs": settled}, sort_keys=True))
    return cut


SETTLED_VERSION = 1


def read_settled(path: Path) -> dict[str, list[int]]:
    """data_logs_settled.json's name → [cut before step, size]; {} when absent or unreadable (every
    other host count's log is then cut again, as before the record: slower, never wrong)."""
    try:
        d = json.loads(path.read_text())
        logs = d["logs"] if d.get("version") == SETTLED_VERSION else {}
        return {str(k): [int(v[0]), int(v[1])] for k, v in logs.items()}
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return {}


# ----------------------------------------------------------------------------- hashes


def params_sha256(params: Any) -> str:
    """sha256 over every parameter, in ``jax.tree`` flatten order (dict keys sorted): for each
    leaf its path, dtype and shape as text, then its bytes (C order, little-endian).

    Collective in multi-process runs (every process must call it): leaves that are not fully
    addressable are all-gathered one at a time.
    """
    h = hashlib.sha256()
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            leaf = multihost_utils.process_allgather(leaf, tiled=True)
        arr = np.ascontiguousarray(np.asarray(leaf))
        arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
        h.update(f"{jax.tree_util.keystr(path)}:{arr.dtype.str}:{list(arr.shape)};".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def gather_global(local: np.ndarray) -> np.ndarray:
    """Host slices [G/H] → the global batch [G] in host order (collective when H > 1)."""
    if jax.process_count() == 1:
        return np.asarray(local)
    return np.asarray(multihost_utils.process_allgather(np.asarray(local), tiled=True))


# ----------------------------------------------------------------------------- console


class Progress:
    """Console progress line: the step as metrics.jsonl numbers it (0-based: the update on batch s)
    and the updates done of the total, loss, tokens/s, ETA (primary process only); after an evaluation,
    the next line adds the overall held-out loss and each set's (`trainer.heldout_eval` keys)."""

    def __init__(self, total_steps: int, every: int, enabled: bool):
        self.total, self.every, self.enabled = total_steps, every, enabled and every > 0
        self._times: list[float] = []
        self._heldout: str | None = None  # the latest evaluation, not printed yet

    def update(self, step: int, row: dict[str, Any], step_seconds: float) -> None:
        self._times = (self._times + [step_seconds])[-20:]
        if "heldout_loss" in row:
            self._heldout = heldout_text(row)
        if not self.enabled or ((step + 1) % self.every and step + 1 != self.total):
            return
        left = (self.total - step - 1) * float(np.median(self._times))
        eta = duration_text(left)
        skipped = " | SKIPPED" if row.get("skipped") else ""
        extra, self._heldout = (f" | {self._heldout}" if self._heldout else ""), None
        print(
            f"step {step:>6} ({step + 1}/{self.total}) | loss {row['loss']:.4f} | lr {row['lr']:.3e} | "
            f"{row['tokens_per_s']:,.0f} tok/s | ETA {eta}{skipped}{extra}",
            flush=True,
        )


def duration_text(seconds: float) -> str:
    """``HH:MM:SS``, with whole days in front past 24 h (``2d 07:30:00``) (pure)."""
    days, rest = divmod(int(seconds), 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}d {hms}" if days else hms


def heldout_text(row: dict[str, Any]) -> str:
    """'heldout_loss 3.1234 (heldout/c4_en-validation/loss 3.3000, ...)' of an evaluation row: each
    value under its metrics.jsonl key (pure)."""
    from trainer.heldout_eval import OVERALL, set_key, set_losses  # (it imports Grain: only when used)

    sets = set_losses(row)
    per_set = ", ".join(f"{set_key(k, 'loss')} {v:.4f}" for k, v in sets.items())
    return f"{OVERALL} {row[OVERALL]:.4f}" + (f" ({per_set})" if len(sets) > 1 else "")


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def last_losses(rows: Iterable[dict[str, Any]], n: int = LAST_LOSSES) -> list[float]:
    return [r["loss"] for r in rows][-n:]


def summary_of_tail(metrics: Path) -> dict[str, Any]:
    """summary.json's ``last_losses`` and ``heldout_loss`` (the newest held-out loss) from the end
    of ``metrics.jsonl``, read backwards: the rows since the last evaluation, not the whole log
    (the last step is always evaluated, so with evaluation on that is LAST_LOSSES rows; a run
    that never evaluates reads its log whole, backwards, once, at its end, as before)."""
    losses: list[float] = []
    held: list[Any] = []  # the newest row's held-out loss, once found
    for row in tail_rows(metrics):
        if len(losses) < LAST_LOSSES:
            losses.append(row["loss"])
        if not held and "heldout_loss" in row:
            held.append(row["heldout_loss"])
        if held and len(losses) == LAST_LOSSES:
            break
    return {"last_losses": losses[::-1], "heldout_loss": held[0] if held else None}


@dataclasses.dataclass
class RunningSummary:
    """summary.json's ``last_losses`` and ``heldout_loss``, kept as the run goes: the step logger
    adds every metrics row it writes, and each checkpoint's meta carries it (``to_json``), so a
    resumed run continues it from its checkpoint (``from_json``) and its summary equals an
    unbroken run's without reading ``metrics.jsonl`` (tests/trainer/test_summary_kept.py)."""

    last_losses: list[float] = dataclasses.field(default_factory=list)
    heldout_loss: Any = None  # the newest row's held-out loss (None: no evaluation yet)

    def add(self, row: dict[str, Any]) -> None:
        self.last_losses = [*self.last_losses, row["loss"]][-LAST_LOSSES:]
        if "heldout_loss" in row:
            self.heldout_loss = row["heldout_loss"]

    def to_json(self) -> dict[str, Any]:
        return {"last_losses": list(self.last_losses), "heldout_loss": self.heldout_loss}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RunningSummary:
        return cls([float(x) for x in d["last_losses"]][-LAST_LOSSES:], d["heldout_loss"])

    @classmethod
    def of_tail(cls, metrics: Path) -> RunningSummary:
        """From the tail of ``metrics`` (``summary_of_tail``): a resume from a checkpoint written
        before the summary was kept in it, once the log is cut back to that checkpoint."""
        return cls.from_json(summary_of_tail(metrics))
