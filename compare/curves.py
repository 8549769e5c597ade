"""Metric curves of two runs, aligned by tokens seen, differenced, and judged (pure functions).

A `Curves` holds one run's metrics as arrays over its logged rows: ``tokens`` (tokens seen
*after* the row's update, the x axis both sides share) and one float array per metric (NaN
where the row does not carry it: held-out loss is only logged at evaluation steps).

Alignment: the reference's points are the grid; the run's curve is linearly interpolated at
each reference point inside the run's token range (no extrapolation). Runs with the same
tokens per step hit the grid exactly, so identical runs give a difference of exactly zero.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from contract import downstream as ds

from . import holes as holes_lib

METRICS = ("loss", "heldout_loss", "grad_norm", "lr")  # what is compared, in report order
POOLED_TOKENS = "heldout_tokens"  # target tokens of the pooled heldout_loss (trainer.heldout_eval.OVERALL_TOKENS)
SET_PREFIX = "heldout/"  # per-set held-out losses: heldout/<set>/loss (trainer.heldout_eval), weights .../tokens
DOWNSTREAM_PREFIX = ds.METRIC_KEY_PREFIX + "/"  # downstream task metrics, OLMo-core's keys (contract.downstream)
DEFAULT_SMOOTH = 10  # span (points) of the debiased EMA that smooths the training loss (curves.smooth)
# At most this many points of a per-step curve are stored in compare.json: a 7B stage-1 run logs
# ~600k steps, whose full arrays would make it ~160 MB (measured: 3.2 MB for 12k steps). Shorter
# curves are kept whole; verdicts are computed on every point. (The figures need no thinning:
# matplotlib simplifies long lines to the pixels they cover.)
MAX_POINTS = 4000


@dataclasses.dataclass(frozen=True)
class Curves:
    """One run's metrics. tokens: float64 [n] increasing; steps: int64 [n] (the source's own step
    numbers, quoted in messages); values: {metric: float64 [n]} (NaN = not logged there)."""

    name: str
    tokens: np.ndarray
    steps: np.ndarray
    values: Mapping[str, np.ndarray]
    nonfinite: Mapping[str, list[tuple[int, float]]] = dataclasses.field(default_factory=dict)
    logged_as: Mapping[str, str] = dataclasses.field(default_factory=dict)  # a key: its logged name (clean_view)

    @property
    def labels(self) -> list[str]:
        """The held-out sets this side logged (heldout/<set>/loss), in first-logged order."""
        return [label for m in self.values if (label := set_label(m)) is not None]

    def series(self, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(tokens [k], steps [k], values [k]) of the rows that carry `metric`."""
        v = self.values.get(metric)
        if v is None:
            return np.zeros(0), np.zeros(0, np.int64), np.zeros(0)
        ok = np.isfinite(v)
        return self.tokens[ok], self.steps[ok], v[ok]


def set_key(label: str, what: str = "loss") -> str:
    return f"{SET_PREFIX}{label}/{what}"


def set_label(metric: str) -> str | None:
    """'heldout/<set>/loss' → '<set>' (None for any other metric)."""
    if metric.startswith(SET_PREFIX) and metric.endswith("/loss") and len(metric) > len(SET_PREFIX) + 5:
        return metric[len(SET_PREFIX) : -len("/loss")]
    return None


