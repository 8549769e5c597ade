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
Memory, flat in the run's length: the logs are read as one stream merged by step, replays
checked from a first pass over each log's step numbers (`datalogs`), and the per-epoch read
counts are one small unsigned integer per example of the plan (`epochs`).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np

from contract import INDEX_SHUFFLE, OLMO_CORE, HostRange, Order, RunDir, chain_data_sha256
from dataloader import hosts
from dataloader.olmo_order import order_functions
from dataloader.plan import RECORD_BITS, Plan

from .checks import CheckResult, FailureList, result
from .datalogs import Replays, Step, discover, latest_host_count, logged_global_batch, stream_steps  # noqa: F401 - re-exported
from .epochs import Epochs, Evidence, find_first_reads, in_plan, planned_multiplicity  # noqa: F401 - re-exported

NAME, TITLE = "run", "5. What the run consumed"
VERIFY_POSITIONS = 1 << 18  # logged positions whose example is recomputed from the plan
RECORD_MASK = (1 << RECORD_BITS) - 1
# The data orders this audit can replay (dataloader.olmo_order.order_functions knows each).
ORDERS: tuple[Order, ...] = (INDEX_SHUFFLE, OLMO_CORE)
SLICE_CHECK_EVERY = 1024  # steps at which every host's slice is compared with hosts.host_positions itself


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


# ----------------------------------------------------------------------------- the one pass


