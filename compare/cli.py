"""`python -m compare RUN REFERENCE --out DIR` — a run against its reference, by tokens seen.

RUN: an olmax run directory. REFERENCE: another run directory, or a CSV/JSONL metrics table
exported from another trainer (`--columns KEY=COLUMN,...`, defaults fit an OLMo-core W&B export;
tokens from a tokens column, else step × `--tokens_per_step`, else step × the run's tokens per step).
Held-out loss is judged per set (each `heldout/<set>/loss` the run logged, against the reference's
set of that name: `--columns heldout/<set>=COLUMN`, else `--set_column` with the set's name) and
overall (the compared sets' mean weighted by the run's target tokens per set; `heldout_loss` for
runs that log no sets, against a side that logs none either). Held-out losses that do not measure the
same evaluation (no set in common, other recorded settings, other tokens counted: `evaluation`) get
no verdict (UNKNOWN, naming why). A run that logged downstream metrics (OLMo-core's keys) also gets
the downstream verdict (compare.downstream: macro averages within --downstream_tolerance,
per-task differences shown, UNKNOWN for a task the reference lacks); the run's verdict is then FAIL
if either fails, else UNKNOWN if either is. Writes DIR/compare.html and DIR/compare.json. Exit 0: every judged curve
within --tolerance of the reference at every reference point from --after_tokens on; 1: one is
not, the run logged a NaN/Infinity loss, or it covers only part of the reference (see
--allow_prefix); 2: unusable input or arguments (one `error:` line), no held-out point to compare,
held-out losses that cannot be compared, or a judged value the reference logged as NaN/±Infinity or
either side left out of an evaluation (compare.holes: counted, named, never PASS); 3: stopped (one `error:` line: an output could not be
written; --out is checked before any work, both files are written atomically).
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from typing import Any

from contract import COMPARE_REPORT, STOPPED_BY_VERDICT_COMMAND, Refused, RunDir, check_out_dir
from contract.cli import Parser, integer, number, run_dir, run_main, share
from contract.provenance import run_facts

from . import clean as clean_lib
from . import curves as curves_lib
from . import downstream as downstream_lib
from . import evaluation as evaluation_lib
from . import holes as holes_lib
from .data import compare_data
from .figures import BADGE, figures
from .sides import Side, load_run, load_side
from .table import DEFAULT_SET_TEMPLATE, parse_columns

DEFAULT_TOLERANCE = 0.01  # nats, absolute, on held-out cross-entropy
TABLE_STEP_OFFSET = 0  # OLMo-core/W&B `_step` counts updates done: tokens = step × tokens/step
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


def _hosts_fn(side: Side):
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


def draw(cfg: CompareConfig, judged: Judged) -> list[Any]:
    """The drawing stage: the page's panels (report.Panel, compare.figures) from the judging stage's
    value; it judges nothing."""
    return figures(
        cfg,
        judged.run,
        judged.reference,
        judged.aligned,
        judged.set_aligned,
        judged.overall,
        judged.set_verdicts,
        judged.downstream,
        judged.downstream_run,
        judged.downstream_reference,
    )


def _stored(a: curves_lib.Aligned) -> dict:
    return {"tokens": a.tokens, "reference_step": a.ref_steps, "run": a.run, "reference": a.ref, "diff": a.diff}


def _template(text: str) -> str:
    if "{label}" not in text:
        raise argparse.ArgumentTypeError(f"--set_column must contain {{label}}, got {text!r}")
    return text


def parse_args(argv: list[str] | None) -> CompareConfig:
    """The command line (module doc) → CompareConfig: the sides, --out and --tolerance, then the
    downstream tolerances, the judging and the reference table's options (a named step each; --help
    lists them in that order), then --downstream_clean."""
    p = Parser("python -m compare", __doc__.splitlines()[0])
    p.add_argument("run", type=run_dir, help="olmax run directory")
    p.add_argument("reference", help="olmax run directory, or a .csv/.jsonl/.json metrics table")
    p.add_argument("--out", required=True, help="folder for compare.html and compare.json")
    p.add_argument(
        "--tolerance",
        type=number(),
        default=DEFAULT_TOLERANCE,
        help="held-out loss, absolute nats (finite, ≥ 0)",
    )
    _downstream_options(p)
    _judging_options(p)
    _table_options(p)
    p.add_argument(
        "--downstream_clean",
        action="store_true",
        help="judge each task's clean-subset metrics (logged with downstream.clean_from: keys ending ' clean') "
        "in place of its full ones, on whichever side logged them, said which (neither side: UNKNOWN; "
        "default: the ' clean' keys are ignored)",
    )
    a = p.parse_args(argv)
    return CompareConfig(
        a.run,
        a.reference,
        a.out,
        a.tolerance,
        a.after_tokens,
        a.smooth,
        parse_columns(a.columns),
        a.tokens_per_step,
        a.step_offset,
        a.run_tokens_per_step,
        a.allow_prefix,
        a.set_column,
        a.downstream_tolerance,
        a.downstream_task_tolerance,
        a.downstream_min_share,
        a.downstream_clean,
    )


def _judging_options(p: Parser) -> None:
    """How the held-out and training curves are judged: from where, on how much, how smoothed."""
    p.add_argument(
        "--after_tokens",
        type=number(),
        default=0.0,
        help="judge held-out and downstream points from this many tokens on",
    )
    p.add_argument(
        "--allow_prefix",
        action="store_true",
        help="judge a run that covers only part of the reference on that part (default: it fails)",
    )
    p.add_argument(
        "--smooth",
        type=integer(1),
        default=curves_lib.DEFAULT_SMOOTH,
        help="span in points of the debiased EMA that smooths the training loss (W&B and TensorBoard's "
        f"smoothing; default {curves_lib.DEFAULT_SMOOTH}; 1: none)",
    )


def _table_options(p: Parser) -> None:
    """How a reference table (or the run) is read: its columns, its tokens per step."""
    p.add_argument(
        "--columns",
        help='table mapping, e.g. step=_step,loss="train/CE loss",'
        '"heldout/c4_en-validation=eval/lm/c4_en-validation/CE loss"',
    )
    p.add_argument(
        "--set_column",
        type=_template,
        default=DEFAULT_SET_TEMPLATE,
        help="a held-out set's table column, {label} = the set's name (OLMo-core's)",
    )
    p.add_argument(
        "--tokens_per_step",
        type=number(positive=True),
        help="the reference table's tokens per optimizer step (default: its tokens column, else the run's)",
    )
    p.add_argument(
        "--step_offset",
        type=integer(0),
        default=TABLE_STEP_OFFSET,
        help="table tokens = (step + offset) × tokens_per_step (0: step counts updates done, "
        "as OLMo-core/W&B; 1: 0-based steps, as olmax's metrics.jsonl)",
    )
    p.add_argument(
        "--run_tokens_per_step",
        type=number(positive=True),
        help="override the run's tokens per step",
    )


def _downstream_options(p: Parser) -> None:
    """The downstream verdict's tolerances and the reference's share of the run's tasks."""
    p.add_argument(
        "--downstream_tolerance",
        type=number(),
        default=downstream_lib.DEFAULT_TOLERANCE,
        help="each downstream macro average (accuracy; BPB), absolute",
    )
    p.add_argument(
        "--downstream_task_tolerance",
        type=number(),
        default=None,
        help="each downstream task, absolute (default: --downstream_tolerance × the tasks in its macro, "
        "the difference at which one task alone moves the macro past its tolerance)",
    )
    p.add_argument(
        "--downstream_min_share",
        type=share,
        default=downstream_lib.DEFAULT_MIN_SHARE,
        help="the share of the run's downstream tasks the reference must hold for a PASS (fewer: UNKNOWN)",
    )


