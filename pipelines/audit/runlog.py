"""Check 5 — what the run actually consumed, from the trainer's `data_log/host-*.jsonl`.

Each host logs one line per step: `{"step": s, "index": [...], "example": [...]}` (global
positions and `source << 40 | record` ids). The check streams the H logs merged by step:
  * per-step host counts and gaps (a step some host did not log, steps nobody logged);
  * positions repeated across hosts in a step — the double-sharding signature — naming the
    first offending step and hosts; positions outside the host's planned slice;
  * each logged example against the plan (`dataloader.order` + `dataloader.plan`);
  * examples seen more often than planned: per epoch (index // N), every example is counted
    and compared with its planned multiplicity — an example returning before its epoch ends.
A step logged twice by a host (replayed after a resume) must repeat the same examples.
Memory: a per-epoch example counter (the examples the run consumed within one epoch) plus
one 16-byte digest per (host, step) for replay detection.
"""
from __future__ import annotations

import dataclasses
import glob
import hashlib
import heapq
import json
import os
import re
from collections import Counter
from collections.abc import Callable, Iterator

import numpy as np

from dataloader import hosts, order
from dataloader.plan import RECORD_BITS, Plan

from .checks import CheckResult, FailureList, result

NAME, TITLE = "run", "5. What the run consumed"
LOG_NAME = re.compile(r"host-(\d{5})-of-(\d{5})\.jsonl$")
VERIFY_POSITIONS = 1 << 18  # logged positions whose example is recomputed from the plan
RECORD_MASK = (1 << RECORD_BITS) - 1


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """global_batch_size/seed: the run's; fingerprint: the run's loader-state fingerprint (from its
    checkpoint), compared with the audited plan's; data_sha256/final_step: summary.json's hash of
    the consumed stream, recomputed from the logs (None: not available)."""

    global_batch_size: int
    seed: int
    fingerprint: str | None = None
    data_sha256: str | None = None
    final_step: int | None = None


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
    for p in sorted(glob.glob(os.path.join(run_dir, "data_log", "host-*.jsonl"))):
        m = LOG_NAME.search(os.path.basename(p))
        if not m or int(m.group(1)) >= int(m.group(2)):
            problems.append(f"{p}: name is not host-HHHHH-of-HHHHH.jsonl with HHHHH < the host count")
            continue
        groups.setdefault(int(m.group(2)), {})[int(m.group(1))] = p
    if not groups:
        problems.append(f"no data_log/host-*.jsonl files in {run_dir}")
    return groups, problems


def latest_host_count(run_dir: str) -> int:
    """The host count of the run's most recent topology (the one that logged the last step)."""
    groups, _ = discover(run_dir)
    best = (-1, 0)
    for H, paths in groups.items():
        for path in paths.values():
            last = -1
            for _, e in _lines(path):
                last = max(last, int(e["step"]))
            best = max(best, (last, H))
    return best[1]


def logged_global_batch(run_dir: str) -> int | None:
    """G as the logs show it: H × the rows host 0 logged at its first step, for the earliest
    topology (each host reads G/H rows). None when no log has a line. Used when neither a flag
    nor the run's config/checkpoint gives G (e.g. a run stopped before its first checkpoint)."""
    groups, _ = discover(run_dir)
    for H, paths in sorted(groups.items()):
        for _, path in sorted(paths.items()):
            for _, e in _lines(path):
                return H * len(e["index"])
    return None


def _lines(path: str) -> Iterator[tuple[int, dict]]:
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if line.strip():
                yield lineno, json.loads(line)


def _digest(entry: dict) -> bytes:
    blob = json.dumps([entry["index"], entry["example"]]).encode()
    return hashlib.blake2b(blob, digest_size=16).digest()


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


def _merged(groups: dict[int, dict[int, str]]) -> Iterator[tuple[int, int, int, np.ndarray, np.ndarray]]:
    """(step, H, host, index, example) over all logs in step order; replayed steps skipped."""
    def gen(H: int, h: int, path: str):
        last = -1
        for _, e in _lines(path):
            s = int(e["step"])
            if s <= last:
                continue
            last = s
            yield s, H, h, np.asarray(e["index"], np.int64), np.asarray(e["example"], np.int64)
    gens = [gen(H, h, p) for H, paths in sorted(groups.items()) for h, p in sorted(paths.items())]
    return heapq.merge(*gens, key=lambda t: (t[0], t[1], t[2]))


