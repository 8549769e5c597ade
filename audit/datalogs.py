"""Reading the trainer's data logs for the run check: one stream of steps, merged over the hosts.

Memory: one line per host (the logs are merged by step, never read whole). Replays (a step a host
logs again after a resume) are checked from a first pass over each host's log that reads only its
step numbers, one host at a time: only the steps logged more than once keep a digest, until their
last logging.
"""

from __future__ import annotations

import dataclasses
import glob
import hashlib
import heapq
import io
import json
import os
import re
from array import array
from collections.abc import Iterable, Iterator

import numpy as np

from contract import DATA_LOG_DIR, DATA_LOG_GLOB, data_log_row_problem, iter_data_log, parse_data_log_name

from .checks import FailureList

_JSON = json.JSONDecoder().decode
# A data-log line exactly as the trainer writes it (contract.data_log_row + json.dumps): its step
# is read without parsing the lists. Any other line is parsed as JSON.
_ROW_LINE = re.compile(rb'\{"step": (\d{1,19}), "index": \[[\d, ]*\], "example": \[[\d, ]*\]\}\n?')


def discover(run_dir: str) -> tuple[dict[int, dict[int, str]], list[str]]:
    """data_log files → ({H: {host: path}}, problems).

    Several host counts appear after an elastic restart: the trainer cuts the old topology's
    logs back to the steps before the restart, so each step belongs to one host count.
    """
    groups: dict[int, dict[int, str]] = {}
    problems = []
    for p in sorted(glob.glob(os.path.join(run_dir, DATA_LOG_DIR, DATA_LOG_GLOB))):
        parsed = parse_data_log_name(os.path.basename(p))
        if parsed is None:
            problems.append(f"{p}: name is not host-HHHHH-of-HHHHH.jsonl with HHHHH < the host count")
            continue
        groups.setdefault(parsed[1], {})[parsed[0]] = p
    if not groups:
        problems.append(f"no {DATA_LOG_DIR}/{DATA_LOG_GLOB} files in {run_dir}")
    return groups, problems


def latest_host_count(run_dir: str) -> int:
    """The host count of the run's most recent topology (the one that logged the last step)."""
    groups, _ = discover(run_dir)
    best = (-1, 0)
    for H, paths in groups.items():
        for path in paths.values():
            last = -1
            for _, e in iter_data_log(path):
                last = max(last, int(e["step"]))
            best = max(best, (last, H))
    return best[1]


def logged_global_batch(run_dir: str) -> int | None:
    """G as the logs show it: H × the rows host 0 logged at its first step, for the earliest
    topology (each host reads G/H rows). None when no log has a line. Used when neither a flag
    nor the run record gives G (a run dir without run.json)."""
    groups, _ = discover(run_dir)
    for H, paths in sorted(groups.items()):
        for _, path in sorted(paths.items()):
            for _, e in iter_data_log(path):
                return H * len(e["index"])
    return None


@dataclasses.dataclass
class Step:
    """One step as logged: `tagged` = (H, host, index int64 [k], example int64 [k]) of every line."""

    step: int
    tagged: list[tuple[int, int, np.ndarray, np.ndarray]]

    def __post_init__(self):
        self.host_counts = sorted({H for H, *_ in self.tagged})
        self.H = self.host_counts[-1]
        self.group = [(h, idx, ex) for H, h, idx, ex in self.tagged if H == self.H]
        self.index = np.concatenate([i for _, i, _ in self.group])
        self.owner = np.repeat(np.array([h for h, _, _ in self.group], np.int64), [i.size for _, i, _ in self.group])
        self.example = np.concatenate([e for _, _, e in self.group])
        self.uniq, self.first, self.count = np.unique(self.index, return_index=True, return_counts=True)


def iter_rows(path: str) -> Iterator[tuple[int, dict, np.ndarray, np.ndarray]]:
    """(line number, row, index int64, example int64) of each data-log line of `path`, read and
    checked as `contract.iter_data_log` does. A line exactly as the trainer writes it is checked
    here by one regex, json.loads and two int64 conversions: the contract's per-list check costs
    more than parsing a line of a few positions (a 256-host run logs 2 per line). From the first
    other line on, the contract's reader takes over: the same checks, the same error messages."""
    consumed = 0
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            if _ROW_LINE.fullmatch(raw):
                try:  # ints ≥ 0 by the regex; < 2^63 by the int64 conversion; well-formed JSON by loads
                    row = _JSON(raw.decode())
                    index, example = np.array(row["index"], np.int64), np.array(row["example"], np.int64)
                except (ValueError, OverflowError):
                    break
                if index.size != example.size or row["step"] >= 1 << 63:
                    break
                consumed = lineno
                yield lineno, row, index, example
            elif raw.strip():
                break
        else:
            return
    for lineno, row in iter_data_log(path):
        if lineno > consumed:
            yield lineno, row, np.asarray(row["index"], np.int64), np.asarray(row["example"], np.int64)


