"""`python -m trainer.compare RUN REFERENCE --out DIR` — a run against its reference, by tokens seen.

RUN: an olmax run directory. REFERENCE: another run directory, or a CSV/JSONL metrics table
exported from another trainer (`--columns KEY=COLUMN,...`, defaults fit an OLMo-core W&B export;
tokens from a tokens column, else step × `--tokens_per_step`, else step × the run's tokens per step).
Writes DIR/compare.html and DIR/compare.json. Exit 0: held-out loss within --tolerance of the
reference over the compared range after --after_tokens; 1: it is not; 2: unusable input, or
no held-out point to compare.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from . import curves as curves_lib
from .data import compare_data
from .sides import Side, load_run, load_side
from .table import TableError, parse_columns

DEFAULT_TOLERANCE = 0.01  # nats, absolute, on held-out cross-entropy
TABLE_STEP_OFFSET = 0  # OLMo-core/W&B `_step` counts updates done: tokens = step × tokens/step


@dataclasses.dataclass(frozen=True)
class CompareConfig:
    """tolerance: nats; after_tokens: judge held-out points from here on; smoothing: points in the
    training-loss mean; columns: the table mapping; tokens_per_step / step_offset: the table's
    (or a run's, overriding what its record says); run_tokens_per_step: the run's override."""

    run: str
    reference: str
    out: str
    tolerance: float = DEFAULT_TOLERANCE
    after_tokens: float = 0.0
    smoothing: int = curves_lib.DEFAULT_SMOOTH
    columns: dict[str, str] = dataclasses.field(default_factory=dict)
    tokens_per_step: float | None = None
    step_offset: int = TABLE_STEP_OFFSET
    run_tokens_per_step: float | None = None


def _hosts_fn(side: Side):
    return side.record.host_count_at if side.record is not None else None


def compare(cfg: CompareConfig) -> tuple[dict[str, Any], list[tuple[str, str, str | None]]]:
    """→ (compare.json content, figures for the page). Raises TableError on unusable input."""
    from . import report  # matplotlib only when drawing

    run = load_run(cfg.run, "run", cfg.run_tokens_per_step)
    ref = load_side(cfg.reference, "reference", cfg.columns, cfg.tokens_per_step, cfg.step_offset,
                    run.tokens_per_step)
    held = curves_lib.align(run.curves, ref.curves, "heldout_loss")
    train_raw = curves_lib.align(run.curves, ref.curves, "loss")
    train = curves_lib.align(run.curves, ref.curves, "loss", cfg.smoothing)
    grad, lr = (curves_lib.align(run.curves, ref.curves, m) for m in ("grad_norm", "lr"))
    verdict = curves_lib.judge(held, train, cfg.tolerance, cfg.after_tokens)
    data = compare_data(run.run_dir, ref.run_dir, _hosts_fn(run), _hosts_fn(ref)) if ref.run_dir else None
    result = {
        "verdict": verdict.to_json(),
        "run": {"path": cfg.run, "described": run.described, "tokens_per_step": run.tokens_per_step},
        "reference": {"path": cfg.reference, "described": ref.described, "tokens_per_step": ref.tokens_per_step},
        "data": data.to_json() if data else None,
        # every compared metric on the reference's points: tokens, reference_step, run, reference,
        # diff (= run − reference) [k each; at most curves.MAX_POINTS, chosen by curves.envelope when
        # longer], points (all of them) and max_abs_diff over all (None when nothing overlaps)
        "aligned": {a.metric + suffix: {**_stored(a.thinned()), "points": len(a.tokens),
                                        "max_abs_diff": float(abs(a.diff).max()) if len(a.tokens) else None}
                    for a, suffix in ((held, ""), (train_raw, ""), (train, "_smoothed"), (grad, ""), (lr, ""))},
        "settings": {"tolerance": cfg.tolerance, "after_tokens": cfg.after_tokens, "smoothing": cfg.smoothing},
    }
    r, f = run.curves, ref.curves
    figures = [
        ("Training loss", "training cross-entropy (nats/token), raw (faint) and trailing mean",
         report.overlay(r, f, "loss", "train loss", cfg.smoothing)),
        ("Training loss: run − reference", "difference of the smoothed curves on the reference's points; a data "
         "bug that repeats data shows up here as a gain (below zero)", report.difference(train, "Δ train loss")),
        ("Training loss (raw): run − reference", "difference of the raw logged values, step by step",
         report.difference(train_raw, "Δ train loss (raw)")),
        ("Held-out loss", "cross-entropy on the fixed held-out split", report.overlay(r, f, "heldout_loss", "held-out loss")),
        ("Held-out loss: run − reference", "the verdict: every point from --after_tokens on (the dotted line, when set) must stay in the band",
         report.difference(held, "Δ held-out loss", cfg.tolerance, cfg.after_tokens, verdict.first_failure)),
        ("Gradient norm", "global gradient norm before clipping", report.overlay(r, f, "grad_norm", "grad norm", log_y=True)),
        ("Gradient norm: run − reference", "difference of the logged grad norms", report.difference(grad, "Δ grad norm")),
        ("Learning rate", "the schedule as logged", report.overlay(r, f, "lr", "learning rate")),
        ("Learning rate: run − reference", "the schedules should agree exactly when the configs do",
         report.difference(lr, "Δ learning rate")),
    ]
    return result, figures


def _stored(a: curves_lib.Aligned) -> dict:
    return {"tokens": a.tokens, "reference_step": a.ref_steps, "run": a.run, "reference": a.ref, "diff": a.diff}


def parse_args(argv: list[str] | None) -> CompareConfig:
    p = argparse.ArgumentParser(prog="python -m trainer.compare", description=__doc__.splitlines()[0])
    p.add_argument("run", help="olmax run directory")
    p.add_argument("reference", help="olmax run directory, or a .csv/.jsonl metrics table")
    p.add_argument("--out", required=True, help="folder for compare.html and compare.json")
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="held-out loss, absolute nats")
    p.add_argument("--after_tokens", type=float, default=0.0, help="judge held-out points from this many tokens on")
    p.add_argument("--smooth", type=int, default=curves_lib.DEFAULT_SMOOTH, help="points in the training-loss mean")
    p.add_argument("--columns", help='table mapping, e.g. step=_step,loss="train/CE loss",heldout_loss="eval/lm/c4/CE loss"')
    p.add_argument("--tokens_per_step", type=float,
                   help="the reference table's tokens per optimizer step (default: its tokens column, else the run's)")
    p.add_argument("--step_offset", type=int, default=TABLE_STEP_OFFSET,
                   help="table tokens = (step + offset) × tokens_per_step (0: step counts updates done, "
                        "as OLMo-core/W&B; 1: 0-based steps, as olmax's metrics.jsonl)")
    p.add_argument("--run_tokens_per_step", type=float, help="override the run's tokens per step")
    a = p.parse_args(argv)
    return CompareConfig(a.run, a.reference, a.out, a.tolerance, a.after_tokens, a.smooth,
                         parse_columns(a.columns), a.tokens_per_step, a.step_offset, a.run_tokens_per_step)


def main(argv: list[str] | None = None) -> int:
    try:
        cfg = parse_args(argv)
        result, figures = compare(cfg)
    except (TableError, ValueError, OSError) as e:
        print(f"compare: cannot read the input: {e}", file=sys.stderr)
        return 2
    from . import report

    html_path, json_path = report.write(cfg.out, result, figures)
    v = result["verdict"]
    status = {True: "PASS", False: "FAIL", None: "UNKNOWN"}[v["passed"]]
    print(f"[{status}] {v['summary']}")
    if result["data"]:
        print(f"[data] {result['data']['summary']}")
    print(f"report: {html_path}\nverdicts: {json_path}")
    return {True: 0, False: 1, None: 2}[v["passed"]]
