"""Metrics tables exported from another trainer (CSV, JSONL or JSON) → rows keyed like olmax's metrics.

A column mapping names, for each olmax metric, the table's column:
``step=_step,loss="train/CE loss",heldout_loss="eval/lm/*/CE loss"``. A value may be a glob
(fnmatch) that must match exactly one column. Defaults fit an OLMo-core run exported from
W&B (its metric names; ``_step`` counts updates done). Explicitly mapped columns must exist;
default ones that are absent just leave that metric out. Any unreadable cell, line or file is
a `TableError` naming the file and line (the CLI exits 2 on it), never a silent skip.

Held-out sets: for each set the run evaluated (`heldout/<set>/loss` in its metrics.jsonl) the
column is ``heldout/<set>=COLUMN`` when mapped, else `set_template` with the set's name
(default OLMo-core's LMEvaluator name, ``eval/lm/{label}/CE loss``); the rows then carry
``heldout/<set>/loss``. With per-set columns, ``heldout_loss`` (the overall) is read only when
mapped explicitly (OLMo-core logs no overall; compare weighs the sets instead).

Downstream metrics: each key the run logged (`eval/downstream/<label> (<metric label>)`, OLMo-core's)
is read from the column of that name, or the one column '<run name> - <key>' of a W&B panel's CSV
export; absent ones are left out (compare.downstream calls them UNKNOWN). The step column:
`_step` (W&B history), else `step`, else `Step` (a panel export), unless mapped. A .json file is one
JSON document (`_json_rows`: a list of rows, W&B history saved as JSON, pandas' shapes) or JSON lines.
"""

from __future__ import annotations

import csv
import fnmatch
import json
import math
import shlex
from collections.abc import Sequence
from pathlib import Path

from contract.errors import Refused

# olmax metric → OLMo-core metric name as W&B exports it.
DEFAULT_COLUMNS = {
    "step": "_step",
    "loss": "train/CE loss",
    "heldout_loss": "eval/lm/*/CE loss",
    "grad_norm": "optim/total grad norm",
    "lr": "optim/LR (group 0)",
    "tokens": "throughput/total tokens",
}
KEYS = tuple(DEFAULT_COLUMNS)
SET_PREFIX = "heldout/"  # --columns heldout/<set>=COLUMN; rows carry heldout/<set>/loss
DEFAULT_SET_TEMPLATE = "eval/lm/{label}/CE loss"  # OLMo-core's LMEvaluator, as W&B exports it
STEP_COLUMNS = ("_step", "step", "Step")  # W&B history's, a plain table's, a W&B panel export's
JSON_ROWS_KEYS = ("history", "rows", "data")  # {"history": [row, ...]}: a saved W&B history


class TableError(Refused, ValueError):
    """The reference table (or the mapping) cannot be read."""


def parse_columns(spec: str | None) -> dict[str, str]:
    """``'step=_step,loss="train/CE loss"'`` → {"step": "_step", "loss": "train/CE loss"}
    (shell-style quotes; commas separate pairs)."""
    if not spec:
        return {}
    lex = shlex.shlex(spec, posix=True)
    lex.whitespace, lex.whitespace_split = ",", True
    out = {}
    try:
        items = list(lex)
    except ValueError as e:
        raise TableError(f"--columns {spec!r}: {e}") from None
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not value:
            raise TableError(f"--columns: {item!r} is not KEY=COLUMN")
        if key not in KEYS and not (key.startswith(SET_PREFIX) and len(key) > len(SET_PREFIX)):
            raise TableError(
                f"--columns: unknown key {key!r}; expected some of {', '.join(KEYS)}, or "
                "heldout/<set> for a held-out set's column"
            )
        out[key] = value
    return out


def downstream_column(header: list[str], key: str, path: str) -> str | None:
    """The column of a downstream key: the key itself (W&B history, `run.history().to_csv()`), else
    the one column '<run name> - <key>' (a W&B panel's CSV export); None when there is none."""
    if key in header:
        return key
    hits = [c for c in header if c.endswith(f" - {key}")]
    if len(hits) > 1:
        raise TableError(f"{path}: {len(hits)} columns end with {key!r} ({hits[:3]}): export one run")
    return hits[0] if hits else None


