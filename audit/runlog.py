"""Check 5 — what the run actually consumed, from the trainer's `data_log/host-*.jsonl`.

Each host logs one line per step (`contract.datalog`): `{"step": s, "index": [...],
"example": [...]}` (global positions and `source << 40 | record` ids). ONE streamed pass reads the
H logs merged by step; each step is handed to small checkers, each with its own failures:
  * Replays: a step logged twice by a host (replayed after a resume) must repeat the same examples;
  * Topology: one host count per step, and the host counts the run record (run.json) declares;
  * Gaps: every step from 0 logged by every host, and as many steps as summary.json says;
  * Slices: positions repeated across hosts in a step — the double-sharding signature — naming
    the first offending step and hosts; positions outside the host's planned slice;
  * Plan: each logged example against the plan (the run's data order + `dataloader.plan`);
  * Epochs: per epoch (index // N), every example is counted and compared with its planned
    multiplicity — an example returning before its epoch ends;
  * Stream hash: summary.json's data_sha256 recomputed with the contract's `chain_data_sha256`.
A checker that cannot run says why in the result's `not_run`, never silently.
Memory, flat in the run's length: the per-epoch read counts are one small unsigned integer per
example of the plan (a numpy array over the plan's records, uint8 unless the plan repeats an
example 255 times or more), the H logs are read as a stream merged by step (one line per host in
memory), and replays are checked from a first cheap pass over each host's log (its step numbers
only, one host at a time) that finds the steps logged twice: only those keep a digest, until
their last logging. A re-read example's message names its first read in the epoch; that is not
stored per example but found, for the few listed failures, by a second pass over the logs (only
when the run has such a failure).
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import heapq
import json
import os
import re
from array import array
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np

from dataloader import hosts
from dataloader.olmo_order import order_functions
from dataloader.plan import RECORD_BITS, Plan
from contract import (DATA_LOG_DIR, DATA_LOG_GLOB, INDEX_SHUFFLE, OLMO_CORE, HostRange, Order, chain_data_sha256,
                      data_log_row_problem, iter_data_log, parse_data_log_name)

from .checks import MAX_LISTED_FAILURES, CheckResult, FailureList, result

NAME, TITLE = "run", "5. What the run consumed"
VERIFY_POSITIONS = 1 << 18  # logged positions whose example is recomputed from the plan
RECORD_MASK = (1 << RECORD_BITS) - 1
# The data orders this audit can replay (dataloader.olmo_order.order_functions knows each).
ORDERS: tuple[Order, ...] = (INDEX_SHUFFLE, OLMO_CORE)
# Read counts zeroed one by one at an epoch's end while at most this many were written in it (32 KiB of indices);
# beyond, the whole array is zeroed (a correct run changes epoch once per epoch).
RESET_TRACKED = 1 << 12
_JSON = json.JSONDecoder().decode
SLICE_CHECK_EVERY = 1024  # steps at which every host's slice is compared with hosts.host_positions itself
# A data-log line exactly as the trainer writes it (contract.data_log_row + json.dumps): its step
# is read without parsing the lists. Any other line is parsed as JSON.
_ROW_LINE = re.compile(rb'\{"step": (\d{1,19}), "index": \[[\d, ]*\], "example": \[[\d, ]*\]\}\n?')


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """global_batch_size/seed: the run's; fingerprint: the run's loader fingerprint (run.json),
    compared with the audited plan's; data_sha256/final_step: summary.json's hash of the consumed
    stream and step count, recomputed from the logs; hosts: run.json's host count per step range;
    order: the run's data order. None: not available — the part that needs it is listed as not
    run, with `missing` (part → why) giving the reason."""

    global_batch_size: int
    seed: int
    fingerprint: str | None = None
    data_sha256: str | None = None
    final_step: int | None = None
    hosts: tuple[HostRange, ...] | None = None
    order: Order = INDEX_SHUFFLE
    missing: dict[str, str] = dataclasses.field(default_factory=dict)
    # Why the run's logs cannot be read against the audited plan at all (run.json records other
    # manifests than the audited ones): the run check then fails with it, its log checks not run.
    other_data: str | None = None


@dataclasses.dataclass
class RunFindings:
    result: CheckResult
    source_examples: dict[int, int]
    source_tokens: dict[int, int]


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


def in_plan(plan: Plan, examples: np.ndarray) -> np.ndarray:
    """bool [k]: does each example id (source << RECORD_BITS | record) name a record of the plan?"""
    src, rec = examples >> RECORD_BITS, examples & RECORD_MASK
    records = np.array([s.records for s in plan.sources] + [0], np.int64)
    return (examples >= 0) & (rec < records[np.minimum(src, len(plan.sources))])


def planned_multiplicity(plan: Plan, src: np.ndarray, rec: np.ndarray) -> np.ndarray:
    """How many slots of one epoch read (source, record): whole passes + the partial pass.

    Mirrors `Plan.locate`: the partial pass of q = count mod R records reads (k·R) // q.
    """
    records = np.array([s.records for s in plan.sources], np.int64)[src]
    counts = np.asarray(plan.counts, np.int64)[src]
    whole = counts // np.maximum(records, 1)
    q = counts - whole * records
    k = -((-rec * q) // np.maximum(records, 1))  # ceil(rec·q / R): the only k that can hit rec
    hit = (q > 0) & (k < q) & ((k * records) // np.maximum(q, 1) == rec)
    return whole + hit.astype(np.int64)


# ----------------------------------------------------------------------------- the one pass

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


def logged_steps(path: str) -> np.ndarray:
    """int64 [lines]: the step of each data-log line of `path`, in file order, up to the first line
    that is not a well-formed row (the streamed pass raises there). Holds one host's steps."""
    steps = array("q")
    with open(path, "rb") as f:
        for raw in f:
            m = _ROW_LINE.fullmatch(raw)
            if m is not None and int(m.group(1)) < 1 << 63:
                steps.append(int(m.group(1)))
                continue
            if not raw.strip():
                continue
            try:
                row = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
                break
            if data_log_row_problem(row) is not None:
                break
            steps.append(row["step"])
    return np.frombuffer(steps, np.int64) if steps else np.zeros(0, np.int64)


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
                        self.f.add(f"host {h} logged step {s} twice with different examples ({path}:{lineno}): "
                                   f"a resume did not reproduce the data stream")
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
    if tagged:
        yield Step(cur, tagged)