class InputError(Refused, ValueError):
    """An input that cannot be read (one `error:` line, exit 2)."""


def main(argv: list[str] | None = None) -> int:
    return run_main(lambda: _main(argv), STOPPED_BY_VERDICT_COMMAND)


def _main(argv: list[str] | None) -> int:
    started = time.time()
    cfg = parse_args(argv)
    check_out_dir(cfg.out, own=COMPARE_REPORT)  # before any work (contract.outputs: nothing made yet)
    try:
        judged = judge(cfg)
        panels = draw(cfg, judged)
    except Refused:  # TableError, DataLogError, DownstreamValueError ...: already one line
        raise
    except (ValueError, OSError) as e:
        raise InputError(f"cannot read the input: {e}") from None
    from . import report  # matplotlib (the charts): after the inputs are read and the verdicts made

    result = {**judged.result, "run_facts": run_facts("compare", started, argv)}
    html_path, json_path = report.write(cfg.out, result, panels)
    v = result["verdict"]
    print(f"[{BADGE[v['passed']]}] {v['summary']}")
    for label, sv in result["sets"].items():
        # the training-loss gap is the run's, said once in the overall line above
        print(f"  [{BADGE[sv['passed']]}] {label}: {sv['summary'].split('; training loss (smoothed)')[0]}")
    ds = result["downstream"]
    if ds is not None:
        print(f"[{BADGE[ds['passed']]}] downstream: {ds['summary']}")
        for label, t in ds["tasks"].items():
            print(f"  {label}: {downstream_lib.task_text(t)}")
    if result["data"]:
        print(f"[data] {result['data']['summary']}")
    print(f"report: {html_path}\nverdicts: {json_path}")
    return {True: 0, False: 1, None: 2}[v["passed"]]