def resolve_columns(
    header: list[str],
    mapping: dict[str, str],
    path: str,
    labels: Sequence[str] = (),
    set_template: str = DEFAULT_SET_TEMPLATE,
    downstream: Sequence[str] = (),
) -> dict[str, str]:
    """{olmax key: pattern} (explicit over defaults) → {olmax key: the one matching column}; the
    held-out sets `labels` as keys `heldout/<set>/loss`; the `downstream` keys found, as themselves.
    The step column, unless mapped: `_step`, else `step`, else `Step` (a W&B panel's export)."""
    resolved = {}
    wanted = {key: DEFAULT_COLUMNS[key] for key in KEYS}
    if "step" not in mapping:
        wanted["step"] = next((c for c in STEP_COLUMNS if c in header), STEP_COLUMNS[0])
    if labels and "heldout_loss" not in mapping:
        del wanted["heldout_loss"]  # per-set columns instead of one overall
    for label in labels:
        wanted[f"{SET_PREFIX}{label}/loss"] = set_template.replace("{label}", label)
    unknown = sorted(k for k in mapping if k.startswith(SET_PREFIX) and k[len(SET_PREFIX) :] not in labels)
    if unknown:
        raise TableError(f"--columns {unknown}: the run has no such held-out set (its sets: {list(labels)})")
    for key, default in wanted.items():
        mapped = key[: -len("/loss")] if key.startswith(SET_PREFIX) else key
        explicit = mapped in mapping
        pattern = mapping.get(mapped, default)
        hits = [c for c in header if c == pattern] or fnmatch.filter(header, pattern)
        if len(hits) > 1:
            raise TableError(
                f"{path}: {key}={pattern!r} matches {len(hits)} columns ({hits[:4]}); "
                f"name one with --columns {key}=COLUMN"
            )
        if not hits:
            if explicit or key == "step":
                raise TableError(
                    f"{path}: no column {pattern!r} for {key} (columns: {header[:12]}"
                    f"{' …' if len(header) > 12 else ''}); map it with --columns {key}=COLUMN"
                )
            continue
        resolved[key] = hits[0]
    for key in downstream:
        col = downstream_column(header, key, path)
        if col is not None:
            resolved[key] = col
    if "loss" not in resolved and not any(
        k == "heldout_loss" or k.startswith(SET_PREFIX) or k in downstream for k in resolved
    ):
        raise TableError(
            f"{path}: neither a training-loss nor a held-out-loss column (nor a downstream one the "
            "run logged); map one with --columns loss=COLUMN or heldout_loss=COLUMN"
        )
    return resolved


