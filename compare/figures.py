"""compare's page: a row per metric, its curves (run solid, reference dashed) beside run − reference
(compare.report draws them). Each axis names its unit: losses in nats/token, against tokens seen."""

from __future__ import annotations

from typing import Any

from . import curves as curves_lib
from .judging import BADGE, CompareConfig, Judged

LOSS_UNIT = "nats/token"  # the y axis of every loss chart
DOWNSTREAM_UNITS = {"accuracy": "fraction correct", "BPB": "bits/byte", "CE loss": "nats/token"}


def figures(cfg: CompareConfig, judged: Judged) -> list[Any]:
    """The drawing stage (compare.cli.draw): the page's panels (report.Panel) from the judging
    stage's value, a row per metric, its curves beside run − reference; it judges nothing."""
    from . import report  # matplotlib only when drawing

    r, f, aligned, set_aligned = judged.run, judged.reference, judged.aligned, judged.set_aligned
    overall, set_verdicts, ds = judged.overall, judged.set_verdicts, judged.downstream
    ds_run, ds_ref = judged.downstream_run, judged.downstream_reference
    held, train, train_raw = aligned["held"], aligned["train"], aligned["train_raw"]
    overall_caption = (
        "the compared sets' mean, each weighted by the run's target tokens"
        if set_aligned
        else "cross-entropy on the fixed held-out split"
    )
    P = report.Panel
    band = "every point from --after_tokens on (the dotted line, when set) must stay in the band"
    nats = f" ({LOSS_UNIT})"
    figures = [
        P(
            "Training loss",
            f"training cross-entropy ({LOSS_UNIT}), raw (faint) and its debiased EMA (span {cfg.smoothing})",
            report.overlay(r, f, "loss", "train loss" + nats, cfg.smoothing),
            report.difference(train, "Δ train loss" + nats, raw=train_raw),
            "run − reference of the smoothed curves (raw faint); a data bug that repeats data shows up here "
            "as a gain (below zero). Reported, not judged",
            report.identical_note(train_raw),
        ),
        P(
            "Held-out loss (overall)",
            overall_caption,
            report.overlay(r, f, "heldout_loss", "held-out loss" + nats),
            report.difference(held, "Δ held-out loss" + nats, cfg.tolerance, cfg.after_tokens, overall.first_failure),
            f"the verdict: {band}",
            report.identical_note(held),
            BADGE[overall.passed],
        ),
    ]
    for x, a in set_aligned.items():
        v = set_verdicts[x]
        figures.append(
            P(
                f"Held-out set {x}",
                f"{x} loss, run and reference",
                report.overlay(r, f, curves_lib.set_key(x), f"{x} loss" + nats),
                report.difference(a, f"Δ {x}" + nats, cfg.tolerance, cfg.after_tokens, v.first_failure),
                "its own verdict, in the same band",
                report.identical_note(a),
                BADGE[v.passed],
            )
        )
    for kind, m in (ds or {}).get("macros", {}).items():
        j = m["aligned"]  # the judged points (each the mean over the tasks the reference has there)
        a = curves_lib.Aligned(m["key"], j["tokens"], j["reference_step"], j["run"], j["reference"])
        unit = f" ({DOWNSTREAM_UNITS.get(kind, kind)})"
        figures.append(
            P(
                f"Downstream {kind} macro",
                f"mean of {len(m['tasks'])} tasks' {kind}",
                report.overlay(ds_run, ds_ref, m["key"], f"{kind}, mean of {len(m['tasks'])} tasks{unit}"),
                report.difference(
                    a, f"Δ {kind} macro{unit}", cfg.downstream_tolerance, cfg.after_tokens, m["first_failure"]
                ),
                "the downstream verdict: every point in the band",
                report.identical_note(a),
                BADGE[m["passed"]],
            )
        )
    return figures + _optimizer_figures(r, f, aligned["grad"], aligned["lr"])


def _optimizer_figures(
    r: curves_lib.Curves, f: curves_lib.Curves, grad: curves_lib.Aligned, lr: curves_lib.Aligned
) -> list[Any]:
    from . import report  # matplotlib only when drawing

    return [
        report.Panel(
            "Gradient norm",
            "global gradient norm before clipping",
            report.overlay(r, f, "grad_norm", "grad norm (L2, before clipping)", log_y=True),
            report.difference(grad, "Δ grad norm"),
            "difference of the logged grad norms",
            report.identical_note(grad),
        ),
        report.Panel(
            "Learning rate",
            "the schedule as logged",
            report.overlay(r, f, "lr", "learning rate"),
            report.difference(lr, "Δ learning rate"),
            "the schedules should agree exactly when the configs do",
            report.identical_note(lr),
        ),
    ]