class Topology:
    """One host count per step; the host counts match run.json's ranges."""

    def __init__(self, declared: tuple[HostRange, ...] | None):
        self.f = FailureList()
        self.declared = declared
        self.ranges: list[list[int]] = []  # [host count, first step, last step]
        self.mismatch: tuple[int, int, int] | None = None  # first (step, logged H, declared H)

    def step(self, st: Step) -> None:
        if len(st.host_counts) > 1:
            self.f.add(f"step {st.step} is logged by {st.host_counts} hosts topologies at once: an old "
                       f"topology's log was not cut back at the restart")
        r = self.ranges
        if r and r[-1][0] == st.H and r[-1][2] == st.step - 1:
            r[-1][2] = st.step
        else:
            r.append([st.H, st.step, st.step])
        if self.declared is not None and self.mismatch is None:
            want = next((x.host_count for x in reversed(self.declared) if x.first_step <= st.step), None)
            if want != st.H:
                self.mismatch = (st.step, st.H, want)

    def finish(self) -> None:
        if self.mismatch is not None:
            s, got, want = self.mismatch
            declared = [[x.first_step, x.host_count] for x in self.declared]
            self.f.add(f"step {s} was logged by {got} hosts but run.json says {want} "
                       f"([first_step, host_count] ranges {declared}): the logs are not this run's")


