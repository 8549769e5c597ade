"""The run check's per-epoch read counts: no example read more often in an epoch than the plan reads it.

Memory: one unsigned integer per example of the plan (a numpy array over its records, uint8 unless
the plan repeats an example 255 times or more), zeroed when the epoch changes. A re-read example's
message names its first read in the epoch; that is not stored per example but found, for the
listed failures only, by a second pass over the logs (only in a run that has such a failure).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dataloader.plan import RECORD_BITS, Plan

from .checks import MAX_LISTED_FAILURES, FailureList
from .datalogs import Replays, Step, stream_steps

RECORD_MASK = (1 << RECORD_BITS) - 1
# Read counts zeroed one by one at an epoch's end while at most this many were written in it (32 KiB
# of indices); beyond, the whole array is zeroed (a correct run changes epoch once per epoch).
RESET_TRACKED = 1 << 12


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


class Evidence:
    """The first double-sharding evidence (step, hosts, what), shared by Slices and Epochs. Epochs'
    evidence names a first read that is found after the pass: `note_first_read` keeps it pending."""

    def __init__(self) -> None:
        self.first: tuple[int, list[int], str] | None = None
        self.pending: tuple[tuple[int, int], Callable[[int, int], tuple[list[int], str]]] | None = None

    def note(self, step: int, who: list[int], what: str) -> None:
        if self.first is None:
            self.first = (step, who, what)

    def note_first_read(
        self, step: int, key: tuple[int, int], fill: Callable[[int, int], tuple[list[int], str]]
    ) -> None:
        """Like `note`, with (who, what) = fill(first step, first host) of the read named by `key`."""
        if self.first is None:
            self.first = (step, [], "")
            self.pending = (key, fill)

    def resolve(self, first_reads: dict[tuple[int, int], tuple[int, int]]) -> None:
        if self.pending is not None:
            key, fill = self.pending
            assert self.first is not None  # set with pending
            self.first = (self.first[0], *fill(*first_reads[key]))
            self.pending = None


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
            self.f.add(
                f"step {st.step}: {int(outside.sum())} logged example(s) are not in the audited plan, e.g. "
                f"{int(exs[j])} (source {int(exs[j]) >> RECORD_BITS}, record {int(exs[j]) & RECORD_MASK}); "
                f"the plan has {len(self.plan.sources)} source(s): the run read other data"
            )
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

    def _one_by_one(
        self,
        st: Step,
        index: np.ndarray,
        exs: np.ndarray,
        owner: np.ndarray,
        flat: np.ndarray,
        planned: np.ndarray,
        epoch: np.ndarray,
        seg: np.ndarray,
        segment: int,
    ) -> None:
        """The step read by read, in position order: counts, epoch changes, and a message for each
        read beyond the plan (its first read in the epoch is named after the pass)."""
        start = 0
        for i, (ex, fl, h, m, e, sg) in enumerate(
            zip(exs.tolist(), flat.tolist(), owner.tolist(), planned.tolist(), epoch.tolist(), seg.tolist())
        ):
            if sg != segment:  # a new epoch: every example may be read again
                self._wrote(flat[start:i])
                self._new_epoch()
                segment, start = sg, i
            c = self._read(fl)
            if c == 1 or c <= m:  # a first read is never over the plan
                continue
            self.over += 1
            key, step = (sg, fl), st.step
            # mypy cannot infer a lambda whose defaults bind the loop's values
            self.evidence.note_first_read(
                step,
                key,
                lambda fs, fh, h=h, ex=ex: (  # type: ignore[misc]
                    sorted({fh, h}),
                    f"re-read example {ex} before its epoch ended (first read at step {fs})",
                ),
            )
            self.f.add_first_read(
                key,
                lambda fs, fh, h=h, ex=ex, e=e, c=c, m=m, step=step: (  # type: ignore[misc]
                    f"step {step}, host {h}: example {ex} (source {ex >> RECORD_BITS}, record {ex & RECORD_MASK}) "
                    f"returns before epoch {e} ends: read {c}× (first at step {fs} by host {fh}), the plan reads it "
                    f"{m}× per epoch"
                ),
            )
        self._wrote(flat[start:])


def find_first_reads(
    groups: dict[int, dict[int, str]], plan: Plan, epoch_positions: int, wanted: set[tuple[int, int]]
) -> dict[tuple[int, int], tuple[int, int]]:
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
