"""A progress line on stderr while a long Beam pass runs (pipelines.tokenize, the audit's shard
pass): what was done so far, the rate and, where the total is known, the ETA; one line every
`OLMAX_PROGRESS_S` seconds (default 15; 0: off), whether stderr is a terminal or a CI log. A pass
that ends sooner prints none.

How it works with every local runner, the DirectRunner's worker processes included: each DoFn
instance counts into a `Meter`, which writes its totals (a few bytes of JSON, atomically) into a
file of its own in a folder of the launching machine at most every FLUSH_S seconds and when its
bundle ends; the launching process's `Reporter` thread adds the files up and prints the line.
(Beam's metrics would be the natural carrier, but the DirectRunner reports them only when the
pipeline has finished.) On a remote runner (Dataflow) the workers cannot write there: no meter,
no line (its console shows the job's progress).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from typing import IO, Any

INTERVAL_ENV = "OLMAX_PROGRESS_S"
DEFAULT_INTERVAL_S = 15.0
FLUSH_S = 2.0  # a worker writes its counts at most this often


def interval_s() -> float:
    """The seconds between lines: OLMAX_PROGRESS_S (a number; 0 or less, or more than a wait can
    take (inf, nan): 0, no lines), else 15."""
    text = os.environ.get(INTERVAL_ENV, "")
    try:
        seconds = float(text) if text.strip() else DEFAULT_INTERVAL_S
    except ValueError:
        return DEFAULT_INTERVAL_S
    return seconds if 0 < seconds <= threading.TIMEOUT_MAX else 0.0  # (Event.wait: OverflowError past it)


class Meter:
    """A worker's counts (`add`), written to its own file in `folder` (None: counts nothing).
    Pickled into a DoFn: the file is named on first write, so every copy writes its own."""

    def __init__(self, folder: str | None):
        self.folder = folder
        self.counts: Counter[str] = Counter()
        self._name: str | None = None
        self._last = 0.0

    def add(self, **counts: int) -> None:
        if self.folder is None:
            return
        self.counts.update(counts)
        now = time.monotonic()
        if now - self._last >= FLUSH_S:
            self._last = now
            self.flush()

    def flush(self) -> None:
        """Writes the totals (never fails the pass: a progress line is not worth a job)."""
        if self.folder is None or not self.counts:
            return
        self._name = self._name or f"{os.getpid()}-{uuid.uuid4().hex}.json"
        path = os.path.join(self.folder, self._name)
        try:
            with open(path + ".tmp", "w", encoding="utf-8") as f:
                json.dump(dict(self.counts), f)
            os.replace(path + ".tmp", path)
        except OSError:
            pass


def totals(folder: str) -> Counter[str]:
    """The counts of every meter that wrote into `folder` so far."""
    out: Counter[str] = Counter()
    try:
        names = [n for n in os.listdir(folder) if n.endswith(".json")]
    except OSError:
        return out
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8") as f:
                out.update({k: int(v) for k, v in json.load(f).items()})
        except (OSError, ValueError, TypeError, AttributeError):
            continue  # being replaced right now: the next line has it
    return out


def duration(seconds: float) -> str:
    s = int(round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def rate_line(what: str, unit: str, done: int, elapsed: float, total: int | None = None, extra: str = "") -> str:
    """'audit: 1,234,567 records in 2 min 05 s (9,876 records/s), 41% of 3,000,000, ETA 2 min 57 s'."""
    line = f"{what}: {done:,} {unit} in {duration(elapsed)} ({done / max(elapsed, 1e-9):,.0f} {unit}/s)"
    if total:
        line += f", {min(done, total) / total:.0%} of {total:,}"
        if 0 < done < total:
            line += f", ETA {duration(elapsed * (total - done) / done)}"
    return line + (f"; {extra}" if extra else "")


class Reporter:
    """Context manager around a pass: a daemon thread prints `describe(totals, elapsed)` (a line, or
    None for no line yet) every `interval` seconds to `stream` (stderr); the folder the meters
    write into is `folder` (named here, made on entering and removed on leaving; None when `local`
    is false or the lines are off)."""

    def __init__(
        self,
        describe: Callable[[Counter[str], float], str | None],
        local: bool = True,
        interval: float | None = None,
        stream: IO[str] | None = None,
    ):
        self.describe = describe
        self.interval = interval_s() if interval is None else interval
        self.stream = stream
        on = local and self.interval > 0  # the folder is made on entering, removed on leaving
        self.folder: str | None = (
            os.path.join(tempfile.gettempdir(), f"olmax-progress-{uuid.uuid4().hex}") if on else None
        )
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = 0.0

    def __enter__(self) -> Reporter:
        self._started = time.monotonic()
        if self.folder is not None:
            os.makedirs(self.folder, exist_ok=True)
            self._thread = threading.Thread(target=self._loop, name="olmax-progress", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            assert self.folder is not None  # the thread runs only with a folder
            line = self.describe(totals(self.folder), time.monotonic() - self._started)
            if line:
                print(line, file=self.stream or sys.stderr, flush=True)

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)
