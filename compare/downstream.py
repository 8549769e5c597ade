"""The downstream verdict: a run's in-loop task metrics against the reference's (pure functions).

Keys are OLMo-core's, as olmax's metrics.jsonl and AI2's W&B history both spell them:
``eval/downstream/<label> (<metric label>)`` (contract.downstream.METRIC_LABELS). A task logs
every value ICLMetric computes; its headline (the one judged) is the value of the task's own metric
type, in its v2 spelling, which is the one AI2's tooling reads off W&B (olmo-cookbook, olmix):

==============================================  ===========  ====================================  ======
task                                            metric type  headline key suffix                   better
==============================================  ===========  ====================================  ======
arc_{challenge,easy}_test_mc_5shot_fast         acc          (accuracy v2)                         higher
mmlu_*_test_mc_5shot_fast                       len_norm     (length-normalized accuracy v2)       higher
basic_skills_*_rc_5shot, copycolors_10way_fast  acc          (accuracy v2)                         higher
every *_bpb_* task                              bpb          (BPB v2)                              lower
==============================================  ===========  ====================================  ======

The metric type is read off the keys the run logged (an accuracy-type task logs its accuracy
beside CE loss, BPB and soft losses; a bpb task logs BPB and BPB v2 only), so any olmo_eval task
works. For acc, len_norm and pmi_dc ICLMetric's v1 and v2 are the same number: a reference that
logged only the v1 key is read through it.

The verdict is on macro averages, one per kind of number (accuracies and BPB are not averaged
together), and on each task. At each evaluation row the reference logged, a task's reference value
is its v2 key where finite, else its v1 key (per row: a reference that switched spelling mid-run is
read whole); the macro at that row is the plain mean over the tasks the reference has a finite value
of there, the run's (interpolated as curves.align does) over the same tasks. A row judged on fewer
than all the macro's tasks is counted (`partial_points`, coverage "partial") and makes the macro
UNKNOWN rather than PASS; it is never dropped. Each macro must stay within ±tolerance (absolute;
0.005 by default) of the reference's at every reference point from after_tokens on, the points
picked as the held-out verdict picks them (curves.judge: the reference's points inside the run's
range, a run that covers only a prefix fails unless allow_prefix); every task's values go through
compare.holes' rule (the run's NaN/±Infinity fails, the reference's makes the macro UNKNOWN, each named).
Each task must stay within ±task_tolerance (default tolerance × the macro's task count,
`task_bound`: tasks that cancel in the macro still fail). A task the reference lacks is UNKNOWN
(named, left out of the macro); fewer than min_share (0.5) of the run's tasks compared, or none,
makes the downstream verdict UNKNOWN. An accuracy outside [0, 1] on either side is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import numpy as np

from contract import downstream as ds
from contract.errors import Refused

from . import curves as curves_lib
from . import holes as holes_lib
from .curves import Curves

DEFAULT_TOLERANCE = 0.005  # absolute, on each macro average (accuracy; BPB)
# A kind's macro over fewer than this share of the run's tasks of that kind is UNKNOWN: a macro over
# a minority of the tasks is a verdict on another task set (a reference holding 1 of 26 tasks).
DEFAULT_MIN_SHARE = 0.5
SUFFIX_OF = {text: suffix for suffix, text in ds.METRIC_LABELS.items()}
# metric type → (kind of number it is, higher is better); the order decides a task's type
TYPES = {
    "len_norm": ("accuracy", True),
    "pmi_dc": ("accuracy", True),
    "acc": ("accuracy", True),
    "f1": ("accuracy", True),
    "bpb": ("BPB", False),
    "ce_loss": ("CE loss", False),
}
SAME_V1 = ("acc", "len_norm", "pmi_dc")  # ICLMetric: v1 == v2


def is_key(key: str) -> bool:
    """An OLMo-core downstream key with a metric label ICLMetric logs."""
    parsed = ds.parse_metric_key(key)
    return parsed is not None and parsed[1] in SUFFIX_OF


def key(label: str, suffix: str) -> str:
    return ds.metric_key(label, ds.METRIC_LABELS[suffix])


CLEAN = ds.CLEAN_SUFFIX  # a task's metrics on its clean subset


def clean_view(c: Curves) -> Curves:
    """The curves with each task's clean-subset values (its keys with " clean" appended, which
    `is_key` does not match, so a plain verdict ignores them) in place of its full ones, their
    NaN/Infinity records too; a side that logged none is returned as it is."""
    clean = {k[: -len(CLEAN)]: v for k, v in c.values.items() if k.endswith(CLEAN) and is_key(k[: -len(CLEAN)])}
    if not clean:
        return c
    values = {k: v for k, v in c.values.items() if k not in clean and not k.endswith(CLEAN)}
    bad = {k: v for k, v in c.nonfinite.items() if k not in clean and not k.endswith(CLEAN)}
    bad.update({k[: -len(CLEAN)]: v for k, v in c.nonfinite.items() if k.endswith(CLEAN) and k[: -len(CLEAN)] in clean})
    names = {k: k + CLEAN for k in clean}
    return dataclasses.replace(c, values={**values, **clean}, nonfinite=bad, logged_as={**c.logged_as, **names})


def tasks_of(keys: Iterable[str]) -> dict[str, set[str]]:
    """{label: ICLMetric suffixes logged} of the downstream keys among `keys`, first-seen order."""
    out: dict[str, set[str]] = {}
    for k in keys:
        parsed = ds.parse_metric_key(k)
        if parsed and parsed[1] in SUFFIX_OF:
            out.setdefault(parsed[0], set()).add(SUFFIX_OF[parsed[1]])
    return out


def metric_type(suffixes: set[str]) -> str | None:
    """The task's ICLMetric type from the suffixes it logged (None: no headline among them)."""
    for t in TYPES:
        if t in ("bpb", "ce_loss"):
            continue
        if f"{t}_v1" in suffixes or f"{t}_v2" in suffixes:
            return t
    plain = {s.rsplit("_v", 1)[0] for s in suffixes}
    for t in ("bpb", "ce_loss"):
        if plain == {t}:
            return t
    return None