def make_curves(
    name: str, rows: list[dict], tokens_per_step: float | None, step_offset: int, tokens_key: str | None = None
) -> Curves:
    """Rows {"step": s, metric: value, ...} → Curves.

    tokens = the row's `tokens_key` value when given and present, else (step + step_offset) ×
    tokens_per_step. olmax logs 0-based steps (row s is the update on batch s: offset 1);
    OLMo-core/W&B log the number of updates done (offset 0). Rows are sorted by step; rows of one
    step are merged (a training row and an evaluation row), and a metric a step logged twice with
    two values is refused (ValueError naming the step and the metric), never one of them kept.
    """
    by_step: dict[int, dict] = {}
    for r in rows:
        step = int(r["step"])
        before = by_step.setdefault(step, {})
        for key, value in r.items():
            old = before.get(key)
            if old is not None and value is not None and not _same(old, value):
                raise ValueError(f"{name}: step {step} logged {key} twice, {old!r} and {value!r}")
        before.update(r)
    steps = np.array(sorted(by_step), dtype=np.int64)
    ordered = [by_step[s] for s in steps.tolist()]
    if tokens_key is not None and all(r.get(tokens_key) is not None for r in ordered):
        tokens = np.array([float(r[tokens_key]) for r in ordered])
    elif tokens_per_step is not None:
        tokens = (steps + step_offset).astype(np.float64) * float(tokens_per_step)
    else:
        raise ValueError(f"{name}: no tokens per step (give --tokens_per_step or map a tokens column)")
    if len(tokens) > 1 and not (np.diff(tokens) > 0).all():
        raise ValueError(f"{name}: tokens seen do not increase with the step")
    values, nonfinite = {}, {}
    per_set = dict.fromkeys(
        k
        for r in ordered
        for k in r
        if set_label(k) is not None
        or k == POOLED_TOKENS
        or (k.startswith(SET_PREFIX) and k.endswith("/tokens"))
        or is_downstream_key(k)
    )
    for m in (*METRICS, *per_set):
        col = np.array([np.nan if r.get(m) is None else float(r[m]) for r in ordered], dtype=np.float64)
        logged = np.array([r.get(m) is not None for r in ordered])
        bad = np.flatnonzero(logged & ~np.isfinite(col))
        if len(bad):  # logged, but NaN or ±Infinity: kept apart (never interpolated across)
            nonfinite[m] = [(int(steps[i]), float(col[i])) for i in bad]
            col[bad] = np.nan
        values[m] = col
    return Curves(name, tokens, steps, values, nonfinite)


def _same(a: object, b: object) -> bool:
    """Equal values (two NaNs are the same logged value)."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return bool(a == b)


def is_downstream_key(key: str) -> bool:
    """An OLMo-core downstream metric key ('eval/downstream/<label> (<metric label>)'), or its
    clean-subset twin (the key + ' clean', downstream.clean_from's: read for --downstream_clean)."""
    key = key.removesuffix(ds.CLEAN_SUFFIX)
    return key.startswith(DOWNSTREAM_PREFIX) and key.endswith(")") and " (" in key


def weighted_sets(curves: Curves, labels: list[str], weights: Mapping[str, float]) -> np.ndarray:
    """The sets' token-weighted mean at each row that logged all of `labels` (NaN elsewhere):
    float64 [n]. weights: {set: target tokens} (the run's: both sides are weighed alike)."""
    v = np.stack([curves.values[set_key(x)] for x in labels])
    w = np.array([weights[x] for x in labels], dtype=np.float64)[:, None]
    return (v * w).sum(axis=0) / w.sum()


def set_weights(curves: Curves, labels: list[str]) -> dict[str, float]:
    """{set: its target tokens at the side's last evaluation} (1.0 each when not logged)."""
    out = {}
    for x in labels:
        t = curves.values.get(set_key(x, "tokens"))
        t = t[np.isfinite(t)] if t is not None else np.zeros(0)
        out[x] = float(t[-1]) if len(t) else 1.0
    return out


def smooth(values: np.ndarray, window: int = DEFAULT_SMOOTH) -> np.ndarray:
    """Debiased exponential moving average, as W&B and TensorBoard smooth (float64 [n] → [n]).

    Weight 1 − α per point back with α = 2 / (window + 1) (the EMA whose mean lag equals a
    `window`-point mean's, pandas' ``span``), divided by the weights' sum so far: the first points are
    not pulled toward 0 the way a plain EMA started at 0 is (pandas ``ewm(span=window, adjust=True)``).
    Hand-written: numpy has no recursive filter, and the declared dependencies carry none.
    """
    x = np.asarray(values, np.float64)
    if window <= 1 or len(x) == 0:
        return x
    beta = 1.0 - 2.0 / (window + 1)
    out = np.empty_like(x)
    num = den = 0.0
    for i, v in enumerate(x.tolist()):
        num, den = beta * num + v, beta * den + 1.0
        out[i] = num / den
    return out


@dataclasses.dataclass(frozen=True)
class Aligned:
    """One metric on the reference's grid. tokens/steps (the reference's) [k], run [k], ref [k],
    diff = run − ref [k]. Empty when the two token ranges do not overlap."""

    metric: str
    tokens: np.ndarray
    ref_steps: np.ndarray
    run: np.ndarray
    ref: np.ndarray
    ref_all: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))  # tokens of every reference point
    starts: tuple[int, int] | None = None  # the first step each side's metrics logged (run, reference)
    run_all: np.ndarray | None = None  # tokens of every run point (None: not known, a macro's)

    @property
    def diff(self) -> np.ndarray:
        return self.run - self.ref

    def thinned(self, max_points: int = MAX_POINTS) -> Aligned:
        """The same metric on `envelope(diff)`'s points (itself when short enough)."""
        keep = envelope(self.diff, max_points)
        if len(keep) == len(self.tokens):
            return self
        return Aligned(
            self.metric,
            self.tokens[keep],
            self.ref_steps[keep],
            self.run[keep],
            self.ref[keep],
            self.ref_all,
            self.starts,
        )


