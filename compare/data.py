"""The data two olmax runs consumed, step by step, from their data logs and data_sha256 chains.

`global_batches(run_dir)` streams (step, global example ids [G]) in step order from
`data_log/host-*-of-*.jsonl` (host slices concatenated in host order, the order the trainer's
hash uses). `compare_streams` walks two such streams together and names the first step whose
global batch differs and how (`describe_difference`). Memory: one step of each run, plus the
host files' read positions.
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import os
from collections.abc import Callable, Iterable, Iterator

import numpy as np

import contract
from contract.errors import Refused
from dataloader.plan import RECORD_BITS

MAX_QUOTED = 8  # example ids quoted per list in a message


class DataLogError(Refused, ValueError):
    """A data log is unreadable or inconsistent (the message names the file)."""


def _host_lines(path: str, H: int, h: int) -> Iterator[tuple[int, int, int, np.ndarray]]:
    """(step, H, h, example ids) of one host log in step order; a step logged again after a
    resume (same step, already seen) is skipped — the audit checks that replays agree."""
    last = -1
    try:
        for _lineno, e in contract.iter_data_log(path):  # each row shape-checked (JsonLinesError)
            step, example = e["step"], np.asarray(e["example"], dtype=np.int64)
            if step <= last:
                continue
            last = step
            yield step, H, h, example
    except contract.JsonLinesError as e:
        raise DataLogError(str(e)) from None


def data_log_files(run_dir: contract.RunDir) -> dict[int, dict[int, str]]:
    """{H: {h: path}} of run_dir's data logs (named as `contract.data_log_name`)."""
    groups: dict[int, dict[int, str]] = {}
    folder = str(run_dir.data_log)
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        parsed = contract.parse_data_log_name(name)
        if parsed:
            groups.setdefault(parsed[1], {})[parsed[0]] = os.path.join(folder, name)
    return groups


def global_batches(
    run_dir: contract.RunDir, host_count_at: Callable[[int], int] | None = None
) -> Iterator[tuple[int, np.ndarray]]:
    """(step, global example ids int64 [G]) in step order.

    host_count_at(step) → H (the run record's topology) picks which host count's logs hold a
    step when several do; without it the largest host count that logged the step wins (an
    elastic restart cuts the old logs back, so normally only one has it). A step that not all
    of its H hosts logged raises DataLogError: its global batch is unknown.
    """
    groups = data_log_files(run_dir)
    if not groups:
        raise DataLogError(f"{run_dir}: no {contract.DATA_LOG_DIR}/{contract.DATA_LOG_GLOB} files")
    streams = [_host_lines(p, H, h) for H, hs in sorted(groups.items()) for h, p in sorted(hs.items())]
    merged = heapq.merge(*streams, key=lambda t: (t[0], t[1], t[2]))
    step: int | None = None
    parts: collections.defaultdict[int, dict] = collections.defaultdict(dict)
    for s, H, h, ex in merged:
        if step is not None and s != step:
            yield step, _assemble(run_dir, step, parts, groups, host_count_at)
            parts = collections.defaultdict(dict)
        step = s
        parts[H][h] = ex
    if step is not None:
        yield step, _assemble(run_dir, step, parts, groups, host_count_at)


def _assemble(
    run_dir: contract.RunDir,
    step: int,
    parts: dict[int, dict[int, np.ndarray]],
    groups: dict[int, dict[int, str]],
    host_count_at: Callable[[int], int] | None,
) -> np.ndarray:
    H = host_count_at(step) if host_count_at else max(parts)
    got = parts.get(H, {})
    if len(got) != H or len(groups.get(H, {})) != H:
        raise DataLogError(
            f"{run_dir}: step {step} is logged by hosts {sorted(got)} of {H}: its global batch is incomplete"
        )
    return np.concatenate([got[h] for h in range(H)])


def _quote(ids: Iterable[int]) -> str:
    """Example ids as source:record (id = source << RECORD_BITS | record), the first few."""
    ids = list(ids)
    more = f" … (+{len(ids) - MAX_QUOTED})" if len(ids) > MAX_QUOTED else ""
    mask = (1 << RECORD_BITS) - 1
    return "[" + ", ".join(f"{int(i) >> RECORD_BITS}:{int(i) & mask}" for i in ids[:MAX_QUOTED]) + more + "]"