class Gaps:
    """Every step from 0 on, logged by every host of its topology; as many steps as summary.json says."""

    def __init__(self, final_step: int | None):
        self.f = FailureList()
        self.final_step = final_step
        self.prev: int | None = None
        self.seen = self.positions = 0
        self.host_counts: list[list[int]] = []  # run-length encoded [first_step, last_step, hosts]

    def step(self, st: Step) -> None:
        self.seen += 1
        self.positions += int(st.index.size)
        expected = 0 if self.prev is None else self.prev + 1
        if st.step > expected:
            self.f.add(f"steps {expected}..{st.step - 1} are missing from every host's log (a gap)")
        self.prev = st.step
        present = [h for h, _, _ in st.group]
        hc = self.host_counts
        if hc and hc[-1][2] == len(present) and hc[-1][1] == st.step - 1:
            hc[-1][1] = st.step
        else:
            hc.append([st.step, st.step, len(present)])
        if len(present) != st.H:
            self.f.add(f"step {st.step}: {len(present)} of {st.H} hosts logged it; missing hosts "
                       f"{sorted(set(range(st.H)) - set(present))[:10]} (a gap)")

    def finish(self) -> None:
        if self.final_step is not None and self.prev is not None and self.final_step != self.prev + 1:
            self.f.add(f"summary.json says the run trained {self.final_step} steps but the logs end at step "
                       f"{self.prev} (a gap at the end, or logs of another run)")


class Evidence:
    """The first double-sharding evidence (step, hosts, what), shared by Slices and Epochs. Epochs'
    evidence names a first read that is found after the pass: `note_first_read` keeps it pending."""

    def __init__(self):
        self.first: tuple[int, list[int], str] | None = None
        self.pending: tuple[tuple[int, int], Callable[[int, int], tuple[list[int], str]]] | None = None

    def note(self, step: int, who: list[int], what: str) -> None:
        if self.first is None:
            self.first = (step, who, what)

    def note_first_read(self, step: int, key: tuple[int, int], fill: Callable[[int, int], tuple[list[int], str]]) -> None:
        """Like `note`, with (who, what) = fill(first step, first host) of the read named by `key`."""
        if self.first is None:
            self.first = (step, [], "")
            self.pending = (key, fill)

    def resolve(self, first_reads: dict[tuple[int, int], tuple[int, int]]) -> None:
        if self.pending is not None:
            key, fill = self.pending
            self.first = (self.first[0], *fill(*first_reads[key]))
            self.pending = None


def repeated_positions(index: np.ndarray, owner: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int, int]]]:
    """Pure: the two ways a step can read a position more than once. index, owner: int64 [k] (the
    step's positions and the host that read each). Returns (shared: the positions two or more
    hosts read, sorted; own: (host, first repeated position, its reads, positions repeated) of each
    host that read one of its own positions more than once, by host)."""
    pairs, reads = np.unique(np.stack([owner, index], axis=1), axis=0, return_counts=True)
    positions, hosts_per_position = np.unique(pairs[:, 1], return_counts=True)
    own = []
    for h in np.unique(pairs[reads > 1, 0]).tolist():
        mine = (pairs[:, 0] == h) & (reads > 1)
        own.append((h, int(pairs[mine, 1][0]), int(reads[mine][0]), int(mine.sum())))
    return positions[hosts_per_position > 1], own


def _times(n: int) -> str:
    return "twice" if n == 2 else f"{n} times"