@dataclasses.dataclass(frozen=True)
class Headline:
    label: str
    metric_type: str
    kind: str
    higher_is_better: bool
    key: str  # the run's key

    def candidates(self) -> list[str]:
        """Keys that carry this number on the reference's side, preferred first."""
        out = [self.key]
        if self.metric_type in SAME_V1:
            out.append(key(self.label, f"{self.metric_type}_v1"))
        return out


def headlines(curves: Curves) -> dict[str, Headline]:
    """{label: its headline} of each task the side logged a value of."""
    logged = [k for k, v in curves.values.items() if is_key(k) and (np.isfinite(v).any() or k in curves.nonfinite)]
    out = {}
    for label, suffixes in tasks_of(logged).items():
        t = metric_type(suffixes)
        if t is None:
            continue
        kind, higher = TYPES[t]
        suffix = f"{t}_v2" if f"{t}_v2" in suffixes or t not in SAME_V1 else f"{t}_v1"
        out[label] = Headline(label, t, kind, higher, key(label, suffix))
    return out


def wanted_keys(curves: Curves) -> list[str]:
    """The reference keys a table is searched for: every candidate of the run's headlines and its
    clean-subset twin (read only with --downstream_clean; absent columns are left out)."""
    keys = [k for h in headlines(curves).values() for k in h.candidates()]
    return keys + [k + CLEAN for k in keys]


def _ref_key(h: Headline, ref: Curves) -> str | None:
    """The reference key reported for the task: its first candidate with a finite value (the
    value read at each row is `_ref_column`'s, which falls back per row)."""
    for k in h.candidates():
        v = ref.values.get(k)
        if v is not None and np.isfinite(v).any():
            return k
    return None