def describe_difference(run: np.ndarray, ref: np.ndarray) -> dict:
    """How two global batches (example ids [G_run], [G_ref]) differ; {} when identical. The text
    quotes examples as source:record.

    kind: "other order" (same examples, same multiplicities), "other examples" (as many rows,
    some ids differ), "extra or missing rows" (row counts differ). Rows are compared as
    multisets, so a batch that reads one example twice shows it as an extra row (and the row it
    displaced as missing).
    """
    if len(run) == len(ref) and np.array_equal(run, ref):
        return {}
    a, b = collections.Counter(run.tolist()), collections.Counter(ref.tolist())
    extra, missing = sorted((a - b).elements()), sorted((b - a).elements())
    repeated = sorted(x for x, c in a.items() if c > 1)
    if not extra and not missing:
        moved = int(np.count_nonzero(run != ref))
        kind, text = "other order", f"same {len(run)} examples in another order ({moved} rows moved)"
    elif len(run) == len(ref):
        kind = "other examples"
        text = (
            f"{len(extra)} of {len(run)} rows hold other examples: only in the run {_quote(extra)}, "
            f"only in the reference {_quote(missing)} (examples as source:record)"
        )
    else:
        kind = "extra or missing rows"
        text = (
            f"{len(run)} rows vs the reference's {len(ref)}: only in the run {_quote(extra)}, only in the "
            f"reference {_quote(missing)} (examples as source:record)"
        )
    if repeated:
        text += f"; the run's batch reads examples {_quote(repeated)} more than once"
    return {
        "kind": kind,
        "text": text,
        "extra_rows": len(extra),
        "missing_rows": len(missing),
        "repeated_in_run": len(repeated),
        "extra": extra[:MAX_QUOTED],
        "missing": missing[:MAX_QUOTED],
    }


@dataclasses.dataclass
class DataComparison:
    """status: "identical" | "different" | "unknown" (nothing to compare); first_difference:
    {step, kind, text, …} of the first differing step; chains: each side's recomputed
    data_sha256 at the last compared step, whether it matches its summary.json (None when the
    check could not run) and `not_run`, why not (also said in `summary`)."""

    status: str
    summary: str
    steps_compared: int = 0
    differing_steps: int = 0
    first_difference: dict | None = None
    chains: dict = dataclasses.field(default_factory=dict)

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def compare_streams(
    run: Iterable[tuple[int, np.ndarray]], ref: Iterable[tuple[int, np.ndarray]]
) -> tuple[int, int, dict | None, tuple[str, str], tuple[int, int]]:
    """Walks both (step, batch) streams → (steps compared, differing steps, first difference,
    (run chain, ref chain) over the compared steps, (run steps, ref steps) seen in all).

    Steps compare by number; a step one side lacks (a gap) counts as a difference of kind
    "missing step". The chains are `contract.chain_data_sha256` from "" over each side's steps.
    """
    it_a, it_b = iter(run), iter(ref)
    a, b = next(it_a, None), next(it_b, None)
    compared = differing = 0
    first = None
    chain_a = chain_b = ""
    seen = [0, 0]
    while a is not None and b is not None:
        if a[0] != b[0]:
            lo = min(a[0], b[0])
            side = "reference" if a[0] == lo else "run"
            diff = {"step": lo, "kind": "missing step", "text": f"step {lo} is not in the {side}'s data log"}
            first = first or diff
            differing += 1
            if a[0] == lo:
                chain_a = contract.chain_data_sha256(chain_a, a[0], a[1])
                a, seen[0] = next(it_a, None), seen[0] + 1
            else:
                chain_b = contract.chain_data_sha256(chain_b, b[0], b[1])
                b, seen[1] = next(it_b, None), seen[1] + 1
            continue
        compared += 1
        d = describe_difference(a[1], b[1])
        if d:
            differing += 1
            first = first or {"step": a[0], **d}
        chain_a = contract.chain_data_sha256(chain_a, a[0], a[1])
        chain_b = contract.chain_data_sha256(chain_b, b[0], b[1])
        a, b = next(it_a, None), next(it_b, None)
        seen = [seen[0] + 1, seen[1] + 1]
    seen[0] += sum(1 for _ in it_a) + (a is not None)
    seen[1] += sum(1 for _ in it_b) + (b is not None)
    return compared, differing, first, (chain_a, chain_b), (seen[0], seen[1])