class Slices:
    """No position read twice in a step (by two hosts, or by one host re-reading its own); each
    host reads exactly its planned slice of G."""

    def __init__(self, global_batch_size: int, evidence: Evidence):
        self.f = FailureList()
        self.g = global_batch_size
        self.evidence = evidence
        self.templates: dict[int, np.ndarray] = {}  # H → every host's slice at step 0, in host order

    def _whole_step_as_planned(self, st: Step) -> bool:
        """Do hosts 0..H-1, in order, read exactly their slices (`hosts.host_positions`)? One
        comparison for the step instead of one per host: a host's slice at step s is its slice at
        step 0 shifted by s·G (global batch s is positions [s·G, (s+1)·G)); the loader's function
        itself is called for every host at each step a multiple of SLICE_CHECK_EVERY (and whenever this
        says no, for the messages)."""
        if st.step % SLICE_CHECK_EVERY == 0 or len(st.group) != st.H:
            return False
        t = self.templates.get(st.H)
        if t is None:
            t = self.templates[st.H] = np.concatenate([hosts.host_positions(0, self.g, h, st.H) for h in range(st.H)])
        return (all(h == k and idx.size == ex.size for k, (h, idx, ex) in enumerate(st.group))
                and np.array_equal(st.index, t + st.step * self.g))

    def step(self, st: Step) -> None:
        if (st.count > 1).any():
            shared, own = repeated_positions(st.index, st.owner)
            if shared.size:  # hosts overlap: e.g. two hosts read one slice
                who = sorted(set(st.owner[np.isin(st.index, shared)].tolist()))
                self.evidence.note(st.step, who, "read the same positions")
                self.f.add(f"step {st.step}: hosts {who} read the same {shared.size} positions (first "
                           f"{int(shared[0])}): double sharding")
            if own:  # a host re-reads rows of its own (the replayed Grain bug: hosts need not overlap)
                h, p, n, k = own[0]
                mine = "re-read positions of its own" if len(own) == 1 else "each re-read positions of their own"
                self.evidence.note(st.step, [o[0] for o in own],
                                   f"{mine} (host {h} read position {p} {_times(n)} in step {st.step})")
                for h, p, n, k in own:
                    self.f.add(f"host {h} read position {p} {_times(n)} in step {st.step} ({k} of its "
                               f"positions read more than once): double sharding")
        if self.g % st.H:
            self.f.add(f"step {st.step}: global batch {self.g} is not a multiple of the {st.H} hosts that "
                       f"logged it: no host slice can be right")
            return
        if self._whole_step_as_planned(st):
            return
        for h, idx, ex in st.group:
            if idx.size != ex.size:
                self.f.add(f"step {st.step}, host {h}: {idx.size} indices but {ex.size} examples logged")
                continue
            want = hosts.host_positions(st.step, self.g, h, st.H)
            if not np.array_equal(idx, want):
                self.f.add(f"step {st.step}, host {h}: read positions [{int(idx.min()) if idx.size else '-'}, "
                           f"{int(idx.max()) + 1 if idx.size else '-'}) but its slice is "
                           f"[{int(want[0])}, {int(want[-1]) + 1})")


class PlanExamples:
    """Each logged example is the one the plan puts at its position (first VERIFY_POSITIONS)."""

    def __init__(self, plan: Plan, seed: int, slots: Callable[[np.ndarray, int, int], np.ndarray]):
        self.f = FailureList()
        self.plan, self.seed, self.slots = plan, seed, slots
        self.verified = 0

    def step(self, st: Step) -> None:
        # the hosts verified (in order, while under the budget), then one plan lookup for all of them
        lines = []
        for h, idx, ex in st.group:
            if self.verified >= VERIFY_POSITIONS or not idx.size or idx.size != ex.size:
                continue
            lines.append((h, idx, ex))
            self.verified += idx.size
        if not lines:
            return
        idx = np.concatenate([i for _, i, _ in lines])
        planned = self.plan.example_ids(*self.plan.locate(self.slots(idx, self.plan.size, self.seed)))
        wrong = planned != np.concatenate([e for _, _, e in lines])
        if not wrong.any():
            return
        start = 0
        for h, idx, ex in lines:
            bad = np.flatnonzero(wrong[start:start + idx.size])
            if bad.size:
                j = int(bad[0])
                self.f.add(f"step {st.step}, host {h}: position {int(idx[j])} gave example {int(ex[j])}, "
                           f"the plan (seed {self.seed}) says {int(planned[start + j])}")
            start += idx.size


