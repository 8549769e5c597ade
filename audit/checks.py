"""The common shape of every audit check: a verdict, a one-line summary, the failures, the figures.

Each check module exposes a pure function returning a `CheckResult`; the report renders it and
`audit.json` stores `to_json()` of every result. Failure lists are capped so that a badly broken
dataset still produces a readable report; `failure_count` keeps the true total.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

MAX_LISTED_FAILURES = 25  # failures listed by name per check; the rest are only counted


@dataclasses.dataclass
class CheckResult:
    """One check's verdict.

    `name` is the JSON key (e.g. "integrity"); `figures` is JSON-able and is what the report
    plots; `failures` are human-readable sentences naming the offending shard/source/step/host.
    A check that could not run (missing input) has `passed=None` and says why in `summary`; a part
    of a check that could not run is named in `not_run` ({part: why}) — never silently dropped.
    """

    name: str
    title: str
    passed: bool | None
    summary: str
    failures: list[str] = dataclasses.field(default_factory=list)
    failure_count: int = 0
    figures: dict[str, Any] = dataclasses.field(default_factory=dict)
    not_run: dict[str, str] = dataclasses.field(default_factory=dict)
    taken_from: dict[str, str] | None = None  # {path, date}: reused from a previous audit, not checked now
    # why the verdict does not cover all of its input (audit.partial: it read shards that failed
    # integrity); with passed None: UNKNOWN, never a pass
    partial: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        for key in ("taken_from", "partial"):
            if out[key] is None:
                del out[key]
        return out

    @property
    def status(self) -> str:
        if self.passed is None and self.partial:
            return "UNKNOWN"
        return {True: "pass", False: "FAIL", None: "skipped"}[self.passed]


class FailureList:
    """Collects failure sentences, keeping the first `MAX_LISTED_FAILURES` and counting all."""

    def __init__(self, limit: int = MAX_LISTED_FAILURES):
        self.limit = limit
        self.items: list[str] = []
        self.count = 0

    def add(self, message: str) -> None:
        self.count += 1
        if len(self.items) < self.limit:
            self.items.append(message)

    def extend(self, other: FailureList) -> None:
        """Appends `other`'s failures (listed ones up to this list's limit; all counted)."""
        self.items.extend(other.items[: max(0, self.limit - len(self.items))])
        self.count += other.count

    def __bool__(self) -> bool:
        return self.count > 0


def result(
    name: str,
    title: str,
    failures: FailureList,
    ok_summary: str,
    figures: dict[str, Any],
    fail_summary: str | None = None,
    not_run: dict[str, str] | None = None,
) -> CheckResult:
    """Builds a CheckResult that passes iff `failures` is empty.

    The failing summary is `fail_summary` if given, else the first failure (plus a count).
    """
    if failures:
        summary = fail_summary or failures.items[0]
        if failures.count > 1 and fail_summary is None:
            summary += f" (and {failures.count - 1} more)"
        return CheckResult(name, title, False, summary, failures.items, failures.count, figures, dict(not_run or {}))
    if not_run:
        ok_summary += f" (not run: {', '.join(sorted(not_run))})"
    return CheckResult(name, title, True, ok_summary, [], 0, figures, dict(not_run or {}))


def combine(results: Sequence[CheckResult], labels: Sequence[str], sums: Sequence[str] = ()) -> CheckResult:
    """One check's per-manifest results (audited order) → one result over all manifests.

    A single result is returned unchanged. With several: it passes iff every one does; each
    failure is prefixed with its manifest's label; in figures, list rows gain a "manifest" key
    (plain strings are prefixed), the `sums` figures are added up, equal scalars are kept and
    differing ones become {label: value}. Shapes: len(results) == len(labels).
    """
    if len(results) == 1:
        return results[0]
    first = results[0]
    failures = FailureList()
    for r, label in zip(results, labels):
        for x in r.failures:
            failures.add(f"{label}: {x}")
        failures.count += r.failure_count - len(r.failures)  # the unlisted ones stay counted
    figures: dict[str, Any] = {}
    for key in dict.fromkeys(k for r in results for k in r.figures):
        values = [(label, r.figures[key]) for r, label in zip(results, labels) if key in r.figures]
        if all(isinstance(v, list) for _, v in values):
            figures[key] = [
                ({"manifest": label, **row} if isinstance(row, dict) else f"{label}: {row}")
                for label, v in values
                for row in v
            ]
        elif key in sums:
            figures[key] = sum(v for _, v in values)
        elif all(v == values[0][1] for _, v in values):
            figures[key] = values[0][1]
        else:
            figures[key] = dict(values)
    figures["manifests"] = list(labels)
    not_run = {part: why for r in results for part, why in r.not_run.items()}
    ok = f"{len(results)} manifests: " + "; ".join(f"{label}: {r.summary}" for r, label in zip(results, labels))
    return result(first.name, first.title, failures, ok, figures, not_run=not_run)


def mark_not_run(r: CheckResult, part: str, why: str) -> CheckResult:
    """Records that `part` of check `r` could not run, and why (in `not_run` and the summary)."""
    r.not_run[part] = why
    r.summary += f" (not run: {part})"
    return r


def skipped(name: str, title: str, why: str) -> CheckResult:
    return CheckResult(name, title, None, why, not_run={name: why})


def not_run_list(results: list[CheckResult]) -> list[dict[str, str]]:
    """Every check, or part of one, that did not run, with the reason: audit.json's `not_run`."""
    return [{"check": r.name, "part": part, "why": why} for r in results for part, why in r.not_run.items()]