def envelope(values: np.ndarray, max_points: int = MAX_POINTS) -> np.ndarray:
    """Pure: sorted indices of at most `max_points` (≥ 4) of `values` [n] that keep its shape: all of
    them when n ≤ max_points, else the first, the last, and the minimum and maximum of each of
    (max_points − 2) // 2 equal buckets, so that spikes and dips survive (a stride would drop them).
    NaNs are never chosen as a bucket's extreme unless the bucket holds nothing else."""
    n = len(values)
    if n <= max_points:
        return np.arange(n)
    buckets = (max_points - 2) // 2
    edges = np.linspace(0, n, buckets + 1).astype(np.int64)
    v = np.asarray(values, dtype=np.float64)
    lo, hi = np.where(np.isnan(v), np.inf, v), np.where(np.isnan(v), -np.inf, v)
    keep = [0, n - 1]
    for a, b in zip(edges[:-1].tolist(), edges[1:].tolist()):
        if b > a:
            keep += [a + int(np.argmin(lo[a:b])), a + int(np.argmax(hi[a:b]))]
    return np.unique(np.array(keep, dtype=np.int64))


def align(run: Curves, ref: Curves, metric: str, smoothing: int = 0) -> Aligned:
    """`metric` of both runs on the reference's points inside the run's token range.

    The run's value at a reference point is its own value when it logged that exact token count,
    else the linear interpolation of its two neighbours (np.interp). smoothing > 1 first applies
    `smooth` to both sides over their points from the later of the two first points on: a side
    whose metrics start later (a run whose metrics.jsonl begins mid-run) restarts its average
    there, so the other's restarts with it (never smoothed across the missing start: identical
    data give a zero difference).
    """
    rt, _, rv = run.series(metric)
    ft, fs, fv = ref.series(metric)
    starts = (int(run.steps[0]), int(ref.steps[0])) if len(run.steps) and len(ref.steps) else None
    if len(rt) == 0 or len(ft) == 0:
        return Aligned(metric, np.zeros(0), np.zeros(0, np.int64), np.zeros(0), np.zeros(0), ft, starts)
    ref_all, run_all = ft, rt
    if smoothing > 1:
        lo = max(rt[0], ft[0])
        r_in, f_in = rt >= lo, ft >= lo
        rt, rv, ft, fs, fv = rt[r_in], smooth(rv[r_in], smoothing), ft[f_in], fs[f_in], smooth(fv[f_in], smoothing)
        if len(rt) == 0 or len(ft) == 0:
            return Aligned(metric, np.zeros(0), np.zeros(0, np.int64), np.zeros(0), np.zeros(0), ref_all, starts)
    inside = (ft >= rt[0]) & (ft <= rt[-1])
    at = ft[inside]
    return Aligned(metric, at, fs[inside], np.interp(at, rt, rv), fv[inside], ref_all, starts, run_all)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """passed: True/False, None when nothing could be compared (exit 2). first_failure: the
    first reference point past `after_tokens` where |held-out diff| > tolerance. coverage: the
    reference's held-out points from `after_tokens` on ("reference") and how many of them lie in
    the run's range ("compared", "share"). nonfinite: the run's first NaN/Infinity {metric, step,
    value} (a FAIL)."""

    passed: bool | None
    summary: str
    tolerance: float
    after_tokens: float
    compared_points: int
    max_abs_heldout_diff: float | None
    first_failure: dict | None
    train_loss_gap: dict | None
    coverage: dict | None = None
    nonfinite: dict | None = None
    holes: list | None = None  # the rule's holes (compare.holes): the run's non-finite first, then the unjudged

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def _gap(a: Aligned) -> dict | None:
    if len(a.tokens) == 0:
        return None
    d = a.diff
    return {
        "final": float(d[-1]),
        "mean": float(d.mean()),
        "min": float(d.min()),
        "max": float(d.max()),
        "at_tokens": float(a.tokens[-1]),
    }


