"""`--data-checks`: which of the data-side checks (integrity, contamination, statistics: the ones
that read every shard) run now.

    all           read every shard now (the default)
    reuse:PATH    take them from a previous audit of the same manifests (PATH: its audit.json or
                  its --out folder), so auditing a finished run does not re-hash the dataset;
                  reuse:PATH@SHA256 (or the first 12+ hex digits) also pins its digest
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
import hashlib
import json
import os
import re
from typing import Annotated, Any

from pydantic import Field, StrictInt, TypeAdapter, ValidationError

from contract import ManifestError

from .checks import CheckResult

DATA_CHECKS = ("integrity", "contamination", "statistics")  # the checks that read the shards
TASK_CONTAMINATION = "task_contamination"  # check 8, in the same pass when eval tasks are given
TITLES = {
    "integrity": "1. Integrity",
    "contamination": "6. Held-out contamination",
    "statistics": "7. Statistics",
    TASK_CONTAMINATION: "8. Eval leakage (downstream tasks in training)",
}
SHA256 = "sha256"  # inputs.data_checks: a data audit's results_digest
_PIN = re.compile(r"^(?P<path>.+)@(?P<sha>[0-9a-fA-F]{12,64})$")
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
    pin: str | None = None  # with REUSE: the digest (or its first 12+ hex digits) it must have


def parse(text: str) -> DataChecks:
    """`all`, `none` or `reuse:PATH` (ValueError otherwise)."""
    if text in (ALL, NONE):
        return DataChecks(text)
    if text.startswith(REUSE + ":") and text[len(REUSE) + 1 :]:
        path, pin = text[len(REUSE) + 1 :], None
        if (m := _PIN.match(path)) and not os.path.exists(path):
            path, pin = m["path"], m["sha"].lower()
        return DataChecks(REUSE, os.path.join(path, "audit.json") if os.path.isdir(path) else path, pin)
    raise ValueError(f"expected all, none or reuse:PATH/audit.json, got {text!r}")


def now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True)
class Previous:
    """The reusable part of a previous data audit."""

    path: str
    date: str
    sha256: str  # its results_digest, recomputed and checked
    results: dict[str, CheckResult]
    train_padding: list[dict[str, dict[int, int]]]  # per manifest: source → {train record: PAD tokens}
    task_contamination: dict[str, Any] | None = None  # the eval-leakage settings it ran check 8 with (None: not run)


def _reusable_checks(checks: dict[str, Any]) -> tuple[str, ...]:
    """The checks a reuse takes from an audit.json's checks: the three data checks, and check 8
    where the audit has it (run, or listed as not run)."""
    return DATA_CHECKS + ((TASK_CONTAMINATION,) if TASK_CONTAMINATION in checks else ())


def results_digest(doc: dict[str, Any]) -> str:
    """sha256 of what a reuse takes from a data audit's audit.json (parsed): the manifests'
    fingerprints, its data_checks record (less this digest), the data checks (``_reusable_checks``)
    and train_padding, as canonical JSON (sorted keys, no spaces, ASCII)."""
    inputs = doc["inputs"]
    body = {
        "fingerprints": inputs.get("fingerprints") or [inputs.get("fingerprint")],
        "data_checks": {k: v for k, v in inputs["data_checks"].items() if k != SHA256},
        "checks": {n: doc["checks"].get(n) for n in _reusable_checks(doc["checks"])},
        "train_padding": doc.get("train_padding"),
    }
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode()).hexdigest()


def findings_problem(r: CheckResult) -> str | None:
    """Why a check's verdict disagrees with its own findings (None when it agrees): the audit's
    checks FAIL exactly when they counted a failure (checks.result), and list at most what they
    counted."""
    if r.failure_count < len(r.failures):
        return f"lists {len(r.failures)} failures but counts {r.failure_count}"
    if r.passed is False and r.failure_count == 0:
        return "says FAIL with no failure counted"
    if r.passed is not False and r.failure_count:
        return f"says {r.status} with {r.failure_count} failure(s) counted"
    return None


def load_previous(
    path: str,
    fingerprints: list[str],
    contamination: dict[str, Any],
    digest: str,
    task_contamination: dict[str, Any] | None = None,
    pin: str | None = None,
) -> Previous:
    """The previous audit at `path`, checked against this audit's manifests (fingerprints, in
    order), contamination settings, document digest (`contamination.DIGEST`, which keys the
    samples) and eval-leakage settings (the index's sha256 and the detector's; None: no eval
    tasks now, and its check 8 is not taken), its own recorded results_digest (and `pin`, when given), and each check against its
    own findings; DataChecksError (one line) when it cannot be reused. Named steps: read
    (`_data_audit`), the same inputs (`_check_same_inputs`), its own digest (`_check_digest`), each
    check against its findings (`_own_results`)."""
    where = f"--data-checks reuse:{path}"
    doc, inputs, block = _data_audit(path, where)
    _check_same_inputs(where, inputs, block, fingerprints, contamination, digest, task_contamination)
    padding = doc.get("train_padding")
    if not isinstance(padding, list) or len(padding) != len(fingerprints):
        raise DataChecksError(f"{where}: it has no per-record padding of the training shards (train_padding)")
    actual = _check_digest(where, doc, block, pin)
    names = DATA_CHECKS + ((TASK_CONTAMINATION,) if task_contamination is not None else ())
    return Previous(
        os.path.abspath(path),
        str(block.get("ran_at")),
        actual,
        _own_results(where, doc, names),
        _valid(_PADDING, padding, f"{where}: train_padding"),
        block.get(TASK_CONTAMINATION) if isinstance(block.get(TASK_CONTAMINATION), dict) else None,
    )


def _data_audit(path: str, where: str) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(audit.json at `path`, its inputs, its inputs.data_checks): an audit that read the shards
    itself (--data-checks all), else DataChecksError."""
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
    return doc, inputs, block