def _read_summary(run_dir: contract.RunDir) -> contract.RunSummary | str:
    """run_dir's summary.json through the contract, or why there is none to check against (a
    string). A damaged summary.json raises contract.RunSummaryError naming the file: an error the
    user must see (exit 2), never a check that quietly does not happen."""
    try:
        return contract.RunSummary.load(str(run_dir))
    except FileNotFoundError:
        return f"{run_dir.summary} is missing (the run has not finished)"


def _chain_check(summary: contract.RunSummary | str, chain: str, compared: int, logged: int) -> dict:
    """{recomputed, summary, matches_summary, not_run}: matches_summary is True/False when the
    summary's hash covers exactly the steps compared, else None with `not_run` saying why."""
    if isinstance(summary, str):
        return {"recomputed": chain, "summary": None, "matches_summary": None, "not_run": summary}
    not_run = None
    if summary.step != logged:
        not_run = f"{summary.path}'s data_sha256 covers {summary.step} steps, the data log holds {logged}"
    elif compared != logged:
        not_run = (
            f"the hash was recomputed over the {compared} steps both runs logged, not all {logged} "
            f"that {summary.path}'s data_sha256 covers"
        )
    matches = None if not_run else summary.data_sha256 == chain
    return {"recomputed": chain, "summary": summary.data_sha256, "matches_summary": matches, "not_run": not_run}


def compare_data(
    run_dir: contract.RunDir,
    ref_dir: contract.RunDir,
    run_hosts: Callable[[int], int] | None = None,
    ref_hosts: Callable[[int], int] | None = None,
) -> DataComparison:
    """The data comparison of two olmax run directories (see the module doc). Raises
    contract.RunSummaryError when a side's summary.json is damaged."""
    summaries = {"run": _read_summary(run_dir), "reference": _read_summary(ref_dir)}
    try:
        compared, differing, first, chains, seen = compare_streams(
            global_batches(run_dir, run_hosts), global_batches(ref_dir, ref_hosts)
        )
    except (DataLogError, OSError) as e:
        a, b = summaries["run"], summaries["reference"]
        if isinstance(a, contract.RunSummary) and isinstance(b, contract.RunSummary):
            # No usable logs: the final hashes still say whether the streams agree.
            same = a.data_sha256 == b.data_sha256 and a.step == b.step
            return DataComparison(
                "identical" if same else "different",
                f"data logs unusable ({e}); summary data_sha256 "
                f"{'equal' if same else 'differ'} ({a.data_sha256[:12]}… vs "
                f"{b.data_sha256[:12]}…)",
                chains={"run": a.data_sha256, "reference": b.data_sha256},
            )
        return DataComparison("unknown", f"cannot compare the data: {e}")
    chain_info = {
        side: _chain_check(summaries[side], chain, compared, n)
        for side, chain, n in (("run", chains[0], seen[0]), ("reference", chains[1], seen[1]))
    }
    if first is None and seen[0] == seen[1]:
        status, text = "identical", f"identical batches: all {compared} steps hold the same global batch"
    elif first is None:
        status = "different"
        text = (
            f"the first {compared} steps hold identical batches; the run logged {seen[0]} steps, "
            f"the reference {seen[1]}"
        )
    else:
        status = "different"
        text = (
            f"first difference at step {first['step']}: {first['text']} ({differing} of "
            f"{compared} compared steps differ)"
        )
    for side, info in chain_info.items():
        if info["matches_summary"] is False:
            text += f"; the {side}'s summary data_sha256 is not the hash of its logged stream"
        elif info["not_run"]:
            text += f"; the {side}'s chain check not run: {info['not_run']}"
    return DataComparison(status, text, compared, differing, first, chain_info)
