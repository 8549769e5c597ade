"""The two sides of a comparison: an olmax run directory, or a metrics table (CSV/JSONL).

An olmax run is read through `contract.FinishedRun` (run.json: G, seq_len, hosts per step range; a
run written before run.json existed: its config.json and manifests, by that reader's one fallback
policy). metrics.jsonl gives the curves.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import contract
from contract.rundir import RunDir

from .curves import METRICS, POOLED_TOKENS, SET_PREFIX, Curves, is_downstream_key, make_curves
from .evaluation import SETTINGS_KEY, recorded_settings, settings_history
from .table import DEFAULT_SET_TEMPLATE, TableError, read_table

OLMAX_STEP_OFFSET = 1  # olmax row s is the update on batch s: s + 1 batches consumed after it


@dataclasses.dataclass(frozen=True)
class Side:
    """curves; run_dir and record only for an olmax run (record None when it has no run.json);
    described: one line saying what this side is; eval_settings: the distinct evaluation settings
    its evaluation rows record (None: not recorded, as in a table or an older run)."""

    curves: Curves
    described: str
    run_dir: RunDir | None = None  # resolved where the side was named (compare.cli, load_side)
    record: contract.RunRecord | None = None
    tokens_per_step: float | None = None
    eval_settings: list[dict] | None = None
    eval_history: tuple | None = None  # (step, settings) of each evaluation row (evaluation.settings_history)


def is_run_dir(path: str) -> bool:
    return os.path.isdir(path)


def metrics_row_problem(row: object) -> str | None:
    """Why a metrics.jsonl row cannot be read (pure), or None: an object whose step is an integer
    ≥ 0 and whose compared values (curves.METRICS, the held-out sets' and the downstream keys) are
    numbers or null."""
    if not isinstance(row, dict):
        return f"a metrics row must be a JSON object, not {type(row).__name__}"
    step = row.get("step")
    if type(step) is not int or step < 0:
        return f"step {step!r} is not an integer ≥ 0" if "step" in row else "no step"
    if not isinstance(row.get(SETTINGS_KEY, {}), dict):
        return f"{SETTINGS_KEY} is {row[SETTINGS_KEY]!r}, not an object"
    for key, value in row.items():
        judged = key in METRICS or key == POOLED_TOKENS or key.startswith(SET_PREFIX) or is_downstream_key(key)
        if judged and value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            return f"{key} is {value!r}, not a number"
    return None


def _read_metrics(path: Path) -> list[dict]:
    """metrics.jsonl rows; a torn last line (a run killed mid-write) is dropped, any other bad
    line (not JSON, or a row `metrics_row_problem` refuses) is an error naming path:line."""
    rows = []
    try:
        for lineno, row in contract.iter_jsonl(str(path)):
            problem = metrics_row_problem(row)
            if problem:
                raise TableError(f"{path}:{lineno}: {problem}")
            rows.append(row)
    except contract.JsonLinesError as e:
        if "torn last line" not in str(e):
            raise TableError(str(e)) from None
    return rows


def load_run(run_dir: RunDir, name: str, tokens_per_step: float | None = None) -> Side:
    """An olmax run directory (as the command line resolved it) → Side (TableError when it is not one)."""
    metrics = run_dir.metrics
    if not metrics.is_file():
        raise TableError(f"{run_dir}: not an olmax run directory (no {RunDir.METRICS})")
    try:  # the one reader of a finished run (contract.FinishedRun: run.json, else config.json)
        done = contract.FinishedRun.read(run_dir)
        how = "given"
        if tokens_per_step is None:
            tokens_per_step, how = float(done.tokens_per_step), done.source
    except contract.FinishedRunError as e:
        raise TableError(f"{e}; pass --tokens_per_step" if tokens_per_step is None else str(e)) from None
    record = done.record
    rows = _read_metrics(metrics)
    if not rows:
        raise TableError(f"{metrics}: no metrics rows")
    curves = make_curves(name, rows, tokens_per_step, OLMAX_STEP_OFFSET)
    described = (
        f"olmax run {run_dir} ({len(rows)} steps, {tokens_per_step:,.0f} tokens/step from {how}"
        + (f", G {record.global_batch_size}, seed {record.seed}" if record else "")
        + ")"
    )
    return Side(curves, described, run_dir, record, tokens_per_step, recorded_settings(rows), settings_history(rows))


def load_table(
    path: str,
    name: str,
    mapping: dict[str, str],
    tokens_per_step: float | None,
    step_offset: int,
    run_tokens_per_step: float | None = None,
    labels: Sequence[str] = (),
    set_template: str = DEFAULT_SET_TEMPLATE,
    downstream: Sequence[str] = (),
) -> Side:
    """A CSV/JSON metrics table → Side (TableError on anything unreadable); `downstream`: the
    downstream keys looked for (compare.table.read_table).

    Tokens: the table's tokens column when mapped/present, else (step + step_offset) ×
    tokens_per_step, where tokens_per_step defaults to the run's (same G and seq_len assumed,
    and said so in the description)."""
    rows, cols = read_table(path, mapping, labels, set_template, downstream)
    how = "given"
    if "tokens" in cols:
        how = f"column {cols['tokens']!r}"
    elif tokens_per_step is None:
        if run_tokens_per_step is None:
            raise TableError(
                f"{path}: no tokens column; pass --tokens_per_step (tokens per optimizer step "
                "of the reference run) or map one with --columns tokens=COLUMN"
            )
        tokens_per_step, how = run_tokens_per_step, "the run's (assumed: no --tokens_per_step, no tokens column)"
    curves = make_curves(name, rows, tokens_per_step, step_offset, "tokens" if "tokens" in cols else None)
    used = ", ".join(f"{k}={v!r}" for k, v in cols.items() if k not in downstream)
    n_downstream = sum(k in downstream for k in cols)
    if n_downstream:
        used += f"; {n_downstream} downstream metric columns"
    per_step = f"{tokens_per_step:,.0f} tokens/step" if "tokens" not in cols else "tokens"
    return Side(
        curves,
        f"metrics table {path} ({len(rows)} rows; columns {used}; {per_step} from {how})",
        tokens_per_step=tokens_per_step,
    )


def load_side(
    path: str,
    name: str,
    mapping: dict[str, str],
    tokens_per_step: float | None,
    step_offset: int,
    run_tokens_per_step: float | None = None,
    labels: Sequence[str] = (),
    set_template: str = DEFAULT_SET_TEMPLATE,
    downstream: Sequence[str] = (),
) -> Side:
    """labels: the run's held-out sets, downstream: its downstream keys, looked up in a table (see
    compare.table)."""
    if is_run_dir(path):  # a run directory: resolved here, once, as the run's flag is (contract.cli.run_dir)
        return load_run(RunDir.resolved(path), name, tokens_per_step)
    return load_table(
        path, name, mapping, tokens_per_step, step_offset, run_tokens_per_step, labels, set_template, downstream
    )