def _check_same_inputs(
    where: str,
    inputs: dict[str, Any],
    block: dict[str, Any],
    fingerprints: list[str],
    contamination: dict[str, Any],
    digest: str,
    task_contamination: dict[str, Any] | None,
) -> None:
    """The previous audit read these manifests (fingerprints, in order) with these contamination
    settings, this document digest and (task_contamination not None) these eval-leakage settings;
    else DataChecksError naming what differs."""
    theirs = inputs.get("fingerprints") or ([inputs["fingerprint"]] if inputs.get("fingerprint") else [])
    if not isinstance(theirs, list) or list(theirs) != list(fingerprints):
        raise DataChecksError(
            f"{where}: it audited manifests with fingerprints {_short(theirs)}, not these ({_short(fingerprints)})"
        )
    if block.get("contamination") != contamination:
        was = block.get("contamination")
        was = was if isinstance(was, dict) else {}
        raise DataChecksError(
            f"{where}: it used other contamination settings: {_differs(was, contamination)}: "
            "read the shards again (--data-checks all)"
        )
    theirs_digest = block.get(DOCUMENT_DIGEST, BEFORE_DIGEST_RECORDED)
    if theirs_digest != digest:
        raise DataChecksError(
            f"{where}: it digested documents with {theirs_digest}, this audit with {digest}: the documents "
            "in its 13-gram and tokens-per-byte samples are not the ones this audit samples; read the shards "
            "again (--data-checks all)"
        )
    if task_contamination is not None and (
        problem := _leakage_problem(block.get(TASK_CONTAMINATION), task_contamination)
    ):
        raise DataChecksError(f"{where}: {problem}: read the shards again (--data-checks all)")


def _check_digest(where: str, doc: dict[str, Any], block: dict[str, Any], pin: str | None) -> str:
    """The digest of the previous audit's data checks (results_digest), as it recorded it (and
    starting with `pin`, when given); else DataChecksError."""
    recorded, actual = block.get(SHA256), results_digest(doc)
    if not isinstance(recorded, str):
        raise DataChecksError(
            f"{where}: it records no digest of its data checks (inputs.data_checks.{SHA256}: written before "
            "olmax recorded one, or not by the audit); read the shards again (--data-checks all)"
        )
    if recorded != actual:
        raise DataChecksError(
            f"{where}: its content does not match the digest it recorded ({recorded[:16]}…, the content's "
            f"{actual[:16]}…): edited since the audit wrote it; read the shards again (--data-checks all)"
        )
    if pin is not None and not actual.startswith(pin):
        raise DataChecksError(f"{where}: its digest is {actual}, not the pinned {pin}")
    return actual


def _own_results(where: str, doc: dict[str, Any], names: tuple[str, ...]) -> dict[str, CheckResult]:
    """The previous audit's checks `names`, each valid and agreeing with its own findings (named and
    titled as this audit names them, never as the file does); else DataChecksError."""
    if any(n not in doc["checks"] for n in names):
        raise DataChecksError(f"{where}: it has no {TASK_CONTAMINATION} check")
    results = {}
    for name in names:
        r = _valid(_RESULT, json.dumps(doc["checks"][name]), f"{where}: checks.{name}")
        problem = findings_problem(r)
        if problem:
            raise DataChecksError(f"{where}: checks.{name} {problem}: its verdict disagrees with its own findings")
        results[name] = dataclasses.replace(r, name=name, title=TITLES[name])  # never the file's
    return results


def _leakage_problem(theirs: Any, mine: dict[str, Any]) -> str | None:
    """Why a previous audit's check 8 is not the one asked for now (None when it is), in a few
    words: the index, or the detector settings that differ. (Without --eval-tasks now, nothing is
    asked: the three data checks are taken and check 8 is listed as not run.)"""
    if not isinstance(theirs, dict):
        return "it did not check eval leakage (no --eval-tasks then)"
    if theirs.get("index_sha256") != mine["index_sha256"]:
        return (
            f"it checked eval leakage against another index (sha256 {str(theirs.get('index_sha256'))[:12]}…, "
            f"now {mine['index_sha256'][:12]}…: other task files)"
        )
    was, now = theirs.get("detector") or {}, mine["detector"]
    diff = _differs(was, now)
    return f"it checked eval leakage with other detector settings: {diff}" if diff else None


def _differs(was: dict[str, Any], now: dict[str, Any]) -> str:
    """The settings that differ, each as "name WAS (now NOW)"."""
    return ", ".join(
        f"{k} {was.get(k)!r} (now {now.get(k)!r})" for k in sorted(set(was) | set(now)) if was.get(k) != now.get(k)
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


def _short(fps: object) -> str:
    if not isinstance(fps, (list, tuple)):
        return repr(fps)
    return ", ".join(f"{str(f)[:16]}…" for f in fps) or "none"


def reused(r: CheckResult, prev: Previous) -> CheckResult:
    """A previous audit's result, marked as taken from it."""
    return dataclasses.replace(r, taken_from={"path": prev.path, "date": prev.date, SHA256: prev.sha256})
