"""Check 1 — integrity: every shard's sha256 and record count match the manifest, every record
is `seq_len` tokens below the vocabulary size, and records pack documents as the contract says.

`ShardReport` is filled by the streaming scan (scan.py); `check_integrity` is pure.
"""

from __future__ import annotations

import dataclasses
import os

from contract import REMAINDER_KEY, SPLITS, Manifest, PackingProblems

from .checks import CheckResult, FailureList, result

NAME, TITLE = "integrity", "1. Integrity"


@dataclasses.dataclass
class ShardReport:
    source: str
    split: str
    path: str
    expected_records: int
    expected_sha256: str
    exists: bool = True
    sha256: str | None = None
    records: int | None = None  # None when the shard could not be read
    read_error: str | None = None
    bad_records: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    bad_record_count: int = 0


def check_integrity(
    manifest: Manifest,
    shards: list[ShardReport],
    packing: dict[tuple[str, str], PackingProblems],
    unlisted: list[str],
    remainder_cut: dict[tuple[str, str], int] | None = None,
) -> CheckResult:
    """remainder_cut: (source, split) → shards of a token-file source that end inside a document
    (its other ids are in the file's dropped remainder); at most the manifest's remainder.documents."""
    f = FailureList()
    for s in shards:
        where = f"shard {s.path} ({s.source}/{s.split})"
        if not s.exists:
            f.add(f"{where}: file is missing")
            continue
        if s.sha256 != s.expected_sha256:
            f.add(f"{where}: sha256 {s.sha256} does not match the manifest's {s.expected_sha256}")
        if s.read_error is not None:
            f.add(f"{where}: cannot be read as ArrayRecord: {s.read_error}")
        elif s.records != s.expected_records:
            f.add(f"{where}: has {s.records} records, the manifest says {s.expected_records}")
        for ordinal, reason in s.bad_records:
            f.add(f"{where}: record {ordinal} {reason}")
        if s.bad_record_count > len(s.bad_records):
            f.add(f"{where}: {s.bad_record_count - len(s.bad_records)} more malformed records")
    for name in manifest.source_names:
        for split in SPLITS:
            entry = manifest.source(name)["splits"].get(split)
            if entry is None:
                continue
            listed = sum(int(sh["records"]) for sh in entry.get("shards", []))
            if int(entry.get("examples", listed)) != listed:
                f.add(
                    f"source {name}/{split}: manifest says {entry['examples']} examples but its shards "
                    f"list {listed} records"
                )
            p = packing.get((name, split))
            if p is None:
                continue
            if p.misplaced_pad:
                f.add(f"source {name}/{split}: {p.misplaced_pad} records have PAD that is not a trailing run")
            if p.cut_without_eos:
                f.add(
                    f"source {name}/{split}: {p.cut_without_eos} documents are cut (PAD or end of split "
                    f"before their EOS)"
                )
            cut = (remainder_cut or {}).get((name, split), 0)
            allowed = int(manifest.source(name).get(REMAINDER_KEY, {}).get("documents", 0))
            if cut > allowed:
                f.add(
                    f"source {name}/{split}: {cut} token-file shards end inside a document, but the "
                    f"manifest's remainder counts only {allowed} cut documents"
                )
            if p.all_pad_records:
                f.add(f"source {name}/{split}: {p.all_pad_records} records are entirely PAD")
    table = [
        {
            "source": s.source,
            "split": s.split,
            "path": s.path,
            "records": s.records,
            "expected_records": s.expected_records,
            "sha256_ok": s.sha256 == s.expected_sha256,
            "bad_records": s.bad_record_count,
        }
        for s in shards
    ]
    total = sum(s.records or 0 for s in shards)
    figures = {
        "shards": table,
        "records_checked": total,
        "seq_len": manifest.seq_len,
        "vocab_size": manifest.vocab_size,
        "unlisted_files": unlisted,
    }
    ok = (
        f"{len(shards)} shards, {total} records: sha256, record counts, record length "
        f"({manifest.seq_len} tokens) and token ids (< {manifest.vocab_size}) all match"
    )
    return result(NAME, TITLE, f, ok, figures)


def unlisted_shards(manifest: Manifest, also_listed: set[str] | frozenset[str] = frozenset()) -> list[str]:
    """ArrayRecord files under the manifest's folder that the manifest does not list (a warning:
    the loader never reads them, but they suggest a stale or partial write). also_listed: normalised
    absolute paths of shards that another audited manifest lists (a manifest in a subfolder)."""
    listed = {os.path.normpath(s.path) for split in SPLITS for s in manifest.shards(split)}
    found = []
    for dirpath, _, files in os.walk(manifest.root):
        for fn in files:
            if fn.endswith(".arrayrecord"):
                full = os.path.join(dirpath, fn)
                rel = os.path.normpath(os.path.relpath(full, manifest.root))
                if rel not in listed and os.path.normpath(os.path.abspath(full)) not in also_listed:
                    found.append(rel)
    return sorted(found)
