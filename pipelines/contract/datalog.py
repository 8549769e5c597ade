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

import hashlib
import json
import re
from collections.abc import Iterator
from typing import Any

import numpy as np

DATA_LOG_DIR = "data_log"
DATA_LOG_GLOB = "host-*-of-*.jsonl"
_NAME = re.compile(r"host-(\d{5})-of-(\d{5})\.jsonl")  # matched in full (a trailing newline fails)


class JsonLinesError(ValueError):
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


def iter_jsonl(path: str) -> Iterator[tuple[int, dict]]:
    """(line number, object) for each non-blank line; a line that is not JSON (a torn last line
    included) raises JsonLinesError naming `path:line`."""
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                yield lineno, json.loads(line)
            except json.JSONDecodeError as e:
                torn = "" if line.endswith("\n") else " (a torn last line: was the writer killed?)"
                raise JsonLinesError(f"{path}:{lineno}: not valid JSON: {e.msg} at column {e.colno}{torn}") from None


def chain_data_sha256(previous: str, step: int, global_example: np.ndarray) -> str:
    """The consumed-stream hash after `step`: sha256(previous ‖ step int64-le ‖ example ids int64-le [G]).

    previous: "" before step 0; global_example: the global batch's example ids in host order.
    """
    h = hashlib.sha256(previous.encode())
    h.update(np.array(step, dtype="<i8").tobytes())
    h.update(np.ascontiguousarray(global_example, dtype="<i8").tobytes())
    return h.hexdigest()