def _ref_column(h: Headline, ref: Curves) -> tuple[np.ndarray, np.ndarray]:
    """(the task's reference value at each row: its v2 key where finite, else its v1 key (acc,
    len_norm, pmi_dc: the same number), NaN where neither is; whether the row logged any of them,
    finite or not): float64 [n], bool [n]. Per row, so a reference that logged v1 names at some
    steps and v2 at others (an OLMo-core upgrade mid-run) is read whole."""
    value = np.full(len(ref.steps), np.nan)
    logged = np.zeros(len(ref.steps), dtype=bool)
    for k in h.candidates():
        col = ref.values.get(k)
        if col is None:
            continue
        fill = np.isnan(value) & np.isfinite(col)
        value[fill] = col[fill]
        logged |= np.isfinite(col)
        bad = [s for s, _ in ref.nonfinite.get(k, [])]
        logged[np.searchsorted(ref.steps, bad)] = True
    return value, logged


def check_range(h: Headline, curves: Curves, keys: list[str]) -> None:
    """An accuracy outside [0, 1] is no accuracy (a column of percentages, a mislabelled key):
    DownstreamValueError naming the side, the key and the step."""
    if h.kind != "accuracy":
        return
    for k in keys:
        v = curves.values.get(k)
        if v is None:
            continue
        bad = np.flatnonzero(np.isfinite(v) & ((v < 0) | (v > 1)))
        if len(bad):
            i = int(bad[0])
            raise DownstreamValueError(
                f"{curves.name}: {k} = {v[i]:g} at step {int(curves.steps[i])} is not an accuracy "
                f"(outside [0, 1]; {len(bad)} such value{'s' if len(bad) > 1 else ''})"
            )


class DownstreamValueError(Refused, ValueError):
    """A logged downstream value that cannot be what its key says (one line, exit 2)."""


def _with(curves: Curves, extra: dict[str, np.ndarray]) -> Curves:
    return dataclasses.replace(curves, values={**curves.values, **extra})


def _task_row(h: Headline, ref_key: str | None, a: curves_lib.Aligned | None) -> dict[str, Any]:
    row = {
        "key": h.key,
        "reference_key": ref_key,
        "metric_type": h.metric_type,
        "kind": h.kind,
        "higher_is_better": h.higher_is_better,
    }
    if a is None:
        return {**row, "status": "UNKNOWN", "why": "not in the reference", "points": 0}
    if not len(a.tokens):
        return {**row, "status": "UNKNOWN", "why": "no common evaluation step", "points": 0}
    d = a.diff
    final = {
        "tokens": float(a.tokens[-1]),
        "reference_step": int(a.ref_steps[-1]),
        "run": float(a.run[-1]),
        "reference": float(a.ref[-1]),
        "diff": float(d[-1]),
    }
    return {
        **row,
        "status": "compared",
        "points": len(a.tokens),
        "final": final,
        "max_abs_diff": float(np.abs(d).max()),
        "aligned": {"tokens": a.tokens, "reference_step": a.ref_steps, "run": a.run, "reference": a.ref},
    }


def macro_key(kind: str) -> str:
    return ds.metric_key("macro", kind)


@dataclasses.dataclass(frozen=True)
class MacroPoints:
    """A kind's macro on the reference's evaluation rows: `aligned` (the rows inside the run's range
    with at least one task; each the mean over the tasks the reference has a finite value of there,
    the run's at the same tasks), `partial` [(reference step, [missing tasks])] of those rows judged
    on fewer than all the kind's tasks, `empty` (reference steps inside the run's range with none)."""

    aligned: curves_lib.Aligned
    partial: list[tuple[int, list[str]]]
    empty: list[int]
    ref_macro: np.ndarray  # [n reference rows], NaN where no task (for the figure)


