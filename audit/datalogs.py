"""Reading the trainer's data logs for the run check: one stream of steps, merged over the hosts.

Each host's log is read in blocks of whole lines: a block in the trainer's exact form is checked by
one regex and its numbers read by one numpy call (`parse_block`); any other block, and the rest of
that log, is read line by line by the reference reader (`iter_rows`, the contract's checks and
messages). The hosts are merged a window of WINDOW steps at a time; when every host logged the same
steps with the same number of positions (a correct run), each step is a row of one matrix per
window, so the cost per step does not grow with per-line Python (`_window_steps`).

Memory: a block and a window of each host (the logs are never read whole). Replays (a step a host
logs again after a resume) are checked from a first pass over each host's log that reads only its
step numbers, one host at a time: only the steps logged more than once keep a digest, until their
last logging.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import io
import itertools
import json
import os
import re
from array import array
from collections.abc import Iterable, Iterator

import numpy as np

from contract import DATA_LOG_DIR, DATA_LOG_GLOB, RunDir, data_log_row_problem, iter_data_log, parse_data_log_name

from .checks import FailureList

_JSON = json.JSONDecoder().decode
# A data-log line exactly as the trainer writes it (contract.data_log_row + json.dumps): its step
# is read without parsing the lists. Any other line is parsed as JSON.
_ROW_LINE = re.compile(rb'\{"step": (\d{1,19}), "index": \[[\d, ]*\], "example": \[[\d, ]*\]\}\n?')


def discover(run: RunDir) -> tuple[dict[int, dict[int, str]], list[str]]:
    """data_log files → ({H: {host: path}}, problems).

    Several host counts appear after an elastic restart: the trainer cuts the old topology's
    logs back to the steps before the restart, so each step belongs to one host count.
    """
    groups: dict[int, dict[int, str]] = {}
    problems = []
    for p in map(str, run.data_logs()):
        parsed = parse_data_log_name(os.path.basename(p))
        if parsed is None:
            problems.append(f"{p}: name is not host-HHHHH-of-HHHHH.jsonl with HHHHH < the host count")
            continue
        groups.setdefault(parsed[1], {})[parsed[0]] = p
    if not groups:
        problems.append(f"no {DATA_LOG_DIR}/{DATA_LOG_GLOB} files in {run}")
    return groups, problems


def latest_host_count(run: RunDir) -> int:
    """The host count of the run's most recent topology (the one that logged the last step; a
    log's steps are read as the first pass reads them, up to any broken line, which the main pass
    then reports)."""
    groups, _ = discover(run)
    best = (-1, 0)
    for H, paths in groups.items():
        for path in paths.values():
            steps = logged_steps(path)
            best = max(best, (int(steps.max()) if steps.size else -1, H))
    return best[1]


def logged_global_batch(run: RunDir) -> int | None:
    """G as the logs show it: H × the rows host 0 logged at its first step, for the earliest
    topology (each host reads G/H rows). None when no log has a line. Used when neither a flag
    nor the run record gives G (a run dir without run.json)."""
    groups, _ = discover(run)
    for H, paths in sorted(groups.items()):
        for _, path in sorted(paths.items()):
            for _, e in iter_data_log(path):
                return H * len(e["index"])
    return None


class Step:
    """One step as logged, every host of it together.

    host_counts: the host counts whose logs hold the step (more than one only in a broken run);
    H: the largest of them, whose lines make up the step: hosts int64 [lines] (in host order) and
    sizes int64 [lines] (positions per line); index, example, owner int64 [k]: the lines'
    positions, example ids and each position's host, concatenated; uniq, first, count: what
    np.unique(index, return_index=True, return_counts=True) gives (taken as is when the positions
    only increase, as every correct step's do); group: [(host, index, example)] per line.
    """

    __slots__ = ("step", "host_counts", "H", "hosts", "sizes", "index", "example", "owner", "uniq", "first", "count")

    def __init__(
        self,
        step: int,
        host_counts: list[int],
        hosts: np.ndarray,
        sizes: np.ndarray,
        index: np.ndarray,
        example: np.ndarray,
        owner: np.ndarray | None = None,
    ) -> None:
        self.step, self.host_counts, self.H = step, host_counts, host_counts[-1]
        self.hosts, self.sizes, self.index, self.example = hosts, sizes, index, example
        self.owner = np.repeat(hosts, sizes) if owner is None else owner
        if index.size < 2 or bool((index[1:] > index[:-1]).all()):
            self.uniq, self.first, self.count = index, np.arange(index.size), np.ones(index.size, np.int64)
        else:
            self.uniq, self.first, self.count = np.unique(index, return_index=True, return_counts=True)

    @classmethod
    def from_lines(cls, step: int, tagged: list[tuple[int, int, np.ndarray, np.ndarray]]) -> Step:
        """The step from its lines (H, host, index int64 [k], example int64 [k]), in (H, host) order."""
        host_counts = sorted({H for H, *_ in tagged})
        group = [(h, idx, ex) for H, h, idx, ex in tagged if host_counts[-1] == H]
        return cls(
            step,
            host_counts,
            np.array([h for h, _, _ in group], np.int64),
            np.array([i.size for _, i, _ in group], np.int64),
            np.concatenate([i for _, i, _ in group]),
            np.concatenate([e for _, _, e in group]),
        )

    @property
    def group(self) -> list[tuple[int, np.ndarray, np.ndarray]]:
        cuts = np.cumsum(self.sizes)[:-1]
        return list(zip(self.hosts.tolist(), np.split(self.index, cuts), np.split(self.example, cuts)))


def iter_rows(path: str, offset: int = 0, lines_before: int = 0) -> Iterator[tuple[int, dict, np.ndarray, np.ndarray]]:
    """(line number, row, index int64, example int64) of each data-log line of `path` (from byte
    `offset`, which starts line `lines_before` + 1), read and checked as `contract.iter_data_log`
    does. A line exactly as the trainer writes it is checked here by one regex, json.loads and two
    int64 conversions: the contract's per-list check costs more than parsing a line of a few
    positions. From the first other line on, the contract's reader takes over at that line: the
    same checks, the same error messages."""
    lineno = lines_before
    with open(path, "rb") as f:
        f.seek(offset)
        for lineno, raw in enumerate(f, lines_before + 1):
            parsed = _row(raw)
            if parsed is not None:
                yield lineno, *parsed
            elif raw.strip():
                break
            offset += len(raw)
        else:
            return
    for n, row in iter_data_log(path, offset, lineno - 1):
        yield n, row, np.asarray(row["index"], np.int64), np.asarray(row["example"], np.int64)


# Many lines at a time: a block of whole lines, each as the trainer writes it with the same number k
# of positions, is checked by one regex and its numbers read by one numpy call (`parse_block`).
_NUM = rb"(?:0|[1-9]\d*)"  # a JSON integer ≥ 0 (no leading zero)
_FIRST_INDEX = re.compile(rb'\{"step": \d+, "index": \[([\d, ]*)\]')
_NEWLINE_TO_COMMA = bytes.maketrans(b"\n", b",")
_NOT_DIGITS = b'{}[]": acdeilmnpstx'  # the other bytes of such a line (the keys' letters included)
_BULK_BELOW = 10**18  # a block with a number at or above this (19 digits and more) is read line by line


@functools.lru_cache(maxsize=32)
def _rows_of(k: int) -> re.Pattern[bytes]:
    """Whole lines as the trainer writes them, with k ≥ 1 positions, each ending in a newline."""
    numbers = _NUM + (rb"(?:, " + _NUM + rb"){%d}" % (k - 1) if k > 1 else b"")
    row = rb'\{"step": ' + _NUM + rb', "index": \[' + numbers + rb'\], "example": \[' + numbers + rb"\]\}\n"
    return re.compile(rb"(?:" + row + rb")*")


def parse_block(block: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Pure: (steps int64 [n], index int64 [n, k], example int64 [n, k]) of a block of n whole
    lines, ending in a newline, each exactly as the trainer writes a row (`contract.data_log_row`
    + json.dumps) with the same k ≥ 1 positions and every number below 10^18; None for any other
    block (its caller reads it line by line)."""
    m = _FIRST_INDEX.match(block)
    if m is None or not m.group(1):
        return None
    k = m.group(1).count(b",") + 1
    if _rows_of(k).fullmatch(block) is None:
        return None
    n = block.count(b"\n")
    numbers = np.fromstring(block.translate(_NEWLINE_TO_COMMA, _NOT_DIGITS), np.int64, sep=",")
    if numbers.size != n * (2 * k + 1) or int(numbers.max()) >= _BULK_BELOW:
        return None  # (the parser clips numbers past int64 to its maximum)
    rows = numbers.reshape(n, 2 * k + 1)
    return rows[:, 0], rows[:, 1 : k + 1], rows[:, k + 1 :]


def host_lines(path: str) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(line numbers int64 [n], steps int64 [n], index int64 [n, k], example int64 [n, k]) of the
    rows of one host's log in file order: a block of lines as the trainer writes them at once
    (`parse_block`); any other block line by line (blank lines skipped, lines of another k or
    with larger numbers parsed one at a time as `iter_rows` does), and from its first line in
    another form, the rest of the file by `iter_rows` (its checks, the contract's messages)."""
    offset = lines = 0
    with open(path, "rb") as f:
        while block := f.read(_BLOCK) + f.readline():
            rows = parse_block(block)
            if rows is not None:
                n, size = rows[0].size, len(block)
                del block  # not held while the reader waits (a block per host: 16 MiB at 256 hosts)
                yield np.arange(lines + 1, lines + n + 1), *rows
                offset, lines = offset + size, lines + n
                continue
            pending = []
            for raw in io.BytesIO(block):  # lines end at b"\n" only, as the file's do
                lines += 1
                parsed = _row(raw)
                if parsed is not None:
                    pending.append((lines, parsed[0]["step"], parsed[1], parsed[2]))
                elif raw.strip():  # another form: the reference reader from this line on
                    yield from _batches(pending)
                    rest = ((n, r["step"], i, e) for n, r, i, e in iter_rows(path, offset, lines - 1))
                    yield from _batches(rest)
                    return
                offset += len(raw)
            yield from _batches(pending)


def _row(raw: bytes) -> tuple[dict, np.ndarray, np.ndarray] | None:
    """(row, index int64, example int64) of one line exactly as the trainer writes it (one regex,
    json.loads, two int64 conversions); None for any other line."""
    if not _ROW_LINE.fullmatch(raw):
        return None
    try:  # ints ≥ 0 by the regex; < 2^63 by the int64 conversion; well-formed JSON by loads
        row = _JSON(raw.decode())
        index, example = np.array(row["index"], np.int64), np.array(row["example"], np.int64)
    except (ValueError, OverflowError):
        return None
    return None if index.size != example.size or row["step"] >= 1 << 63 else (row, index, example)


_BATCH = 1024  # rows read one at a time, handed on together


def _batches(
    rows: Iterable[tuple[int, int, np.ndarray, np.ndarray]],
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """(line numbers [n], steps [n], index [n, k], example [n, k]) of runs of consecutive rows
    (line number, step, index [k], example [k]) with the same k, at most _BATCH rows each."""
    run: list[tuple[int, int, np.ndarray, np.ndarray]] = []
    for r in rows:
        if run and (r[2].size != run[0][2].size or len(run) == _BATCH):
            yield _stacked(run)
            run = []
        run.append(r)
    if run:
        yield _stacked(run)


def _stacked(
    run: list[tuple[int, int, np.ndarray, np.ndarray]],
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    n, k = len(run), run[0][2].size
    return (
        np.array([r[0] for r in run], np.int64),
        np.array([r[1] for r in run], np.int64),
        np.array([r[2] for r in run], np.int64).reshape(n, k),
        np.array([r[3] for r in run], np.int64).reshape(n, k),
    )


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


def _any_of(steps: np.ndarray, again: np.ndarray) -> bool:
    """Is any of `steps` in `again` (sorted)? O(len(steps) · log len(again)): np.isin would sort or
    tabulate all of `again` for every block (a log replaying many steps: quadratic in its length)."""
    if not again.size:
        return False
    at = np.minimum(np.searchsorted(again, steps), again.size - 1)
    return bool((again[at] == steps).any())


def out_of_order(h: int, step: int, last: int, path: str, line: int) -> str:
    """The failure of a line logged once whose step is below one logged before it (a log
    reversed or reordered: not as the trainer writes it; never taken for a missing host)."""
    return (
        f"host {h}'s log goes back to step {step} after step {last} ({path}:{line}): its lines are not "
        "in step order, as the trainer writes them"
    )


class Replays:
    """A step a host logged again (after a resume) must repeat the same examples."""

    def __init__(self) -> None:
        self.f = FailureList()
        self.count = 0

    def lines(self, h: int, path: str) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(steps int64 [n], index int64 [n, k], example int64 [n, k]) of the host's log, its
        steps increasing, replays checked and skipped, a line logged once below a step before it
        failed (`out_of_order`) and skipped. Each logging of a step is compared with the
        one before it; only steps that the log holds more than once (found by a first pass) keep a
        digest, until their last logging. Blocks without such a step, in order, pass as they are."""
        left = repeated_steps(path)
        again = np.array(sorted(left), np.int64)
        digests: dict[int, bytes] = {}
        last = -1
        for line_numbers, steps, index, example in host_lines(path):
            if steps[0] > last and bool((steps[1:] > steps[:-1]).all()) and not _any_of(steps, again):
                last = int(steps[-1])
                yield steps, index, example
                continue
            keep = []
            for i, s in enumerate(steps.tolist()):
                if s <= last and s not in left:  # logged once, below a step before it
                    self.f.add(out_of_order(h, s, last, path, int(line_numbers[i])))
                if s in left:
                    d = hashlib.blake2b(
                        json.dumps([index[i].tolist(), example[i].tolist()]).encode(), digest_size=16
                    ).digest()
                    if s in digests:
                        self.count += 1
                        if digests[s] != d:
                            self.f.add(
                                f"host {h} logged step {s} twice with different examples "
                                f"({path}:{int(line_numbers[i])}): a resume did not reproduce the data stream"
                            )
                    digests[s] = d
                    left[s] -= 1
                    if not left[s]:  # its last logging: nothing left to compare with it
                        del left[s], digests[s]
                if s > last:
                    last = s
                    keep.append(i)
            if keep:
                yield steps[keep], index[keep], example[keep]


WINDOW = 256  # steps merged over the hosts at a time (memory: this many lines of every host)


def windows(
    chunks: Iterable[tuple[np.ndarray, np.ndarray, np.ndarray]], width: int
) -> Iterator[tuple[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]]]:
    """(w, [(steps, index, example), …]) per window w of `width` steps (steps // width), in order:
    a host's rows regrouped so that the hosts' windows line up whatever their block boundaries."""
    cur = -1  # no window yet (steps are ≥ 0)
    pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    for steps, index, example in chunks:
        w = steps // width
        cuts = (np.flatnonzero(w[1:] != w[:-1]) + 1).tolist()
        for a, b in zip([0, *cuts], [*cuts, steps.size]):
            if int(w[a]) != cur and pieces:
                yield cur, pieces
                pieces = []
            cur = int(w[a])
            pieces.append((steps[a:b], index[a:b], example[a:b]))
    if pieces:
        yield cur, pieces


def stream_steps(groups: dict[int, dict[int, str]], replays: Replays, width: int | None = None) -> Iterator[Step]:
    """Every logged step in order, all hosts (and host counts) of a step together. The hosts' logs
    are merged a window of `width` (default WINDOW) steps at a time: in memory, one window of every
    host (16 bytes per position: 2 MiB at G = 512) and a block of each one's log."""
    width = width or WINDOW
    hosts = [(H, h, p) for H, paths in sorted(groups.items()) for h, p in sorted(paths.items())]
    readers = [windows(replays.lines(h, p), width) for _, h, p in hosts]
    heap: list[tuple[int, int, list]] = []  # (window, reader, pieces): the readers in (H, host) order

    def advance(i: int) -> None:
        nxt = next(readers[i], None)
        if nxt is not None:
            heapq.heappush(heap, (nxt[0], i, nxt[1]))

    for i in range(len(readers)):
        advance(i)
    while heap:
        w, here = heap[0][0], []
        while heap and heap[0][0] == w:
            _, i, pieces = heapq.heappop(heap)
            here.append((i, pieces))
        yield from _window_steps([(hosts[i][0], hosts[i][1], pieces) for i, pieces in here])
        for i, _ in here:
            advance(i)


def _stack(pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """One host's pieces of a window → (steps [n], index [n, k], example [n, k]), or None when its
    lines have different sizes."""
    if len(pieces) == 1:
        return pieces[0]
    if len({p[1].shape[1] for p in pieces}) > 1:
        return None
    steps, index, example = (np.concatenate([p[j] for p in pieces]) for j in range(3))
    return steps, index, example


def _window_steps(here: list[tuple[int, int, list]]) -> Iterator[Step]:
    """The steps of one window from each host's lines in it (`here`, in (H, host) order). When
    every host logged the same steps with the same positions per line (a correct run), each
    step's arrays are rows of one matrix per window; otherwise the lines are sorted by (step, H,
    host) and grouped one step at a time (`Step.from_lines`)."""
    stacked = [s for s in (_stack(pieces) for _, _, pieces in here) if s is not None]
    steps = stacked[0][0] if len(stacked) == len(here) else None
    if steps is not None and all(np.array_equal(s[0], steps) for s in stacked):
        host_counts = sorted({H for H, _, _ in here})
        mine = [j for j, (H, _, _) in enumerate(here) if host_counts[-1] == H]
        hosts = np.array([here[j][1] for j in mine], np.int64)
        sizes = np.array([stacked[j][1].shape[1] for j in mine], np.int64)
        index = np.concatenate([stacked[j][1] for j in mine], axis=1)
        example = np.concatenate([stacked[j][2] for j in mine], axis=1)
        owner = np.repeat(hosts, sizes)
        for r, s in enumerate(steps.tolist()):
            yield Step(s, host_counts, hosts, sizes, index[r], example[r], owner)
        return
    lines = sorted(
        ((s, H, h), idx, ex)
        for H, h, pieces in here
        for steps_, index_, example_ in pieces
        for s, idx, ex in zip(steps_.tolist(), index_, example_)
    )
    for s, same in itertools.groupby(lines, key=lambda x: x[0][0]):
        yield Step.from_lines(s, [(H, h, idx, ex) for (_, H, h), idx, ex in same])
