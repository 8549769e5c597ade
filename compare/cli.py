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
import time
from typing import Any

from contract import COMPARE_REPORT, STOPPED_BY_VERDICT_COMMAND, Refused, check_out_dir
from contract.cli import Parser, integer, number, run_dir, run_main, share
from contract.provenance import run_facts

from . import curves as curves_lib
from . import downstream as downstream_lib
from .figures import figures
from .judging import BADGE, DEFAULT_TOLERANCE, TABLE_STEP_OFFSET, CompareConfig, Judged, judge
from .table import DEFAULT_SET_TEMPLATE, parse_columns

__all__ = ["DEFAULT_TOLERANCE", "CompareConfig", "Judged", "draw", "judge", "main", "parse_args"]


def draw(cfg: CompareConfig, judged: Judged) -> list[Any]:
    """The drawing stage: the page's panels (report.Panel, compare.figures) from the judging stage's
    value; it judges nothing."""
    return figures(cfg, judged)


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