def _number(value: str | float | None, key: str, where: str) -> float | None:
    """A cell → float; '' / None / 'null' → None (not logged on this row). A NaN or ±Infinity written
    out ('nan', 'NaN', 'inf', 'Infinity', a JSON NaN) is a value the reference logged: kept, for
    compare.holes' rule to count (never read as "not logged", which would drop it unseen)."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "null")):
        return None
    if isinstance(value, bool):
        raise TableError(f"{where}: {key} is {value!r}, not a number")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise TableError(f"{where}: {key} is {value!r}, not a number") from None
    return x


def _raw_rows(path: Path) -> tuple[list[str], list[tuple[int, dict]]]:
    """(header, [(line number, {column: cell})]) of a .csv / .jsonl / .json-lines file."""
    text_rows: list[tuple[int, dict]] = []
    try:
        with open(path, newline="", encoding="utf-8") as f:
            if path.suffix.lower() == ".csv":
                reader = csv.reader(f)
                header = next(reader, None)
                if not header:
                    raise TableError(f"{path}: empty CSV (no header line)")
                for row in reader:
                    if not row:
                        continue
                    if len(row) != len(header):
                        raise TableError(f"{path}:{reader.line_num}: {len(row)} fields, the header has {len(header)}")
                    text_rows.append((reader.line_num, dict(zip(header, row))))
                return header, text_rows
            if path.suffix.lower() == ".json":
                whole = _json_rows(f.read(), path)
                if whole is not None:
                    return whole
                f.seek(0)
            header_seen: dict[str, None] = {}
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    raise TableError(f"{path}:{lineno}: not JSON ({e.msg})") from None
                if not isinstance(obj, dict):
                    raise TableError(f"{path}:{lineno}: a JSON line must be an object")
                header_seen.update(dict.fromkeys(obj))
                text_rows.append((lineno, obj))
            return list(header_seen), text_rows
    except UnicodeDecodeError as e:
        raise TableError(f"{path}: not UTF-8 text ({e.reason})") from None


def _json_rows(text: str, path: Path) -> tuple[list[str], list[tuple[int, dict]]] | None:
    """A .json file holding one JSON document → (header, [(row number, row)]), or None when it is
    JSON lines instead. Shapes: a list of row objects (W&B's `run.history(pandas=False)`,
    `scan_history()`, pandas' `to_json(orient="records")`), {"history"|"rows"|"data": [rows]},
    pandas' `to_json()` ({column: {index: value}}) and `orient="split"` ({"columns", "data"}); one
    object of plain values is one row."""
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(doc, dict):
        listed = [k for k in JSON_ROWS_KEYS if isinstance(doc.get(k), list)]
        if isinstance(doc.get("columns"), list) and listed == ["data"]:
            cols = doc["columns"]
            if not all(isinstance(r, list) and len(r) == len(cols) for r in doc["data"]):
                raise TableError(f'{path}: "data" rows must be lists of {len(cols)} values (the columns)')
            doc = [dict(zip(cols, r)) for r in doc["data"]]
        elif listed:
            doc = doc[listed[0]]
        elif doc and all(isinstance(v, dict) for v in doc.values()):  # {column: {index: value}}
            index = list(dict.fromkeys(i for v in doc.values() for i in v))
            doc = [{c: doc[c].get(i) for c in doc} for i in index]
        else:
            doc = [doc]
    if not isinstance(doc, list):
        raise TableError(f"{path}: a JSON table must be a list of row objects, not {type(doc).__name__}")
    header: dict[str, None] = {}
    for i, row in enumerate(doc, 1):
        if not isinstance(row, dict):
            raise TableError(f"{path}: row {i} must be an object, not {type(row).__name__}")
        header.update(dict.fromkeys(row))
    return list(header), list(enumerate(doc, 1))


def read_table(
    path: str | Path,
    mapping: dict[str, str] | None = None,
    labels: Sequence[str] = (),
    set_template: str = DEFAULT_SET_TEMPLATE,
    downstream: Sequence[str] = (),
) -> tuple[list[dict], dict[str, str]]:
    """A CSV/JSON(L) metrics table → (rows {"step", metric…, "tokens"?}, the columns used).

    Rows without a step value are an error; rows whose step is present but carry none of the
    mapped metrics are dropped (W&B writes such rows for other logged keys).
    """
    path = Path(path)
    if not path.is_file():
        raise TableError(f"{path}: no such file")
    if path.suffix.lower() not in (".csv", ".jsonl", ".json", ".ndjson"):
        raise TableError(f"{path}: expected a .csv or .jsonl metrics table (or a .json one)")
    header, raw = _raw_rows(path)
    if not raw:
        raise TableError(f"{path}: no rows")
    cols = resolve_columns(header, mapping or {}, str(path), list(labels), set_template, list(downstream))
    rows = []
    for lineno, r in raw:
        where = f"{path}:{lineno}"
        step = _number(r.get(cols["step"]), "step", where)
        if step is None or not math.isfinite(step) or step != int(step) or step < 0:
            raise TableError(f"{where}: step {r.get(cols['step'])!r} is not a non-negative integer")
        out: dict[str, float] = {"step": int(step)}
        for key, col in cols.items():
            if key != "step":
                v = _number(r.get(col), key, where)
                if v is not None:
                    out[key] = v
        if len(out) > 1:
            rows.append(out)
    if not rows:
        raise TableError(f"{path}: no row carries any of the columns {sorted(set(cols.values()) - {cols['step']})}")
    return rows, cols