def macro_points(run: Curves, ref: Curves, heads: list[Headline], columns: dict[str, np.ndarray]) -> MacroPoints:
    """Pure: the macro of `heads` (one kind) judged row by row (see MacroPoints). columns: {label:
    `_ref_column`'s value} (run's keys: each task's headline, interpolated at the reference's tokens
    as `curves.align` does)."""
    logged = np.zeros(len(ref.steps), dtype=bool)
    for h in heads:
        logged |= columns[f"{h.label}/logged"]
    vals = np.stack([columns[h.label] for h in heads])  # [tasks, rows]
    present = np.isfinite(vals)
    run_at = np.full(vals.shape, np.nan)
    lo, hi = np.inf, -np.inf
    for i, h in enumerate(heads):
        rt, _, rv = run.series(h.key)
        if len(rt):
            run_at[i] = np.interp(ref.tokens, rt, rv, left=np.nan, right=np.nan)
            lo, hi = min(lo, float(rt[0])), max(hi, float(rt[-1]))
    inside = logged & (ref.tokens >= lo) & (ref.tokens <= hi)
    n_present = present.sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        ref_macro = np.where(present, vals, 0.0).sum(axis=0) / n_present
        ok = present & np.isfinite(run_at)
        run_macro = np.where(ok, run_at, 0.0).sum(axis=0) / ok.sum(axis=0)
        ref_same = np.where(ok, vals, 0.0).sum(axis=0) / ok.sum(axis=0)
    judged = inside & (ok.sum(axis=0) > 0)
    idx = np.flatnonzero(judged)
    partial = [
        (int(ref.steps[j]), [h.label for i, h in enumerate(heads) if not ok[i, j]])
        for j in idx
        if ok[:, j].sum() < len(heads)
    ]
    empty = [int(ref.steps[j]) for j in np.flatnonzero(inside & ~judged)]
    aligned = curves_lib.Aligned(
        "", ref.tokens[idx], ref.steps[idx], run_macro[idx], ref_same[idx], ref.tokens[logged & (n_present > 0)]
    )
    return MacroPoints(aligned, partial, empty, np.where(n_present > 0, ref_macro, np.nan))


def _task_failures(
    tasks: dict[str, Any], labels: list[str], bound: float, after_tokens: float
) -> list[tuple[str, dict[str, Any]]]:
    """(label, first point past `bound`) of each compared task that leaves ±bound after `after_tokens`."""
    out = []
    for label in labels:
        t = tasks[label]
        a = t.get("aligned")
        if not a:
            continue
        tok, d = np.asarray(a["tokens"]), np.asarray(a["run"]) - np.asarray(a["reference"])
        bad = np.flatnonzero((tok >= after_tokens) & (np.abs(d) > bound))
        if len(bad):
            i = int(bad[0])
            out.append((label, {"reference_step": int(a["reference_step"][i]), "diff": float(d[i])}))
    return out


def _partial_text(mp: MacroPoints, n_tasks: int) -> str:
    parts = []
    if mp.partial:
        step, missing = mp.partial[0]
        parts.append(
            f"{len(mp.partial)} reference point(s) judged on fewer than its {n_tasks} tasks (first: step {step}, "
            f"no finite reference value of {', '.join(missing)})"
        )
    if mp.empty:
        parts.append(
            f"{len(mp.empty)} reference point(s) with no finite value of any of its tasks (first: step {mp.empty[0]})"
        )
    return "; ".join(parts)


def _task_rows(
    run: Curves, ref: Curves, heads: dict[str, Headline]
) -> tuple[dict[str, Any], dict[str, list[Headline]], dict[str, np.ndarray]]:
    """Each task's row (`_task_row`), the tasks with a reference point grouped by kind (what each
    kind's macro averages), and the reference's column of each such task (and its `/logged` mask).
    An accuracy outside [0, 1] on either side is refused (DownstreamValueError)."""
    tasks: dict[str, Any] = {}
    groups: dict[str, list[Headline]] = {}
    columns: dict[str, np.ndarray] = {}
    for label, h in heads.items():
        check_range(h, run, [h.key])
        check_range(h, ref, h.candidates())
        rk = _ref_key(h, ref)
        a = None
        if rk is not None:
            columns[label], columns[f"{label}/logged"] = _ref_column(h, ref)
            a = curves_lib.align(run, _with(ref, {h.key: columns[label]}), h.key)
            if len(a.tokens):
                groups.setdefault(h.kind, []).append(h)
        tasks[label] = _task_row(h, rk, a)
    return tasks, groups, columns