class Topology:
    """One host count per step; the host counts match run.json's ranges."""

    def __init__(self, declared: tuple[HostRange, ...] | None):
        self.f = FailureList()
        self.declared = declared
        self.ranges: list[list[int]] = []  # [host count, first step, last step]
        self.mismatch: tuple[int, int, int | None] | None = None  # first (step, logged H, declared H)

    def step(self, st: Step) -> None:
        if len(st.host_counts) > 1:
            self.f.add(
                f"step {st.step} is logged by {st.host_counts} hosts topologies at once: an old "
                f"topology's log was not cut back at the restart"
            )
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
            declared = [[x.first_step, x.host_count] for x in self.declared or ()]
            self.f.add(
                f"step {s} was logged by {got} hosts but run.json says {want} "
                f"([first_step, host_count] ranges {declared}): the logs are not this run's"
            )


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
        present = st.hosts.size
        hc = self.host_counts
        if hc and hc[-1][2] == present and hc[-1][1] == st.step - 1:
            hc[-1][1] = st.step
        else:
            hc.append([st.step, st.step, present])
        if present != st.H:
            self.f.add(
                f"step {st.step}: {present} of {st.H} hosts logged it; missing hosts "
                f"{sorted(set(range(st.H)) - set(st.hosts.tolist()))[:10]} (a gap)"
            )

    def finish(self) -> None:
        if self.final_step is not None and self.prev is not None and self.final_step != self.prev + 1:
            self.f.add(
                f"summary.json says the run trained {self.final_step} steps but the logs end at step "
                f"{self.prev} (a gap at the end, or logs of another run)"
            )


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
        if st.step % SLICE_CHECK_EVERY == 0 or st.hosts.size != st.H:
            return False
        t = self.templates.get(st.H)
        if t is None:
            t = self.templates[st.H] = np.concatenate([hosts.host_positions(0, self.g, h, st.H) for h in range(st.H)])
        # hosts 0..H-1 in order (each host once, since the step has H of them in increasing order),
        # each with its G/H positions (the joined positions alone would not show a shifted split)
        in_order = st.hosts[0] == 0 and st.hosts[-1] == st.H - 1 and st.example.size == st.index.size
        sized = bool((st.sizes == self.g // st.H).all())
        return bool(in_order) and sized and np.array_equal(st.index, t + st.step * self.g)

    def step(self, st: Step) -> None:
        if (st.count > 1).any():
            shared, own = repeated_positions(st.index, st.owner)
            if shared.size:  # hosts overlap: e.g. two hosts read one slice
                who = sorted(set(st.owner[np.isin(st.index, shared)].tolist()))
                self.evidence.note(st.step, who, "read the same positions")
                self.f.add(
                    f"step {st.step}: hosts {who} read the same {shared.size} positions (first "
                    f"{int(shared[0])}): double sharding"
                )
            if own:  # a host re-reads rows of its own (the replayed Grain bug: hosts need not overlap)
                h, p, n, k = own[0]
                mine = "re-read positions of its own" if len(own) == 1 else "each re-read positions of their own"
                self.evidence.note(
                    st.step, [o[0] for o in own], f"{mine} (host {h} read position {p} {_times(n)} in step {st.step})"
                )
                for h, p, n, k in own:
                    self.f.add(
                        f"host {h} read position {p} {_times(n)} in step {st.step} ({k} of its "
                        f"positions read more than once): double sharding"
                    )
        if self.g % st.H:
            self.f.add(
                f"step {st.step}: global batch {self.g} is not a multiple of the {st.H} hosts that "
                f"logged it: no host slice can be right"
            )
            return
        if self._whole_step_as_planned(st):
            return
        for h, idx, ex in st.group:
            if idx.size != ex.size:
                self.f.add(f"step {st.step}, host {h}: {idx.size} indices but {ex.size} examples logged")
                continue
            want = hosts.host_positions(st.step, self.g, h, st.H)
            if not np.array_equal(idx, want):
                self.f.add(
                    f"step {st.step}, host {h}: read positions [{int(idx.min()) if idx.size else '-'}, "
                    f"{int(idx.max()) + 1 if idx.size else '-'}) but its slice is "
                    f"[{int(want[0])}, {int(want[-1]) + 1})"
                )


class PlanExamples:
    """Each logged example is the one the plan puts at its position (first VERIFY_POSITIONS)."""

    def __init__(self, plan: Plan, seed: int, slots: Callable[[np.ndarray, int, int], np.ndarray]):
        self.f = FailureList()
        self.plan, self.seed, self.slots = plan, seed, slots
        self.verified = 0

    def step(self, st: Step) -> None:
        # the hosts verified (in order, while under the budget), then one plan lookup for all of them
        if self.verified >= VERIFY_POSITIONS:
            return
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
            bad = np.flatnonzero(wrong[start : start + idx.size])
            if bad.size:
                j = int(bad[0])
                self.f.add(
                    f"step {st.step}, host {h}: position {int(idx[j])} gave example {int(ex[j])}, "
                    f"the plan (seed {self.seed}) says {int(planned[start + j])}"
                )
            start += idx.size


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
            self.not_run = (
                f"summary.json's hash covers {self.final_step} steps, the logs hold {self.steps} (failed above)"
            )
        else:
            self.matches = self.sha == self.expected
            if not self.matches:
                self.f.add(
                    f"summary.json's data_sha256 {self.expected[:16]}… is not the hash of the logged "
                    f"stream ({self.sha[:16]}…): the logs are not what the trainer consumed"
                )


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


@dataclasses.dataclass
class _Pass:
    """The checkers of the one streamed pass (each with `step(st)`, module doc) and what they share:
    the double-sharding evidence and the replays; `planned` is None when the order cannot be
    replayed (said in the run check's head)."""

    evidence: Evidence
    replays: Replays
    topology: Topology
    gaps: Gaps
    slices: Slices
    epochs: Epochs
    stream: StreamHash
    tally: SourceTally
    planned: PlanExamples | None

    @property
    def checkers(self) -> list[Any]:
        """In the order each step is handed to them."""
        plan = [self.planned] if self.planned else []
        return [self.topology, self.gaps, self.slices, *plan, self.epochs, self.stream, self.tally]


def _before_the_logs(plan: Plan, cfg: RunConfig, head: FailureList, not_run: dict[str, str]) -> bool:
    """What the run's record says before any log is read (into `head` and `not_run`): its data is
    another's (the cause first), its loader fingerprint, its host counts. → whether the logs can be
    read against this plan at all."""
    if cfg.other_data is not None:  # the cause first: the loader fingerprint then differs too
        head.add(cfg.other_data)
    if cfg.fingerprint is None:
        not_run["loader_fingerprint"] = cfg.missing.get("fingerprint", "the run's loader fingerprint is unknown")
    elif cfg.fingerprint != plan.fingerprint:
        head.add(
            f"the run's loader fingerprint {cfg.fingerprint[:16]}… is not the audited plan's "
            f"{plan.fingerprint[:16]}…: the run read other data or other mixture weights"
        )
    if cfg.other_data is not None:  # example ids of other manifests mean nothing in this plan
        not_run["logs"] = "the run's data logs name examples of other manifests than the audited ones"
        return False
    if cfg.hosts is None:
        not_run["hosts_per_step_range"] = cfg.missing.get("hosts", "the run's host counts are unknown")
    return True


def _checkers(
    plan: Plan, cfg: RunConfig, tokens_of: Callable[[int, np.ndarray], int] | None, head: FailureList
) -> _Pass:
    """The pass's checkers for the run's data order (an order that cannot apply to this plan, or
    one this audit does not know, is a finding in `head` and its examples are not checked)."""
    evidence = Evidence()
    fns, per_epoch = order_functions(cfg.order, cfg.global_batch_size), None
    try:
        per_epoch = fns.epoch_positions(plan.size) if fns else None
    except ValueError as e:  # the olmo-core order needs N ≥ G
        head.add(f"the run's data order {cfg.order.name} cannot apply to this plan: {e}")
        fns = None
    slots = fns.slots if fns else None
    planned = None
    if slots is None and cfg.order not in ORDERS:  # (a known order that cannot apply is reported above)
        head.add(
            f"the run's data order {cfg.order.name} v{cfg.order.version} is unknown to this audit "
            f"(it knows {sorted(f'{o.name} v{o.version}' for o in ORDERS)}): its examples cannot be "
            f"checked against the plan"
        )
    elif slots is not None:
        planned = PlanExamples(plan, cfg.seed, slots)
    return _Pass(
        evidence,
        Replays(),
        Topology(cfg.hosts),
        Gaps(cfg.final_step),
        Slices(cfg.global_batch_size, evidence),
        Epochs(plan, evidence, per_epoch),
        StreamHash(cfg.data_sha256, cfg.final_step),
        SourceTally(plan, tokens_of),
        planned,
    )


def _run_figures(cfg: RunConfig, p: _Pass) -> dict[str, Any]:
    """The run check's figures (audit.json)."""
    double = p.evidence.first
    topology = p.topology
    return {
        "hosts": topology.ranges[-1][0] if topology.ranges else 0,
        "topologies": topology.ranges,
        "steps_logged": p.gaps.seen,
        "replayed_steps": p.replays.count,
        "positions_verified_against_plan": min(p.planned.verified if p.planned else 0, VERIFY_POSITIONS),
        "examples_over_planned": p.epochs.over,
        "host_counts": p.gaps.host_counts[:1000],
        "first_double_sharding": None if double is None else {"step": double[0], "hosts": double[1], "what": double[2]},
        "source_examples": dict(p.tally.examples),
        "data_sha256_matches_summary": p.stream.matches,
        "global_batch_size": cfg.global_batch_size,
        "seed": cfg.seed,
        "order": {"name": cfg.order.name, "version": cfg.order.version},
    }


def check_run(
    run: RunDir, plan: Plan, cfg: RunConfig, tokens_of: Callable[[int, np.ndarray], int] | None = None
) -> RunFindings:
    """Check 5 (module doc) over the run's data logs → the result and the examples and non-PAD
    tokens it read per source. Named steps: the record before the logs (`_before_the_logs`), the
    checkers (`_checkers`), the one streamed pass, the first reads found after it, the figures."""
    head = FailureList()
    not_run: dict[str, str] = {}
    groups, problems = discover(run)
    for problem in problems:
        head.add(problem)
    if not groups:
        return RunFindings(result(NAME, TITLE, head, "", {}), {}, {})
    if not _before_the_logs(plan, cfg, head, not_run):
        return RunFindings(result(NAME, TITLE, head, "", {}, not_run=not_run), {}, {})
    p = _checkers(plan, cfg, tokens_of, head)
    checkers = p.checkers
    for st in stream_steps(groups, p.replays):
        for c in checkers:
            c.step(st)
    evidence, epochs, gaps, stream, planned = p.evidence, p.epochs, p.gaps, p.stream, p.planned
    wanted = epochs.f.wanted() | ({evidence.pending[0]} if evidence.pending else set())
    first_reads = find_first_reads(groups, plan, epochs.n, wanted) if wanted else {}
    evidence.resolve(first_reads)
    epochs_f = epochs.f.finish(first_reads)
    p.topology.finish()
    gaps.finish()
    stream.finish(cfg.missing.get("data_sha256"))
    if stream.not_run:
        not_run["data_sha256"] = stream.not_run
    if planned and planned.verified >= VERIFY_POSITIONS and planned.verified < gaps.positions:
        not_run["plan_examples_beyond_budget"] = (
            f"only the first {planned.verified} of {gaps.positions} logged "
            f"positions were recomputed from the plan (VERIFY_POSITIONS)"
        )
    f = FailureList()
    parts = (head, p.replays.f, p.topology.f, gaps.f, p.slices.f, *([planned.f] if planned else []), epochs_f, stream.f)
    for part in parts:
        f.extend(part)
    double = evidence.first
    summary = (
        None
        if double is None
        else (f"double sharding: from step {double[0]}, hosts {double[1]} {double[2]} ({f.count} findings in all)")
    )
    shape = ", then ".join(f"{t[0]} hosts for steps {t[1]}..{t[2]}" for t in p.topology.ranges)
    ok = (
        f"{gaps.seen} steps ({shape}): no position read twice, every host on its own slice, "
        f"examples as planned, no gaps"
    )
    return RunFindings(
        result(NAME, TITLE, f, ok, _run_figures(cfg, p), fail_summary=summary, not_run=not_run),
        dict(p.tally.examples),
        dict(p.tally.tokens),
    )