def gap_text(gap: dict | None) -> str:
    """The training-loss part of a verdict's summary (reported, not judged)."""
    return (
        f"; training loss (smoothed) run − reference: final {gap['final']:+.4f}, mean {gap['mean']:+.4f}"
        if gap
        else "; no training loss to compare"
    )


def not_comparable(v: Verdict, why: str) -> Verdict:
    """`v` made UNKNOWN: its held-out points measure different evaluations (`why`); its figures
    and the training-loss gap are kept. A run that logged a non-finite loss still fails: that is
    the run's own fact, whatever the reference evaluated (`why` is added to its summary)."""
    if v.nonfinite is not None:
        return dataclasses.replace(v, summary=f"{v.summary}; held-out losses not comparable: {why}")
    return dataclasses.replace(
        v,
        passed=None,
        first_failure=None,
        summary=f"held-out losses not comparable: {why}" + gap_text(v.train_loss_gap),
    )


def _coverage_text(
    t: np.ndarray, ref_all: np.ndarray, after_tokens: float, starts: tuple[int, int] | None, what: str, share: str
) -> str:
    """Why the run covers only part of the reference's points: a missing start (named: the sides'
    first logged steps), a missing end, or both."""
    ref = ref_all[ref_all >= after_tokens]
    before, beyond = int((ref < t[0]).sum()), int((ref > t[-1]).sum())
    parts = []
    if before:
        first = f"the run's metrics start at step {starts[0]}, the reference's at step {starts[1]}: " if starts else ""
        parts.append(f"{first}{before} reference {what} point(s) before the run's first ({t[0]:,.0f} tokens)")
    if beyond:
        parts.append(f"{beyond} after the run's last ({t[-1]:,.0f} tokens)")
    return (
        f"the run covers only {share}, not compared: {', '.join(parts)}. A run covering part of the "
        "reference is not judged on that part unless --allow_prefix"
    )