def _macro_ruling(
    v: curves_lib.Verdict, task_fails: list[tuple[str, dict[str, Any]]], bound: float, partial: str
) -> tuple[bool | None, str]:
    """A kind's (passed, summary): the macro's verdict, failed by a task outside ±bound although the
    macro is not, UNKNOWN (never PASS) when some reference rows were judged on part of the tasks."""
    kind_passed, summary = v.passed, v.summary
    if task_fails and kind_passed is not False:
        label, first = task_fails[0]
        kind_passed = False
        summary = (
            f"{len(task_fails)} task(s) leave ±{bound:g} of the reference although the macro does not "
            f"(first: {label}, diff {first['diff']:+.4f} at reference step {first['reference_step']}); " + summary
        )
    notes = [f"partial: {partial}"] if partial else []
    if notes and kind_passed is True:
        kind_passed = None
        summary = "UNKNOWN: " + "; ".join(notes) + f" ({summary})"
    elif notes:
        summary += "; " + "; ".join(notes)
    return kind_passed, summary


def _macro(
    run: Curves,
    ref: Curves,
    kind: str,
    group: list[Headline],
    tasks: dict[str, Any],
    columns: dict[str, np.ndarray],
    judging: dict[str, Any],
    task_tolerance: float | None,
) -> tuple[dict[str, Any], np.ndarray, np.ndarray]:
    """One kind's macro judged (`judging`: tolerance, after_tokens, allow_prefix) → (its entry of
    "macros", the run's macro curve, the reference's)."""
    mk = macro_key(kind)
    keys = [h.key for h in group]
    run_macro = np.stack([run.values[k] for k in keys]).mean(axis=0)
    mp = macro_points(run, ref, group, columns)
    labels = [h.label for h in group]
    what = f"downstream {kind} macro ({len(group)} task{'s' if len(group) > 1 else ''})"
    gate = holes_lib.check(run, ref, keys, [tuple(h.candidates()) for h in group], judging["after_tokens"])
    v = curves_lib.judge(dataclasses.replace(mp.aligned, metric=mk), None, **judging, gate=gate, what=what, unit="")
    bound = task_bound(judging["tolerance"], len(group)) if task_tolerance is None else task_tolerance
    task_fails = _task_failures(tasks, labels, bound, judging["after_tokens"])
    kind_passed, summary = _macro_ruling(v, task_fails, bound, _partial_text(mp, len(group)))
    entry = {
        **v.to_json(),
        "passed": kind_passed,
        "summary": summary,
        "key": mk,
        "tasks": labels,
        "higher_is_better": kind == "accuracy",
        "task_tolerance": bound,
        "tasks_failing": [{"task": x, **f} for x, f in task_fails],
        "partial_points": [{"reference_step": s, "missing": m} for s, m in mp.partial],
        "empty_points": mp.empty,
        "aligned": {
            "tokens": mp.aligned.tokens,
            "reference_step": mp.aligned.ref_steps,
            "run": mp.aligned.run,
            "reference": mp.aligned.ref,
        },
    }
    entry["coverage"] = {**(entry["coverage"] or {}), "partial": len(mp.partial), "empty": len(mp.empty)}
    return entry, run_macro, mp.ref_macro


def _overall(
    tasks: dict[str, Any], macros: dict[str, Any], alone: holes_lib.Gate, min_share: float
) -> tuple[bool | None, str, list[str], float]:
    """The downstream verdict over the kinds → (passed, summary, the tasks not compared, the share
    compared): FAIL when a macro fails or a task no macro judges diverged (`alone`), UNKNOWN when
    no macro, a macro UNKNOWN, or fewer than `min_share` of the run's tasks compared."""
    missing = [x for x, t in tasks.items() if t["status"] == "UNKNOWN"]
    compared = len(tasks) - len(missing)
    few = bool(macros) and compared / len(tasks) < min_share
    passed: bool | None
    if alone.fail is not None or any(m["passed"] is False for m in macros.values()):
        passed = False
    elif not macros or few or any(m["passed"] is None for m in macros.values()):
        passed = None
    else:
        passed = True
    parts = [m["summary"] for m in macros.values()] or [
        f"no downstream task in common with the reference (the run logged {len(tasks)}: {', '.join(tasks)})"
    ]
    if few:
        parts.insert(
            0,
            f"UNKNOWN: only {compared} of the run's {len(tasks)} downstream tasks compared (fewer than "
            f"{min_share:.0%}, --downstream_min_share)",
        )
    if alone.fail is not None:
        parts.insert(0, f"FAIL: {alone.fail.text()}: a diverged run fails")
    if missing and macros:
        parts.append("UNKNOWN (not compared): " + ", ".join(f"{x} ({tasks[x]['why']})" for x in missing))
    return passed, "; ".join(parts), missing, compared / len(tasks)