def counter_dtype(most: int) -> np.dtype:
    """The smallest unsigned dtype whose maximum is above `most` (an example's planned reads per
    epoch): a count that reaches the maximum is over the plan, and is then kept exactly aside."""
    for dt in (np.uint8, np.uint16, np.uint32):
        if most < np.iinfo(dt).max:
            return np.dtype(dt)
    return np.dtype(np.uint64)


class FirstReadFailures:
    """A FailureList whose listed messages may name an example's first read in its epoch, filled
    in after the pass (`finish`): `add_first_read(key, fill)` with fill(first step, first host)."""

    def __init__(self, limit: int = MAX_LISTED_FAILURES):
        self.limit = limit
        self.items: list[str | tuple[tuple[int, int], Callable[[int, int], str]]] = []
        self.count = 0

    def listing(self) -> bool:
        return len(self.items) < self.limit

    def add(self, message: str) -> None:
        self.count += 1
        if self.listing():
            self.items.append(message)

    def add_first_read(self, key: tuple[int, int], fill: Callable[[int, int], str]) -> None:
        self.count += 1
        if self.listing():
            self.items.append((key, fill))

    def wanted(self) -> set[tuple[int, int]]:
        return {m[0] for m in self.items if not isinstance(m, str)}

    def finish(self, first_reads: dict[tuple[int, int], tuple[int, int]]) -> FailureList:
        f = FailureList(self.limit)
        f.items = [m if isinstance(m, str) else m[1](*first_reads[m[0]]) for m in self.items]
        f.count = self.count
        return f


