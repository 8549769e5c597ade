"""The trainer's data logs: file naming, line layout, JSON-lines reading, the consumed-stream hash.

`run_dir/data_log/host-HHHHH-of-HHHHH.jsonl` (host h of H, five digits each): one line per
step, `{"step": s, "index": [G/H global positions], "example": [G/H example ids]}` (example id
= `source_ordinal << 40 | record`). After an elastic restart the old host count's logs are cut
back to the steps before the restart, so each step belongs to one host count.

`chain_data_sha256` is the hash of the consumed stream: chained per step over the *global*
batch's example ids, so it is the same for every host count (the trainer checkpoints the
running value and writes the final one to summary.json; the audit recomputes it from the logs).
"""

from __future__ import annotations

import array
import hashlib
import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

from .errors import Refused

DATA_LOG_DIR = "data_log"
DATA_LOG_GLOB = "host-*-of-*.jsonl"
_NAME = re.compile(r"host-(\d{5})-of-(\d{5})\.jsonl")  # matched in full (a trailing newline fails)


class JsonLinesError(Refused, ValueError):
    """A line of a JSON-lines file is not valid JSON (the message names file and line)."""


def data_log_name(process_index: int, process_count: int) -> str:
    """Host h of H's data log file name: `host-HHHHH-of-HHHHH.jsonl`."""
    if not 0 <= process_index < process_count:
        raise ValueError(f"host {process_index} of {process_count}: need 0 <= host < host count")
    return f"host-{process_index:05d}-of-{process_count:05d}.jsonl"


def parse_data_log_name(name: str) -> tuple[int, int] | None:
    """`host-HHHHH-of-HHHHH.jsonl` (a base name) → (host, host count); None when `name` is not a
    data log name or its host is not below its host count."""
    m = _NAME.fullmatch(name)
    if not m:
        return None
    h, H = int(m.group(1)), int(m.group(2))
    return (h, H) if h < H else None


def data_log_row(step: int, index: Any, example: Any) -> dict[str, Any]:
    """One data-log line: the host's positions `index` [G/H] and example ids `example` [G/H]."""
    return {"step": int(step), "index": np.asarray(index).tolist(), "example": np.asarray(example).tolist()}


def iter_jsonl(path: str, offset: int = 0, lines_before: int = 0) -> Iterator[tuple[int, Any]]:
    """(line number, value) for each non-blank line (from byte `offset`, the start of line
    `lines_before` + 1); a line that is not UTF-8 JSON (a torn last line included) raises
    JsonLinesError naming `path:line`. Lines end at b"\\n" only."""
    with open(path, "rb") as f:
        f.seek(offset)
        for lineno, raw in enumerate(f, lines_before + 1):
            if not raw.strip():
                continue
            torn = "" if raw.endswith(b"\n") else " (a torn last line: was the writer killed?)"
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as e:
                raise JsonLinesError(f"{path}:{lineno}: not UTF-8 text ({e.reason} at byte {e.start}){torn}") from None
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                raise JsonLinesError(f"{path}:{lineno}: not valid JSON: {e.msg} at column {e.colno}{torn}") from None
            except (ValueError, RecursionError) as e:  # an integer too long to parse, nesting too deep
                raise JsonLinesError(f"{path}:{lineno}: not usable JSON: {e}") from None


_ROW_KEYS = ("step", "index", "example")
_INT64_END = 1 << 63  # steps, positions and example ids are int64 ≥ 0 (chain_data_sha256, numpy)


def _is_int64_list(v: Any) -> bool:
    """Is `v` a list of ints (not bools) in [0, 2^63)? Vectorised: a Python loop over the elements
    costs as much as parsing the line. array("q") converts in C and refuses what is not an int
    (float, str, None, list, dict) or outside int64; bools, ints to it, can only hide among the
    entries equal to 0 or 1, which are checked one by one (few in a data log)."""
    if type(v) is not list:
        return False
    try:
        arr = np.frombuffer(array.array("q", v), dtype=np.int64)  # [len(v)]
    except (TypeError, OverflowError):
        return False
    if arr.size and arr.min() < 0:
        return False
    return all(type(v[i]) is int for i in np.flatnonzero(arr <= 1).tolist())


def data_log_row_problem(row: Any) -> str | None:
    """Why `row` (a parsed data-log line) is not `{"step": int ≥ 0, "index": [int ≥ 0, …],
    "example": [int ≥ 0, …]}` with index and example of one length; None when it is."""
    if type(row) is not dict:
        return f"a data-log line is a JSON object, not {type(row).__name__}"
    if missing := [k for k in _ROW_KEYS if k not in row]:
        return f"a data-log line needs {list(_ROW_KEYS)}; missing {missing}"
    step = row["step"]
    if type(step) is not int or not 0 <= step < _INT64_END:
        return f"step must be an int in [0, 2^63), got {step!r:.40}"
    for key in ("index", "example"):
        if not _is_int64_list(row[key]):
            return f"{key} must be a list of ints in [0, 2^63)"
    if len(row["index"]) != len(row["example"]):
        return f"index and example differ in length ({len(row['index'])} vs {len(row['example'])})"
    return None


def iter_data_log(path: str, offset: int = 0, lines_before: int = 0) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of a data log (from byte `offset`, the start of line `lines_before` + 1),
    each row checked by `data_log_row_problem`: a line that is not a well-formed row raises
    JsonLinesError naming `path:line`."""
    for lineno, row in iter_jsonl(path, offset, lines_before):
        if problem := data_log_row_problem(row):
            raise JsonLinesError(f"{path}:{lineno}: {problem}")
        yield lineno, row


def chain_data_sha256(previous: str, step: int, global_example: np.ndarray) -> str:
    """The consumed-stream hash after `step`: sha256(previous ‖ step int64-le ‖ example ids int64-le [G]).

    previous: "" before step 0; global_example: the global batch's example ids in host order.
    """
    h = hashlib.sha256(previous.encode())
    h.update(np.array(step, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(global_example, dtype="<i8").tobytes())
    return h.hexdigest()
