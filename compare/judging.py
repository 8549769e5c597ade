"""compare's judging stage: the run and its reference read (compare.sides), aligned by tokens
(compare.curves) and judged — held-out loss overall and per set (within the rule of
compare.holes, UNKNOWN where the evaluations differ: compare.evaluation), downstream
(compare.downstream, the clean subsets with --downstream_clean: compare.clean) — → `Judged`:
the verdicts and compare.json's content. Nothing is drawn here (compare.cli.draw draws the page
from that value) and nothing is written."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from contract import RunDir

from . import clean as clean_lib
from . import curves as curves_lib
from . import downstream as downstream_lib
from . import evaluation as evaluation_lib
from . import holes as holes_lib
from .data import compare_data
from .sides import Side, load_run, load_side
from .table import DEFAULT_SET_TEMPLATE

DEFAULT_TOLERANCE = 0.01  # nats, absolute, on held-out cross-entropy
TABLE_STEP_OFFSET = 0  # OLMo-core/W&B `_step` counts updates done: tokens = step × tokens/step
BADGE = {True: "PASS", False: "FAIL", None: "UNKNOWN"}  # a verdict's badge (the page and the command line)
# what the overall held-out verdict reads besides the sets (compare.holes: each through the rule)
HELDOUT_QUANTITIES = ("loss", "heldout_loss", curves_lib.POOLED_TOKENS)


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """tolerance: nats; after_tokens: judge held-out points from here on; smoothing: points in the
    training-loss mean; columns: the table mapping; tokens_per_step / step_offset: the table's
    (or a run's, overriding what its record says); run_tokens_per_step: the run's override."""

    run: RunDir  # as the command line resolved it (contract.cli.run_dir)
    reference: str  # a run directory (resolved by sides.load_side) or a metrics table
    out: str
    tolerance: float = DEFAULT_TOLERANCE
    after_tokens: float = 0.0
    smoothing: int = curves_lib.DEFAULT_SMOOTH
    columns: dict[str, str] = dataclasses.field(default_factory=dict)
    tokens_per_step: float | None = None
    step_offset: int = TABLE_STEP_OFFSET
    run_tokens_per_step: float | None = None
    allow_prefix: bool = False
    set_template: str = DEFAULT_SET_TEMPLATE
    downstream_tolerance: float = downstream_lib.DEFAULT_TOLERANCE
    downstream_task_tolerance: float | None = None  # None: downstream.task_bound
    downstream_min_share: float = downstream_lib.DEFAULT_MIN_SHARE
    downstream_clean: bool = False  # judge the tasks' clean-subset metrics (keys with " clean")


def _hosts_fn(side: Side) -> Callable[[int], int] | None:
    return side.record.host_count_at if side.record is not None else None


def _with_overall(side: Side, labels: list[str], weights: dict[str, float]) -> Side:
    """The side with heldout_loss replaced by the sets' weighted mean (see module doc)."""
    values = dict(side.curves.values)
    values["heldout_loss"] = curves_lib.weighted_sets(side.curves, labels, weights)
    return dataclasses.replace(side, curves=dataclasses.replace(side.curves, values=values))


def combined(overall: curves_lib.Verdict, sets: dict[str, curves_lib.Verdict]) -> bool | None:
    """The run's verdict (pure): False when any judged curve fails, else None when any is UNKNOWN
    (a set that could not be judged is never passed by the others), else True."""
    verdicts = [overall.passed, *(v.passed for v in sets.values())]
    if False in verdicts:
        return False
    return None if None in verdicts else True


def with_downstream(passed: bool | None, downstream: bool | None) -> bool | None:
    """The run's verdict with its downstream verdict (pure; only when the run logged downstream
    metrics): a FAIL of either fails; else an UNKNOWN of either (downstream tasks the reference
    cannot judge) is UNKNOWN; else PASS."""
    if passed is False or downstream is False:
        return False
    return None if passed is None or downstream is None else True


def heldout_gates(
    run: curves_lib.Curves, ref: curves_lib.Curves, labels: list[str], after_tokens: float
) -> tuple[holes_lib.Gate, dict[str, holes_lib.Gate]]:
    """The rule's ruling (compare.holes.check) on every quantity the held-out verdicts read, on the
    sides' curves as logged: the overall's (training loss, the pooled loss and its tokens, every set
    the run logged and its tokens; the reference's compared sets) and each compared set's."""
    sets = [q for x in run.labels for q in (curves_lib.set_key(x), curves_lib.set_key(x, "tokens"))]
    ref_sets = [q for x in labels for q in (curves_lib.set_key(x), curves_lib.set_key(x, "tokens"))]
    overall = holes_lib.check(run, ref, [*HELDOUT_QUANTITIES, *sets], [*HELDOUT_QUANTITIES, *ref_sets], after_tokens)
    per_set = {
        x: holes_lib.check(run, ref, [curves_lib.set_key(x), curves_lib.set_key(x, "tokens")], None, after_tokens)
        for x in labels
    }
    return overall, per_set


def _heldout_verdicts(
    cfg: CompareConfig,
    held: curves_lib.Aligned,
    train: curves_lib.Aligned,
    set_aligned: dict[str, curves_lib.Aligned],
    gates: tuple[holes_lib.Gate, dict[str, holes_lib.Gate]],
    evaluation: evaluation_lib.Check,
) -> tuple[curves_lib.Verdict, dict[str, curves_lib.Verdict]]:
    """The overall held-out verdict and each set's (UNKNOWN where the evaluations differ)."""
    judged: dict[str, Any] = dict(tolerance=cfg.tolerance, after_tokens=cfg.after_tokens, allow_prefix=cfg.allow_prefix)
    set_verdicts = {
        x: curves_lib.judge(a, train, **judged, what=f"{x} loss", gate=gates[1][x]) for x, a in set_aligned.items()
    }
    overall = curves_lib.judge(held, train, **judged, gate=gates[0])
    if evaluation.problems:  # the held-out points measure different evaluations: no verdict on them
        overall = curves_lib.not_comparable(overall, "; ".join(evaluation.problems))
        set_verdicts = {
            x: curves_lib.not_comparable(
                v, "; ".join(evaluation.of_set(x)) or "another set's evaluation differs (see the overall verdict)"
            )
            for x, v in set_verdicts.items()
        }
    return overall, set_verdicts


def _downstream(
    cfg: CompareConfig, run: curves_lib.Curves, ref: curves_lib.Curves
) -> tuple[dict[str, Any] | None, curves_lib.Curves, curves_lib.Curves]:
    """The downstream verdict (compare.downstream), of the clean subsets with --downstream_clean."""
    clean = clean_lib.clean_views(run, ref) if cfg.downstream_clean else None
    if clean is not None:  # each task's clean-subset metrics in place of its full ones
        run, ref = clean.run, clean.reference
    ds, ds_run, ds_ref = downstream_lib.verdict(
        run,
        ref,
        cfg.downstream_tolerance,
        cfg.after_tokens,
        cfg.allow_prefix,
        cfg.downstream_task_tolerance,
        cfg.downstream_min_share,
    )
    if ds is not None and clean is not None:
        ds = clean_lib.with_clean(ds, clean)
    return ds, ds_run, ds_ref


def _summary(
    overall: curves_lib.Verdict,
    set_verdicts: dict[str, curves_lib.Verdict],
    labels: list[str],
    missing: list[str],
    evaluation: evaluation_lib.Check,
    ds: dict[str, Any] | None,
) -> str:
    failing = [x for x, v in set_verdicts.items() if v.passed is False]
    unknown = [x for x, v in set_verdicts.items() if v.passed is None and overall.passed is not None]
    summary = (
        overall.summary
        + (f"; sets failing: {', '.join(failing)}" if failing else "")
        + (f"; sets UNKNOWN: {', '.join(unknown)}" if unknown else "")
        + (f"; {len(labels)} sets compared" if labels else "")
    )
    if missing:
        summary += f"; not in the reference (not compared): {', '.join(missing)}"
    summary += "".join(f"; {note}" for note in evaluation.notes)
    if ds is not None:
        summary += f"; downstream: {BADGE[ds['passed']]} (its own verdict below)"
        if ds.get("clean"):
            summary += f" ({ds['clean']['note']})"
    return summary


@dataclasses.dataclass(frozen=True)
class Judged:
    """The judging stage's value (`judge`): `result` is compare.json's content (the verdicts, the
    aligned points, the settings); the rest is what the drawing stage (`draw`) draws from: the
    sides' curves as judged (the overall held-out loss replaced by the compared sets' weighted
    mean), the aligned curves (held, train, train_raw, grad, lr) and each set's, the verdicts, and
    the downstream verdict with the curves it judged (the clean subsets' with --downstream_clean)."""

    result: dict[str, Any]
    run: curves_lib.Curves
    reference: curves_lib.Curves
    aligned: dict[str, curves_lib.Aligned]
    set_aligned: dict[str, curves_lib.Aligned]
    overall: curves_lib.Verdict
    set_verdicts: dict[str, curves_lib.Verdict]
    downstream: dict[str, Any] | None
    downstream_run: curves_lib.Curves
    downstream_reference: curves_lib.Curves

    @property
    def passed(self) -> bool | None:
        """The run's verdict (True PASS, False FAIL, None UNKNOWN)."""
        passed: bool | None = self.result["verdict"]["passed"]
        return passed


def _sides(cfg: CompareConfig) -> tuple[Side, Side]:
    """The run and its reference, read (the reference's table columns chosen for the run's sets
    and downstream metrics)."""
    run = load_run(cfg.run, "run", cfg.run_tokens_per_step)
    ref = load_side(
        cfg.reference,
        "reference",
        cfg.columns,
        cfg.tokens_per_step,
        cfg.step_offset,
        run.tokens_per_step,
        run.curves.labels,
        cfg.set_template,
        downstream_lib.wanted_keys(run.curves),
    )
    return run, ref


def _evaluation(run: Side, ref: Side, labels: list[str]) -> evaluation_lib.Check:
    """Whether the two sides' held-out losses measure the same evaluation (compare.evaluation)."""
    same_history = (
        run.eval_history is not None
        and run.eval_history == ref.eval_history
        and run.tokens_per_step == ref.tokens_per_step
    )
    return evaluation_lib.check(
        run.curves, ref.curves, labels, run.eval_settings, ref.eval_settings, ref.run_dir is None, same_history
    )


def _aligned(
    run: curves_lib.Curves, ref: curves_lib.Curves, labels: list[str], smoothing: int
) -> tuple[dict[str, curves_lib.Aligned], dict[str, curves_lib.Aligned]]:
    """Every compared metric on the reference's points: held, train (smoothed), train_raw, grad, lr;
    and each compared set's held-out loss."""
    aligned = {
        "held": curves_lib.align(run, ref, "heldout_loss"),
        "train": curves_lib.align(run, ref, "loss", smoothing),
        "train_raw": curves_lib.align(run, ref, "loss"),
        "grad": curves_lib.align(run, ref, "grad_norm"),
        "lr": curves_lib.align(run, ref, "lr"),
    }
    return aligned, {x: curves_lib.align(run, ref, curves_lib.set_key(x)) for x in labels}


def _aligned_json(aligned: dict[str, curves_lib.Aligned], set_aligned: dict[str, curves_lib.Aligned]) -> dict:
    """compare.json's "aligned": every compared metric on the reference's points: tokens,
    reference_step, run, reference, diff (= run − reference) [k each; at most curves.MAX_POINTS,
    chosen by curves.envelope when longer], points (all of them) and max_abs_diff over all (None
    when nothing overlaps)."""
    order = [
        (aligned["held"], ""),
        (aligned["train_raw"], ""),
        (aligned["train"], "_smoothed"),
        (aligned["grad"], ""),
        (aligned["lr"], ""),
        *((a, "") for a in set_aligned.values()),
    ]
    return {
        a.metric + suffix: {
            **_stored(a.thinned()),
            "points": len(a.tokens),
            "max_abs_diff": float(abs(a.diff).max()) if len(a.tokens) else None,
        }
        for a, suffix in order
    }


def _settings_json(cfg: CompareConfig) -> dict[str, Any]:
    """compare.json's "settings": the judging settings the verdicts were made with."""
    return {
        "tolerance": cfg.tolerance,
        "after_tokens": cfg.after_tokens,
        "smoothing": cfg.smoothing,
        "allow_prefix": cfg.allow_prefix,
        "downstream_tolerance": cfg.downstream_tolerance,
        "downstream_task_tolerance": cfg.downstream_task_tolerance,
        "downstream_min_share": cfg.downstream_min_share,
        "downstream_clean": cfg.downstream_clean,
    }


def _sides_json(cfg: CompareConfig, run: Side, ref: Side, evaluation: evaluation_lib.Check) -> dict[str, Any]:
    """compare.json's "evaluation" (whether the two evaluations could be compared, compare.evaluation,
    and what each recorded), "run", "reference" and "data" (compare.data; None unless both sides are
    run directories)."""
    data = (
        compare_data(run.run_dir, ref.run_dir, _hosts_fn(run), _hosts_fn(ref)) if run.run_dir and ref.run_dir else None
    )
    return {
        "evaluation": {
            **evaluation.to_json(),
            "run_settings": run.eval_settings,
            "reference_settings": ref.eval_settings,
        },
        "run": {"path": str(cfg.run), "described": run.described, "tokens_per_step": run.tokens_per_step},
        "reference": {
            "path": str(ref.run_dir or cfg.reference),
            "described": ref.described,
            "tokens_per_step": ref.tokens_per_step,
        },
        "data": data.to_json() if data else None,
    }


def judge(cfg: CompareConfig) -> Judged:
    """The judging stage: the sides read, aligned by tokens and judged (held-out overall and per set,
    downstream); → the verdicts and compare.json's content, nothing drawn. Raises TableError on
    unusable input."""
    run, ref = _sides(cfg)
    labels = [x for x in run.curves.labels if x in ref.curves.labels]
    evaluation = _evaluation(run, ref, labels)
    gates = heldout_gates(run.curves, ref.curves, labels, cfg.after_tokens)  # on the values as logged
    weights: dict[str, float] = {}
    if labels:  # overall = the compared sets, weighted alike on both sides
        weights = curves_lib.set_weights(run.curves, labels)
        run, ref = _with_overall(run, labels, weights), _with_overall(ref, labels, weights)
    aligned, set_aligned = _aligned(run.curves, ref.curves, labels, cfg.smoothing)
    overall, set_verdicts = _heldout_verdicts(cfg, aligned["held"], aligned["train"], set_aligned, gates, evaluation)
    passed = combined(overall, set_verdicts)
    ds, ds_run, ds_ref = _downstream(cfg, run.curves, ref.curves)
    if ds is not None:
        passed = with_downstream(passed, ds["passed"])
    missing = [x for x in run.curves.labels if x not in labels]
    result = {
        "verdict": {
            **overall.to_json(),
            "passed": passed,
            "summary": _summary(overall, set_verdicts, labels, missing, evaluation, ds),
            "overall_passed": overall.passed,
        },
        "sets": {x: {**v.to_json(), "weight": weights[x]} for x, v in set_verdicts.items()},
        "sets_not_compared": missing,
        # the downstream verdict (compare.downstream); None when the run logged no downstream metric
        "downstream": ds,
        **_sides_json(cfg, run, ref, evaluation),
        "aligned": _aligned_json(aligned, set_aligned),
        "settings": _settings_json(cfg),
    }
    return Judged(result, run.curves, ref.curves, aligned, set_aligned, overall, set_verdicts, ds, ds_run, ds_ref)


def _stored(a: curves_lib.Aligned) -> dict:
    return {"tokens": a.tokens, "reference_step": a.ref_steps, "run": a.run, "reference": a.ref, "diff": a.diff}