def judge(
    heldout: Aligned,
    train_smoothed: Aligned | None,
    tolerance: float,
    after_tokens: float,
    allow_prefix: bool = False,
    *,
    gate: holes_lib.Gate,
    what: str = "held-out loss",
    unit: str = " nats",
) -> Verdict:
    """Held-out loss within ±tolerance (nats) of the reference at every compared point with
    tokens ≥ after_tokens → pass; the (smoothed) training-loss gap is reported, not judged.

    gate: `holes.check`'s ruling on every quantity this verdict reads (required: no verdict reads a
    value the rule has not seen). The run's non-finite value fails; the other holes count in the
    denominator and make a verdict that would pass UNKNOWN (a compared point outside the tolerance
    still fails). Fails too when the run covers only part of the reference's points from
    after_tokens on (a run stopped early, or one whose metrics start later: named) unless
    `allow_prefix`: the share is reported. train_smoothed None: no training-loss gap in the summary
    (the downstream verdict); unit: the tolerance's, in the summary ("" for accuracies)."""
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise ValueError(f"tolerance must be a finite number ≥ 0, got {tolerance}")
    gap = _gap(train_smoothed) if train_smoothed is not None else None
    across = (heldout.tokens >= after_tokens) & _across(heldout, gate)
    keep = (heldout.tokens >= after_tokens) & ~across
    t, d = heldout.tokens[keep], heldout.diff[keep]
    finite_ref = heldout.ref_all[heldout.ref_all >= after_tokens]
    n_ref = len(np.union1d(finite_ref, [x for x in gate.reference_tokens if x >= after_tokens]))
    coverage = {"compared": len(t), "reference": n_ref, "share": len(t) / n_ref if n_ref else None}
    train_text = gap_text(gap) if train_smoothed is not None else ""
    worst = float(np.abs(d).max()) if len(t) else None
    holes = gate.to_json()

    def verdict(passed: bool | None, text: str, first: dict | None = None) -> Verdict:
        nonfinite = None
        if gate.fail is not None:
            nonfinite = {"metric": gate.fail.metric, "step": gate.fail.step, "value": gate.fail.value}
        return Verdict(
            passed, text + train_text, tolerance, after_tokens, len(t), worst, first, gap, coverage, nonfinite, holes
        )

    unjudged = gate.text()
    if gate.fail is not None:
        f = gate.fail
        return verdict(
            False, f"the run logged {f.metric} = {holes_lib.value_text(f.value)} at step {f.step}: a diverged run fails"
        )
    if len(t) == 0:
        return verdict(None, f"no {what} points to compare after {after_tokens:,.0f} tokens" + _also(unjudged))
    assert n_ref, "compared points are reference points"
    share = f"{len(t)} of the reference's {n_ref} {what} points ({100 * len(t) / n_ref:.0f}%)"
    if len(t) + int(across.sum()) < len(finite_ref) and not allow_prefix:  # the run's own holes are no prefix
        return verdict(
            False, _coverage_text(t, finite_ref, after_tokens, heldout.starts, what, share) + _also(unjudged)
        )
    first, outside = _first_outside(heldout, keep, tolerance)
    if first is not None:
        return verdict(
            False,
            f"{what} leaves ±{tolerance:g}{unit} of the reference at reference "
            f"step {first['reference_step']} ({first['tokens']:,.0f} tokens): run {first['run']:.4f} vs "
            f"reference {first['reference']:.4f} (diff {first['diff']:+.4f}); {outside} of {len(t)} "
            f"points outside" + _also(unjudged),
            first,
        )
    within = (
        f"{what} within ±{tolerance:g}{unit} of the reference at all {len(t)} compared of the reference's "
        f"{n_ref} {what} points, from {t[0]:,.0f} to {t[-1]:,.0f} tokens (max |diff| {worst:.4g})"
    )
    if unjudged:
        return verdict(None, f"UNKNOWN: {unjudged}; {within}")
    return verdict(
        True,
        f"{what} within ±{tolerance:g}{unit} of the reference at all {share}, from "
        f"{t[0]:,.0f} to {t[-1]:,.0f} tokens (max |diff| {worst:.4g})",
    )


def _first_outside(heldout: Aligned, keep: np.ndarray, tolerance: float) -> tuple[dict | None, int]:
    """(the first compared point (`keep`) whose |diff| > tolerance: tokens, reference_step, diff,
    run, reference; None when none is) and how many compared points are outside."""
    d = heldout.diff[keep]
    bad = np.flatnonzero(np.abs(d) > tolerance)
    if not len(bad):
        return None, 0
    i = int(bad[0])
    first = {
        "tokens": float(heldout.tokens[keep][i]),
        "reference_step": int(heldout.ref_steps[keep][i]),
        "diff": float(d[i]),
        "run": float(heldout.run[keep][i]),
        "reference": float(heldout.ref[keep][i]),
    }
    return first, len(bad)


def _across(a: Aligned, gate: holes_lib.Gate) -> np.ndarray:
    """bool [k]: the compared points whose run value is interpolated across a run's hole (between
    the run's finite points on either side of it): not compared, never a difference."""
    out = np.zeros(len(a.tokens), dtype=bool)
    if a.run_all is None or not len(a.run_all):
        return out
    for h in gate.unjudged:
        if h.side == "run":
            lo, hi = a.run_all[a.run_all < h.tokens], a.run_all[a.run_all > h.tokens]
            out |= (a.tokens > (lo[-1] if len(lo) else -np.inf)) & (a.tokens < (hi[0] if len(hi) else np.inf))
    return out


def _also(unjudged: str) -> str:
    return f"; also {unjudged}" if unjudged else ""
