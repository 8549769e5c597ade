"""`--data-checks`: which of the data-side checks (integrity, contamination, statistics: the ones
that read every shard) run now.

    all           read every shard now (the default)
    reuse:PATH    take them from a previous audit of the same manifests (PATH: its audit.json or
                  its --out folder), so auditing a finished run does not re-hash the dataset
    none          do not check the shards (listed as not run)

Accounting reads only the manifests and always runs. A previous audit can be reused only if it
read the shards itself (mode `all`), audited manifests with the same fingerprints in the same
order, and used the same contamination settings and document digest (it keys which documents
are sampled; audits before it was recorded used blake2b); anything else is refused (exit 2), never
reused silently. What is reused keeps its verdict, summary and figures, and says where it comes
from (`taken_from`: the file and the date its shards were read); the mixture, sharding and run
checks use the per-record padding that audit recorded (`train_padding` in audit.json).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import os
from typing import Annotated, Any

from pydantic import Field, StrictInt, TypeAdapter, ValidationError

from contract import ManifestError

from .checks import CheckResult

DATA_CHECKS = ("integrity", "contamination", "statistics")  # the checks that read the shards
TASK_CONTAMINATION = "task_contamination"  # check 8, in the same pass when eval tasks are given
ALL, REUSE, NONE = "all", "reuse", "none"
DOCUMENT_DIGEST = "document_digest"  # inputs.data_checks: the digest that keyed the samples
BEFORE_DIGEST_RECORDED = "blake2b_128"  # what an audit.json without it used


# A previous audit's parts, checked field by field before reuse (a hand-edited or truncated
# audit.json must be refused in one line, not fail later in the report): a check's result with
# pydantic's strict JSON types (no "yes" for true, no 1.5 for a count) and the per-record padding
# of each manifest's training sources, {source: {record: PAD tokens}} (records are JSON object keys).
_RESULT = TypeAdapter(CheckResult)
_COUNT = Annotated[StrictInt, Field(ge=0)]
_PADDING = TypeAdapter(list[dict[str, dict[Annotated[int, Field(ge=0)], _COUNT]]])


class DataChecksError(ManifestError):
    """A previous audit that cannot be reused (the command exits 2 with this one line)."""


@dataclasses.dataclass(frozen=True)
class DataChecks:
    mode: str = ALL
    path: str | None = None  # with REUSE: the previous audit.json


def parse(text: str) -> DataChecks:
    """`all`, `none` or `reuse:PATH` (ValueError otherwise)."""
    if text in (ALL, NONE):
        return DataChecks(text)
    if text.startswith(REUSE + ":") and text[len(REUSE) + 1 :]:
        path = text[len(REUSE) + 1 :]
        return DataChecks(REUSE, os.path.join(path, "audit.json") if os.path.isdir(path) else path)
    raise ValueError(f"expected all, none or reuse:PATH/audit.json, got {text!r}")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class Previous:
    """The reusable part of a previous data audit."""

    path: str
    date: str
    results: dict[str, CheckResult]
    train_padding: list[dict[str, dict[int, int]]]  # per manifest: source → {train record: PAD tokens}


def load_previous(
    path: str,
    fingerprints: list[str],
    contamination: dict[str, Any],
    digest: str,
    task_contamination: dict[str, Any] | None = None,
) -> Previous:
    """The previous audit at `path`, checked against this audit's manifests (fingerprints, in
    order), contamination settings, document digest (`contamination.DIGEST`, which keys the
    samples) and eval-leakage settings (the index's sha256 and the detector's; None: no eval
    tasks); DataChecksError (one line) when it cannot be reused."""
    where = f"--data-checks reuse:{path}"
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError) as e:
        raise DataChecksError(f"{where}: cannot read it: {e}") from None
    inputs = doc.get("inputs") if isinstance(doc, dict) else None
    block = inputs.get("data_checks") if isinstance(inputs, dict) else None
    if not isinstance(block, dict) or not isinstance(doc.get("checks"), dict):
        raise DataChecksError(f"{where}: not an audit.json of a data audit (no record of its data checks)")
    if block.get("mode") != ALL or any(c not in doc["checks"] for c in DATA_CHECKS):
        raise DataChecksError(
            f"{where}: not a data audit: it did not read the shards itself "
            f"(--data-checks {block.get('mode')}{_from(block)})"
        )
    assert isinstance(inputs, dict)  # block, a dict, came from it
    theirs = inputs.get("fingerprints") or ([inputs["fingerprint"]] if inputs.get("fingerprint") else [])
    if not isinstance(theirs, list) or list(theirs) != list(fingerprints):
        raise DataChecksError(
            f"{where}: it audited manifests with fingerprints {_short(theirs)}, not these ({_short(fingerprints)})"
        )
    if block.get("contamination") != contamination:
        raise DataChecksError(
            f"{where}: it used other contamination settings ({block.get('contamination')}, now {contamination})"
        )
    theirs_digest = block.get(DOCUMENT_DIGEST, BEFORE_DIGEST_RECORDED)
    if theirs_digest != digest:
        raise DataChecksError(
            f"{where}: it digested documents with {theirs_digest}, this audit with {digest}: the documents "
            "in its 13-gram and tokens-per-byte samples are not the ones this audit samples; read the shards "
            "again (--data-checks all)"
        )
    if block.get(TASK_CONTAMINATION) != task_contamination:
        raise DataChecksError(
            f"{where}: it checked eval leakage with other settings ({block.get(TASK_CONTAMINATION)}, now "
            f"{task_contamination}): read the shards again (--data-checks all)"
        )
    padding = doc.get("train_padding")
    if not isinstance(padding, list) or len(padding) != len(fingerprints):
        raise DataChecksError(f"{where}: it has no per-record padding of the training shards (train_padding)")
    names = DATA_CHECKS + ((TASK_CONTAMINATION,) if task_contamination is not None else ())
    if any(n not in doc["checks"] for n in names):
        raise DataChecksError(f"{where}: it has no {TASK_CONTAMINATION} check")
    results = {name: _valid(_RESULT, json.dumps(doc["checks"][name]), f"{where}: checks.{name}") for name in names}
    return Previous(
        os.path.abspath(path), str(block.get("ran_at")), results, _valid(_PADDING, padding, f"{where}: train_padding")
    )


def _valid(adapter: TypeAdapter, value: Any, where: str) -> Any:
    """`value` (JSON text for a check's result, else a parsed value) validated by `adapter`;
    DataChecksError naming the first bad field otherwise."""
    try:
        if isinstance(value, str):
            return adapter.validate_json(value, strict=True)
        return adapter.validate_python(value)
    except ValidationError as e:
        err = e.errors()[0]
        at = ".".join(str(x) for x in err["loc"] if x != "[key]")
        raise DataChecksError(f"{where}{'.' + at if at else ''}: not a well-formed audit.json ({err['msg']})") from None


def _from(block: dict) -> str:
    src = block.get("reused_from")
    return f", taken from {src.get('path')}" if isinstance(src, dict) else ""


def _short(fps) -> str:
    if not isinstance(fps, (list, tuple)):
        return repr(fps)
    return ", ".join(f"{str(f)[:16]}…" for f in fps) or "none"


def reused(r: CheckResult, prev: Previous) -> CheckResult:
    """A previous audit's result, marked as taken from it."""
    return dataclasses.replace(r, taken_from={"path": prev.path, "date": prev.date})