def _chain_fn():
    """The trainer's consumed-stream hash (`trainer.logs.chain_data_sha256`), if importable."""
    try:
        from trainer.logs import chain_data_sha256
    except ImportError:
        return None
    return chain_data_sha256


def check_run(run_dir: str, plan: Plan, cfg: RunConfig,
              tokens_of: Callable[[int, np.ndarray], int] | None = None) -> RunFindings:
    f = FailureList()
    groups, problems = discover(run_dir)
    for p in problems:
        f.add(p)
    if not groups:
        return RunFindings(result(NAME, TITLE, f, "", {}), {}, {})
    all_paths = [(H, h, p) for H, paths in sorted(groups.items()) for h, p in sorted(paths.items())]
    g, n = cfg.global_batch_size, plan.size
    if cfg.fingerprint is not None and cfg.fingerprint != plan.fingerprint:
        f.add(f"the run's loader fingerprint {cfg.fingerprint[:16]}… is not the audited plan's "
              f"{plan.fingerprint[:16]}…: the run read other data or other mixture weights")
    chain = _chain_fn()
    stream_sha = ""
    chain_ok = chain is not None
    # Pass 1: replays must repeat the same examples.
    replays = 0
    for _, h, path in all_paths:
        digests: dict[int, bytes] = {}
        for lineno, e in _lines(path):
            s, d = int(e["step"]), _digest(e)
            if s in digests:
                replays += 1
                if digests[s] != d:
                    f.add(f"host {h} logged step {s} twice with different examples ({path}:{lineno}): "
                          f"a resume did not reproduce the data stream")
            digests[s] = d
    # Pass 2: steps in order, all hosts together.
    double = None  # (step, hosts) of the first double-sharding evidence
    host_counts: list[list[int]] = []  # run-length encoded [first_step, last_step, hosts]
    topologies: list[list[int]] = []  # [host count, first step, last step]
    src_examples: Counter = Counter()
    src_tokens: Counter = Counter()
    epoch_seen: dict[int, list[int]] = {}  # example → [reads this epoch, first step, first host]
    epoch = 0
    verified = 0
    steps_seen = 0
    prev_step = None
    over_planned = 0

    def steps_of(it):
        group, cur = [], None
        for s, H_, h, idx, ex in it:
            if cur is not None and s != cur:
                yield cur, group
                group = []
            cur = s
            group.append((H_, h, idx, ex))
        if group:
            yield cur, group

    for step, tagged in steps_of(_merged(groups)):
        steps_seen += 1
        counts_here = sorted({H_ for H_, _, _, _ in tagged})
        if len(counts_here) > 1:
            f.add(f"step {step} is logged by {counts_here} hosts topologies at once: an old "
                  f"topology's log was not cut back at the restart")
        H = counts_here[-1]
        group = [(h, idx, ex) for H_, h, idx, ex in tagged if H_ == H]
        if topologies and topologies[-1][0] == H and topologies[-1][2] == step - 1:
            topologies[-1][2] = step
        else:
            topologies.append([H, step, step])
        expected = 0 if prev_step is None else prev_step + 1
        if step > expected:
            f.add(f"steps {expected}..{step - 1} are missing from every host's log (a gap)")
        prev_step = step
        present = [h for h, _, _ in group]
        if host_counts and host_counts[-1][2] == len(present) and host_counts[-1][1] == step - 1:
            host_counts[-1][1] = step
        else:
            host_counts.append([step, step, len(present)])
        if len(present) != H:
            f.add(f"step {step}: {len(present)} of {H} hosts logged it; missing hosts "
                  f"{sorted(set(range(H)) - set(present))[:10]} (a gap)")
        if chain_ok:
            if step != steps_seen - 1:  # the hash chain needs every step from 0
                chain_ok = False
            else:
                stream_sha = chain(stream_sha, step, np.concatenate([e for _, _, e in group]))
        idx_all = np.concatenate([i for _, i, _ in group])
        owner = np.concatenate([np.full(i.size, h) for h, i, _ in group])
        ex_all = np.concatenate([e for _, _, e in group])
        uniq, first, cnt = np.unique(idx_all, return_index=True, return_counts=True)
        if (cnt > 1).any():
            dup = uniq[cnt > 1]
            who = sorted(set(owner[np.isin(idx_all, dup)].tolist()))
            if double is None:
                double = (step, who, "read the same positions")
            f.add(f"step {step}: hosts {who} read the same {dup.size} positions (first {int(dup[0])}): "
                  f"double sharding")
        for h, idx, ex in group:
            if idx.size != ex.size:
                f.add(f"step {step}, host {h}: {idx.size} indices but {ex.size} examples logged")
                continue
            want = hosts.host_positions(step, g, h, H) if H and g % H == 0 else None
            if want is not None and not np.array_equal(idx, want):
                f.add(f"step {step}, host {h}: read positions [{int(idx.min()) if idx.size else '-'}, "
                      f"{int(idx.max()) + 1 if idx.size else '-'}) but its slice is "
                      f"[{int(want[0])}, {int(want[-1]) + 1})")
            if verified < VERIFY_POSITIONS and idx.size:
                src, rec = plan.locate(order.train_slots(idx, n, cfg.seed))
                planned = plan.example_ids(src, rec)
                wrong = np.flatnonzero(planned != ex)
                if wrong.size:
                    j = int(wrong[0])
                    f.add(f"step {step}, host {h}: position {int(idx[j])} gave example {int(ex[j])}, "
                          f"the plan (seed {cfg.seed}) says {int(planned[j])}")
                verified += idx.size
        # Per-epoch multiplicity (each position once: positions of a step are one batch).
        keep = first  # first occurrence of each position: a duplicated position is already a failure
        exs = ex_all[keep]
        planned_m = planned_multiplicity(plan, exs >> RECORD_BITS, exs & RECORD_MASK)
        for p, ex, h, m in zip(idx_all[keep].tolist(), exs.tolist(), owner[keep].tolist(),
                               planned_m.tolist()):
            e = p // n
            if e != epoch:
                epoch_seen.clear()  # a new epoch: every example may be read again
                epoch = e
            seen = epoch_seen.get(ex)
            if seen is None:
                epoch_seen[ex] = [1, step, h]
                continue
            seen[0] += 1
            if seen[0] > m:
                over_planned += 1
                if double is None:
                    double = (step, sorted({seen[2], h}),
                              f"re-read example {ex} before its epoch ended (first read at step {seen[1]})")
                f.add(f"step {step}, host {h}: example {ex} (source {ex >> RECORD_BITS}, record "
                      f"{ex & RECORD_MASK}) returns before epoch {e} ends: read {seen[0]}× (first at "
                      f"step {seen[1]} by host {seen[2]}), the plan reads it {m}× per epoch")
        srcs = ex_all[keep] >> RECORD_BITS
        for s_i in np.unique(srcs).tolist():
            sel = ex_all[keep][srcs == s_i]
            src_examples[s_i] += int(sel.size)
            src_tokens[s_i] += tokens_of(s_i, sel & RECORD_MASK) if tokens_of else 0
    if cfg.final_step is not None and prev_step is not None and cfg.final_step != prev_step + 1:
        f.add(f"summary.json says the run trained {cfg.final_step} steps but the logs end at step "
              f"{prev_step} (a gap at the end, or logs of another run)")
    chain_checked = None
    if chain_ok and cfg.data_sha256 is not None and cfg.final_step == steps_seen:
        chain_checked = stream_sha == cfg.data_sha256
        if not chain_checked:
            f.add(f"summary.json's data_sha256 {cfg.data_sha256[:16]}… is not the hash of the logged "
                  f"stream ({stream_sha[:16]}…): the logs are not what the trainer consumed")
    if double is not None:
        summary = (f"double sharding: from step {double[0]}, hosts {double[1]} {double[2]} "
                   f"({f.count} findings in all)")
    else:
        summary = None
    figures = {"hosts": topologies[-1][0] if topologies else 0, "topologies": topologies,
               "steps_logged": steps_seen, "replayed_steps": replays,
               "positions_verified_against_plan": min(verified, VERIFY_POSITIONS),
               "examples_over_planned": over_planned, "host_counts": host_counts[:1000],
               "first_double_sharding": None if double is None else {"step": double[0], "hosts": double[1], "what": double[2]},
               "source_examples": dict(src_examples), "data_sha256_matches_summary": chain_checked, "global_batch_size": g, "seed": cfg.seed}
    shape = ", then ".join(f"{t[0]} hosts for steps {t[1]}..{t[2]}" for t in topologies)
    ok = (f"{steps_seen} steps ({shape}): no position read twice, every host on its own slice, "
          f"examples as planned, no gaps")
    return RunFindings(result(NAME, TITLE, f, ok, figures, fail_summary=summary),
                       dict(src_examples), dict(src_tokens))