def verdict(
    run: Curves,
    ref: Curves,
    tolerance: float = DEFAULT_TOLERANCE,
    after_tokens: float = 0.0,
    allow_prefix: bool = False,
    task_tolerance: float | None = None,
    min_share: float = DEFAULT_MIN_SHARE,
) -> tuple[dict[str, Any] | None, Curves, Curves]:
    """→ (compare.json's "downstream", the run's and the reference's curves with the macro averages
    added under `macro_key(kind)`); None when the run logged no downstream metric.

    Each kind's macro is judged at every reference evaluation row (`macro_points`): a row where the
    reference has no finite value of a task is judged on the tasks it has and counted (`partial`),
    which makes that macro UNKNOWN rather than PASS. Each task is judged too, within ±task_tolerance
    (default: tolerance × the macro's task count, `task_bound`). Fewer than `min_share` of the run's
    tasks compared: UNKNOWN. An accuracy outside [0, 1] on either
    side is refused (DownstreamValueError). Named steps: the task rows (`_task_rows`), each kind's
    macro (`_macro`), the verdict over them (`_overall`)."""
    heads = headlines(run)
    if not heads:
        return None, run, ref
    tasks, groups, columns = _task_rows(run, ref, heads)
    judging: dict[str, Any] = dict(tolerance=tolerance, after_tokens=after_tokens, allow_prefix=allow_prefix)
    macros: dict[str, Any] = {}
    run_extra, ref_extra = {}, {}
    for kind, group in groups.items():
        macros[kind], run_extra[macro_key(kind)], ref_extra[macro_key(kind)] = _macro(
            run, ref, kind, group, tasks, columns, judging, task_tolerance
        )
    # the tasks no macro judges (the reference lacks them) go through the rule too: the run's NaN fails
    in_macros = {h.key for g in groups.values() for h in g}
    alone = holes_lib.check(run, ref, [h.key for h in heads.values() if h.key not in in_macros], [], after_tokens)
    passed, summary, missing, share = _overall(tasks, macros, alone, min_share)
    result = {
        "passed": passed,
        "summary": summary,
        "tolerance": tolerance,
        "min_share": min_share,
        "macros": macros,
        "compared_share": share,
        "tasks": tasks,
        "not_compared": missing,
    }
    return result, _with(run, run_extra), _with(ref, ref_extra)


def task_bound(tolerance: float, n_tasks: int) -> float:
    """The default per-task bound of a macro of `n_tasks` judged within ±tolerance: tolerance ×
    n_tasks, the difference at which one task alone moves the macro past its tolerance. A task past
    it fails even when another task's opposite difference cancels it in the macro (two tasks at
    +0.3 and −0.3 leave the macro at 0); one within it cannot fail the macro by itself. For the
    case study's ±0.005 over OLMo 3's 13 accuracy tasks: ±0.065 per task, about 3 standard errors
    of a 500-instance task's accuracy difference between two runs (√(2·0.25/500) ≈ 0.032)."""
    return tolerance * n_tasks


def task_text(t: dict[str, Any]) -> str:
    """One task's line: its last compared point, or why it is UNKNOWN."""
    if t["status"] != "compared":
        return f"UNKNOWN ({t['why']})"
    f = t["final"]
    better = "higher" if t["higher_is_better"] else "lower"
    return (
        f"run {f['run']:.4f} vs reference {f['reference']:.4f} (diff {f['diff']:+.4f}, {better} is better) at "
        f"reference step {f['reference_step']}; max |diff| {t['max_abs_diff']:.4f} over {t['points']} points"
    )
