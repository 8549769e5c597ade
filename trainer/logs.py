"""What a run writes next to its checkpoints: metrics.jsonl, data_log/, summary.json, console.

The data logs' naming and line layout and the consumed-stream hash are the data contract's
(`contract.datalog`, shared with the audit); run.json is written by `trainer.data_contract`.

Step numbering: step ``s`` (0-based) trains on the loader's global batch ``s``; its metrics
line and data-log line carry ``"step": s``; the checkpoint written after it is ``s + 1`` (updates
applied). On restart from checkpoint ``k`` the logs are cut back to the lines with step < k,
so every step appears exactly once however often the run was killed.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from contract import DATA_LOG_DIR, DATA_LOG_GLOB, parse_data_log_name
from contract.rundir import RunDir

log = logging.getLogger(__name__)

# the run directory's files, as the contract names them (contract.rundir.RunDir)
METRICS = RunDir.METRICS
SUMMARY = RunDir.SUMMARY
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


def truncate_jsonl(path: str | Path, before_step: int) -> None:
    """Keep only the lines with step < before_step (atomic rewrite)."""
    path = Path(path)
    if not path.exists():
        return
    keep = [r for r in read_jsonl(path) if r["step"] < before_step]
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in keep)
    os.replace(tmp, path)


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


def truncate_other_data_logs(run_dir: Path, process_count: int, before_step: int) -> None:
    """Cut back the data logs of other host counts (an elastic restart leaves them behind)."""
    for path in sorted((run_dir / DATA_LOG_DIR).glob(DATA_LOG_GLOB)):
        parsed = parse_data_log_name(path.name)
        if parsed is None or parsed[1] != process_count:
            truncate_jsonl(path, before_step)


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
    """Console progress line: step, loss, tokens/s, ETA (primary process only); after an evaluation,
    the next line adds the overall held-out loss and each set's (`trainer.evaluate` keys)."""

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
            f"step {step + 1:>6}/{self.total} | loss {row['loss']:.4f} | lr {row['lr']:.3e} | "
            f"{row['tokens_per_s']:,.0f} tok/s | ETA {eta}{skipped}{extra}",
            flush=True,
        )


def duration_text(seconds: float) -> str:
    """``HH:MM:SS``, with whole days in front past 24 h (``2d 07:30:00``) (pure)."""
    days, rest = divmod(int(seconds), 86400)
    hms = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}d {hms}" if days else hms


def heldout_text(row: dict[str, Any]) -> str:
    """'heldout 3.1234 (c4_en-validation 3.3000, ...)' of an evaluation row (pure)."""
    from trainer.evaluate import OVERALL, set_losses  # (trainer.evaluate imports Grain: only when used)

    sets = set_losses(row)
    per_set = ", ".join(f"{k} {v:.4f}" for k, v in sets.items())
    return f"heldout {row[OVERALL]:.4f}" + (f" ({per_set})" if len(sets) > 1 else "")


def write_summary(path: Path, summary: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def last_losses(rows: Iterable[dict[str, Any]], n: int = LAST_LOSSES) -> list[float]:
    return [r["loss"] for r in rows][-n:]