# The same lines, found many at a time: a block of whole lines is read by one findall when every
# line of it is in that form (the per-line loop below is the reference and handles any other block).
_ROW_LINES = re.compile(rb'^\{"step": (\d{1,19}), "index": \[[\d, ]*\], "example": \[[\d, ]*\]\}$', re.M)
_BLOCK = 1 << 16  # bytes of log read at a time by the first pass (its memory: a few times this)


def _block_steps(block: bytes) -> list[int] | None:
    """The steps of a block of whole lines ending in a newline when each line is in the trainer's
    form with a step < 2^63, else None (the caller reads that block line by line)."""
    found = _ROW_LINES.findall(block)
    if len(found) != block.count(b"\n"):
        return None
    steps = list(map(int, found))
    return steps if not steps or max(steps) < 1 << 63 else None


def logged_steps(path: str) -> np.ndarray:
    """int64 [lines]: the step of each data-log line of `path`, in file order, up to the first line
    that is not a well-formed row (the streamed pass raises there). Holds one host's steps."""
    steps = array("q")
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(_BLOCK) + f.readline(), b""):
            fast = _block_steps(block) if block.endswith(b"\n") else None
            if fast is not None:
                steps.extend(fast)
                continue
            if not _line_steps(io.BytesIO(block), steps):  # lines split at b"\n" only, as the file's
                break
    return np.frombuffer(steps, np.int64) if steps else np.zeros(0, np.int64)


def _line_steps(lines: Iterable[bytes], steps: array) -> bool:
    """Appends the step of each line to `steps`; False at the first line that is not a well-formed
    row (nothing after it is read)."""
    for raw in lines:
        m = _ROW_LINE.fullmatch(raw)
        if m is not None and int(m.group(1)) < 1 << 63:
            steps.append(int(m.group(1)))
            continue
        if not raw.strip():
            continue
        try:
            row = json.loads(raw.decode("utf-8"))
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            return False
        if data_log_row_problem(row) is not None:
            return False
        steps.append(row["step"])
    return True


def repeated_steps(path: str) -> dict[int, int]:
    """{step: times logged} of the steps `path` logs more than once (a resume replays them)."""
    steps, times = np.unique(logged_steps(path), return_counts=True)
    return dict(zip(steps[times > 1].tolist(), times[times > 1].tolist()))


class Replays:
    """A step a host logged again (after a resume) must repeat the same examples."""

    def __init__(self):
        self.f = FailureList()
        self.count = 0

    def lines(self, H: int, h: int, path: str) -> Iterator[tuple[int, int, int, np.ndarray, np.ndarray]]:
        """(step, H, host, index, example) of the host's log in step order, replays checked and skipped.
        Each logging of a step is compared with the one before it; only steps that the log holds
        more than once (found by a first pass) keep a digest, until their last logging."""
        left = repeated_steps(path)
        digests: dict[int, bytes] = {}
        last = -1
        for lineno, e, index, example in iter_rows(path):
            s = int(e["step"])
            if s in left:
                d = hashlib.blake2b(json.dumps([e["index"], e["example"]]).encode(), digest_size=16).digest()
                if s in digests:
                    self.count += 1
                    if digests[s] != d:
                        self.f.add(
                            f"host {h} logged step {s} twice with different examples ({path}:{lineno}): "
                            f"a resume did not reproduce the data stream"
                        )
                digests[s] = d
                left[s] -= 1
                if not left[s]:  # its last logging: nothing left to compare with it
                    del left[s], digests[s]
            if s <= last:
                continue
            last = s
            yield s, H, h, index, example


def stream_steps(groups: dict[int, dict[int, str]], replays: Replays) -> Iterator[Step]:
    """Every logged step in order, all hosts (and host counts) of a step together."""
    gens = [replays.lines(H, h, p) for H, paths in sorted(groups.items()) for h, p in sorted(paths.items())]
    tagged, cur = [], None
    # (step, H, host) is unique across the logs, so the tuples compare without reaching the arrays
    for s, H, h, idx, ex in heapq.merge(*gens):
        if cur is not None and s != cur:
            yield Step(cur, tagged)
            tagged = []
        cur = s
        tagged.append((H, h, idx, ex))
    if tagged and cur is not None:  # cur is set with the first tagged read
        yield Step(cur, tagged)
