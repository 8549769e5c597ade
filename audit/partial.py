"""Verdicts that read a shard which failed integrity (check 1): never a plain pass.

The shard pass reads every shard once for checks 1, 6, 7 and 8, and the mixture's measured shares
use the PAD per training record it found. A shard whose sha256, record count or records do not
match the manifest (or that is missing, or cannot be read to its end) holds data that is not the
dataset's, read only as far as it could be: a check that read it cannot vouch for the dataset.
Such a check that would pass is UNKNOWN (`passed` None, its `partial` naming the shards, its
summary "not verified: …; on what was read: …"); one that fails keeps its FAIL and says that the
damaged shards may be why. The report and the command line then give the next command to run.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from contract import HELDOUT, TRAIN

from .checks import CheckResult

# check → the splits whose shards it reads (the mixture: only when it measured shares, from PAD)
READS = {
    "contamination": (HELDOUT, TRAIN),
    "statistics": (HELDOUT, TRAIN),
    "task_contamination": (TRAIN,),
    "mixture": (TRAIN,),
}
MAX_NAMED = 3  # shards named in a summary (all of them in the integrity check's table)


def failed_shards(integrity: CheckResult) -> list[dict[str, Any]]:
    """The rows of the integrity check's shard table (figures.shards) of shards that failed it:
    sha256, record count, malformed records, missing or unreadable."""
    rows = integrity.figures.get("shards") or []
    return [
        row
        for row in rows
        if isinstance(row, dict)
        and (
            not row.get("sha256_ok")
            or row.get("records") is None
            or row.get("records") != row.get("expected_records")
            or row.get("bad_records")
        )
    ]


def _name(row: dict[str, Any]) -> str:
    return f"{row['manifest']}:{row['path']}" if row.get("manifest") else str(row.get("path"))


def note(bad: Sequence[dict[str, Any]], total: int) -> str:
    """'1 of 12 shards failed integrity (check 1): code/train-00000-of-00002.arrayrecord'."""
    names = ", ".join(_name(r) for r in bad[:MAX_NAMED]) + (
        f" and {len(bad) - MAX_NAMED} more" if len(bad) > MAX_NAMED else ""
    )
    return f"{len(bad)} of {total} shard{'s' if total != 1 else ''} failed integrity (check 1): {names}"


def mark(r: CheckResult, bad: Sequence[dict[str, Any]], total: int) -> CheckResult:
    """r, marked as having read the shards `bad` (no change when it did not run, or is marked)."""
    if r.passed is None or r.partial:
        return r
    if r.name == "mixture" and not r.figures.get("measured_examples"):
        return r  # planned shares only: the manifests, no shard data
    splits = READS.get(r.name, ())
    mine = [row for row in bad if row.get("split") in splits]
    if not mine:
        return r
    r.partial = note(mine, total)
    read = "was read as it is" if len(mine) == 1 else "were read as they are"
    if r.passed:
        r.passed = None
        r.summary = f"not verified: {r.partial} {read}, as far as possible; on what was read: {r.summary}"
    else:
        r.summary += f" ({r.partial} {read}, as far as possible: the damage may be why)"
    return r


def apply(results: list[CheckResult]) -> list[CheckResult]:
    """Marks every check that read a shard which failed integrity (the integrity check's table)."""
    integrity = next((r for r in results if r.name == "integrity"), None)
    if integrity is None or integrity.passed is not False:
        return results
    bad = failed_shards(integrity)
    total = len(integrity.figures.get("shards") or [])
    return [mark(r, bad, total) if r.name in READS and bad else r for r in results]


def next_command(results: Sequence[CheckResult], command: str | None) -> str | None:
    """What to run next when shards failed integrity (None otherwise): put the manifest's shards
    back (they are the pipeline's output: restore them, or rebuild the dataset with the same
    mixture and flags), then this audit again."""
    integrity = next((r for r in results if r.name == "integrity"), None)
    bad = failed_shards(integrity) if integrity is not None and integrity.passed is False else []
    if not bad:
        return None
    again = command or "python -m audit --data MANIFEST --out DIR (this audit's command)"
    return (
        f"{len(bad)} shard{'s' if len(bad) != 1 else ''} failed integrity, so the checks that read "
        f"{'them' if len(bad) != 1 else 'it'} are not verified. Next: restore {'them' if len(bad) != 1 else 'it'} "
        "from the pipeline's output, or rebuild the dataset (python -m pipelines.tokenize --output DIR with "
        f"the mixture and flags it was built with), then run this audit again: {again}"
    )