class Reads:
    """What Epochs reads of a step, shared with the pass that finds first reads: each position
    read (its first occurrence; a duplicated position is already a failure) whose example is in
    the plan, in position order, with its example's flat index over the plan's records (source
    offset + record) and its epoch segment (a new segment each time the epoch changes)."""

    def __init__(self, plan: Plan, epoch_positions: int):
        self.plan, self.n = plan, epoch_positions
        records = np.array([s.records for s in plan.sources], np.int64)
        self.base = np.concatenate([[0], np.cumsum(records)])  # first flat index of each source
        self.epoch, self.segment = 0, 0

    def of(self, st: Step) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(index, example, host, flat) int64 [k] of the step's reads of examples in the plan."""
        keep = st.first
        exs = st.example[keep]
        inside = in_plan(self.plan, exs)
        if not inside.all():
            keep, exs = keep[inside], exs[inside]
        return st.index[keep], exs, st.owner[keep], self.base[exs >> RECORD_BITS] + (exs & RECORD_MASK)

    def segments(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(epoch, segment) int64 [k] of positions read in this order; advances the current ones."""
        e = index // self.n
        seg = self.segment + np.cumsum(e != np.concatenate([[self.epoch], e[:-1]]))
        if e.size:
            self.epoch, self.segment = int(e[-1]), int(seg[-1])
        return e, seg


class Epochs:
    """Within an epoch no example is read more often than the plan reads it (each position once).

    Read counts: one unsigned integer per example of the plan (`counter_dtype`), zeroed when the
    epoch changes. A step whose reads all stay within their planned counts is counted at once;
    any other is replayed read by read, in position order, for its messages."""

    def __init__(self, plan: Plan, evidence: Evidence, epoch_positions: int | None = None):
        self.f = FirstReadFailures()
        # positions per epoch: N for Grain's order, G·(N // G) for OLMo-core's
        self.plan, self.n, self.evidence = plan, epoch_positions or plan.size, evidence
        self.reads = Reads(plan, self.n)
        most = max([-(-c // s.records) for s, c in zip(plan.sources, plan.counts) if s.records] + [0])
        self.counts = np.zeros(int(self.reads.base[-1]), counter_dtype(most))
        self.top = int(np.iinfo(self.counts.dtype).max)
        self.exact: dict[int, int] = {}  # reads of examples whose count reached `top` (an over-read run)
        self.written: list[np.ndarray] | None = []  # flat indices counted this epoch (None: too many)
        self.written_n = 0
        self.over = 0

    def _new_epoch(self) -> None:
        if self.written is None:
            self.counts.fill(0)
        else:
            for w in self.written:
                self.counts[w] = 0
        self.exact.clear()
        self.written, self.written_n = [], 0

    def _wrote(self, flat: np.ndarray) -> None:
        self.written_n += flat.size
        if self.written_n > RESET_TRACKED:
            self.written = None
        elif self.written is not None:
            self.written.append(flat)

    def step(self, st: Step) -> None:
        exs = st.example[st.first]
        outside = ~in_plan(self.plan, exs)
        if outside.any():  # another dataset's example ids (a run without run.json audited on other data)
            j = int(np.flatnonzero(outside)[0])
            self.f.add(f"step {st.step}: {int(outside.sum())} logged example(s) are not in the audited plan, e.g. "
                       f"{int(exs[j])} (source {int(exs[j]) >> RECORD_BITS}, record {int(exs[j]) & RECORD_MASK}); "
                       f"the plan has {len(self.plan.sources)} source(s): the run read other data")
        index, exs, owner, flat = self.reads.of(st)
        if not index.size:
            return
        planned = planned_multiplicity(self.plan, exs >> RECORD_BITS, exs & RECORD_MASK)
        segment = self.reads.segment
        epoch, seg = self.reads.segments(index)
        if seg[-1] == segment:  # one epoch, the current one: count the step at once if it is within plan
            uniq, first, times = np.unique(flat, return_index=True, return_counts=True)
            now = self.counts[uniq] + times
            # a first read is never over the plan (an example the plan does not read is flagged on its second)
            if (now <= np.maximum(planned[first], 1)).all():
                self.counts[uniq] = now
                self._wrote(uniq)
                return
        self._one_by_one(st, index, exs, owner, flat, planned, epoch, seg, segment)

    def _read(self, fl: int) -> int:
        """Counts one read of flat example `fl`; returns its reads this epoch."""
        c = int(self.counts[fl])
        if c == self.top:
            c = self.exact[fl] = self.exact[fl] + 1
            return c
        c += 1
        self.counts[fl] = c
        if c == self.top:
            self.exact[fl] = c
        return c

    def _one_by_one(self, st: Step, index, exs, owner, flat, planned, epoch, seg, segment: int) -> None:
        """The step read by read, in position order: counts, epoch changes, and a message for each
        read beyond the plan (its first read in the epoch is named after the pass)."""
        start = 0
        for i, (ex, fl, h, m, e, sg) in enumerate(zip(exs.tolist(), flat.tolist(), owner.tolist(), planned.tolist(),
                                                      epoch.tolist(), seg.tolist())):
            if sg != segment:  # a new epoch: every example may be read again
                self._wrote(flat[start:i])
                self._new_epoch()
                segment, start = sg, i
            c = self._read(fl)
            if c == 1 or c <= m:  # a first read is never over the plan
                continue
            self.over += 1
            key, step = (sg, fl), st.step
            self.evidence.note_first_read(step, key, lambda fs, fh, h=h, ex=ex: (
                sorted({fh, h}), f"re-read example {ex} before its epoch ended (first read at step {fs})"))
            self.f.add_first_read(key, lambda fs, fh, h=h, ex=ex, e=e, c=c, m=m, step=step: (
                f"step {step}, host {h}: example {ex} (source {ex >> RECORD_BITS}, record {ex & RECORD_MASK}) "
                f"returns before epoch {e} ends: read {c}× (first at step {fs} by host {fh}), the plan reads it "
                f"{m}× per epoch"))
        self._wrote(flat[start:])


def find_first_reads(groups: dict[int, dict[int, str]], plan: Plan, epoch_positions: int,
                     wanted: set[tuple[int, int]]) -> dict[tuple[int, int], tuple[int, int]]:
    """{(segment, flat example): (step, host) of its first read in that epoch segment} for the
    `wanted` ones: a second streamed pass over the logs, reading them as Epochs did."""
    reads, found = Reads(plan, epoch_positions), {}
    flats = np.array(sorted({k[1] for k in wanted}), np.int64)
    for st in stream_steps(groups, Replays()):
        index, _, owner, flat = reads.of(st)
        _, seg = reads.segments(index)
        for i in np.flatnonzero(np.isin(flat, flats)).tolist():
            key = (int(seg[i]), int(flat[i]))
            if key in wanted and key not in found:
                found[key] = (st.step, int(owner[i]))
        if len(found) == len(wanted):
            break
    return found


class StreamHash:
    """summary.json's data_sha256 is the contract's chain hash of the logged global batches."""

    def __init__(self, expected: str | None, final_step: int | None):
        self.f = FailureList()
        self.expected, self.final_step = expected, final_step
        self.sha, self.steps, self.contiguous = "", 0, True
        self.matches: bool | None = None
        self.not_run: str | None = None

    def step(self, st: Step) -> None:
        if self.contiguous and st.step == self.steps:
            self.sha = chain_data_sha256(self.sha, st.step, st.example)
        else:
            self.contiguous = False  # the chain needs every step from 0
        self.steps += 1

    def finish(self, missing: str | None) -> None:
        if self.expected is None:
            self.not_run = missing or "summary.json has no data_sha256 (the run has not finished)"
        elif not self.contiguous:
            self.not_run = "the logs miss steps (failed above), so the stream cannot be rehashed"
        elif self.final_step != self.steps:
            self.not_run = (f"summary.json's hash covers {self.final_step} steps, the logs hold {self.steps} "
                            f"(failed above)")
        else:
            self.matches = self.sha == self.expected
            if not self.matches:
                self.f.add(f"summary.json's data_sha256 {self.expected[:16]}… is not the hash of the logged "
                           f"stream ({self.sha[:16]}…): the logs are not what the trainer consumed")


class SourceTally:
    """Examples and tokens the run read per source (for the mixture check)."""

    def __init__(self, plan: Plan, tokens_of: Callable[[int, np.ndarray], int] | None):
        self.plan = plan
        self.examples: Counter = Counter()
        self.tokens: Counter = Counter()
        self.tokens_of = tokens_of

    def step(self, st: Step) -> None:
        ex = st.example[st.first]
        ex = ex[in_plan(self.plan, ex)]  # others fail the Epochs check
        srcs = ex >> RECORD_BITS
        for s_i in np.unique(srcs).tolist():
            sel = ex[srcs == s_i]
            self.examples[s_i] += int(sel.size)
            self.tokens[s_i] += self.tokens_of(s_i, sel & RECORD_MASK) if self.tokens_of else 0


def check_run(run_dir: str, plan: Plan, cfg: RunConfig,
              tokens_of: Callable[[int, np.ndarray], int] | None = None) -> RunFindings:
    head, not_run = FailureList(), {}
    groups, problems = discover(run_dir)
    for p in problems:
        head.add(p)
    if not groups:
        return RunFindings(result(NAME, TITLE, head, "", {}), {}, {})
    if cfg.other_data is not None:  # the cause first: the loader fingerprint then differs too
        head.add(cfg.other_data)
    if cfg.fingerprint is None:
        not_run["loader_fingerprint"] = cfg.missing.get("fingerprint", "the run's loader fingerprint is unknown")
    elif cfg.fingerprint != plan.fingerprint:
        head.add(f"the run's loader fingerprint {cfg.fingerprint[:16]}… is not the audited plan's "
                 f"{plan.fingerprint[:16]}…: the run read other data or other mixture weights")
    if cfg.other_data is not None:  # example ids of other manifests mean nothing in this plan
        not_run["logs"] = "the run's data logs name examples of other manifests than the audited ones"
        return RunFindings(result(NAME, TITLE, head, "", {}, not_run=not_run), {}, {})
    if cfg.hosts is None:
        not_run["hosts_per_step_range"] = cfg.missing.get("hosts", "the run's host counts are unknown")
    evidence, replays = Evidence(), Replays()
    topology, gaps = Topology(cfg.hosts), Gaps(cfg.final_step)
    fns, per_epoch = order_functions(cfg.order, cfg.global_batch_size), None
    try:
        per_epoch = fns.epoch_positions(plan.size) if fns else None
    except ValueError as e:  # the olmo-core order needs N ≥ G
        head.add(f"the run's data order {cfg.order.name} cannot apply to this plan: {e}")
        fns = None
    slices = Slices(cfg.global_batch_size, evidence)
    epochs = Epochs(plan, evidence, per_epoch)
    stream, tally = StreamHash(cfg.data_sha256, cfg.final_step), SourceTally(plan, tokens_of)
    checkers = [topology, gaps, slices, epochs, stream, tally]
    slots = fns.slots if fns else None
    planned = None
    if slots is None and cfg.order not in ORDERS:  # (a known order that cannot apply is reported above)
        head.add(f"the run's data order {cfg.order.name} v{cfg.order.version} is unknown to this audit "
                 f"(it knows {sorted(f'{o.name} v{o.version}' for o in ORDERS)}): its examples cannot be "
                 f"checked against the plan")
    elif slots is not None:
        planned = PlanExamples(plan, cfg.seed, slots)
        checkers.insert(3, planned)
    for st in stream_steps(groups, replays):
        for c in checkers:
            c.step(st)
    wanted = epochs.f.wanted() | ({evidence.pending[0]} if evidence.pending else set())
    first_reads = find_first_reads(groups, plan, epochs.n, wanted) if wanted else {}
    evidence.resolve(first_reads)
    epochs_f = epochs.f.finish(first_reads)
    topology.finish()
    gaps.finish()
    stream.finish(cfg.missing.get("data_sha256"))
    if stream.not_run:
        not_run["data_sha256"] = stream.not_run
    if planned and planned.verified >= VERIFY_POSITIONS and planned.verified < gaps.positions:
        not_run["plan_examples_beyond_budget"] = (f"only the first {planned.verified} of {gaps.positions} logged "
                                                  f"positions were recomputed from the plan (VERIFY_POSITIONS)")
    f = FailureList()
    for part in (head, replays.f, topology.f, gaps.f, slices.f, *([planned.f] if planned else []), epochs_f, stream.f):
        f.extend(part)
    double = evidence.first
    summary = None if double is None else (f"double sharding: from step {double[0]}, hosts {double[1]} "
                                           f"{double[2]} ({f.count} findings in all)")
    verified = planned.verified if planned else 0
    shape = ", then ".join(f"{t[0]} hosts for steps {t[1]}..{t[2]}" for t in topology.ranges)
    figures = {"hosts": topology.ranges[-1][0] if topology.ranges else 0, "topologies": topology.ranges,
               "steps_logged": gaps.seen, "replayed_steps": replays.count,
               "positions_verified_against_plan": min(verified, VERIFY_POSITIONS),
               "examples_over_planned": epochs.over, "host_counts": gaps.host_counts[:1000],
               "first_double_sharding": None if double is None else
               {"step": double[0], "hosts": double[1], "what": double[2]},
               "source_examples": dict(tally.examples), "data_sha256_matches_summary": stream.matches,
               "global_batch_size": cfg.global_batch_size, "seed": cfg.seed,
               "order": {"name": cfg.order.name, "version": cfg.order.version}}
    ok = (f"{gaps.seen} steps ({shape}): no position read twice, every host on its own slice, "
          f"examples as planned, no gaps")
    return RunFindings(result(NAME, TITLE, f, ok, figures, fail_summary=summary, not_run=not_run),
                       dict(tally.examples), dict(tally.tokens))
