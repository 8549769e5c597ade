"""manifest.json: counts, token totals, shard lists and a content fingerprint (pure functions).

Everything in the manifest is a function of the inputs and the mixture: no times, hosts or
worker counts. The layout, validation and fingerprint are the contract's
(`contract.manifest`); this module only assembles a manifest from the job's results.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from contract import FORMAT_VERSION, MANIFEST_NAME, RECORD_FORMAT, SPLITS, TokenizerInfo, dumps, fingerprint, validate
from contract.errors import Stopped
from contract.manifest import REMAINDER_KEY
from pipelines import dolma2_tokenizer as tk

__all__ = [
    "AccountingError",
    "tokenizer_info",
    "empty_source_entry",
    "build_sources",
    "build_manifest",
    "FORMAT_VERSION",
    "MANIFEST_NAME",
    "RECORD_FORMAT",
    "dumps",
    "fingerprint",
]


class AccountingError(Stopped, RuntimeError):
    """The job's counts do not add up: a document would be lost or counted twice."""


def tokenizer_info(name: str) -> dict[str, Any]:
    v = tk.vocabulary(name)  # raises a clear error for unknown names
    return TokenizerInfo(
        name=name, vocab_size=v.vocab_size, eos_id=v.eos_id, pad_id=v.pad_id, ranks_sha256=v.ranks_sha256
    ).to_json()


def empty_source_entry(reasons: Iterable[str] = ()) -> dict[str, Any]:
    return {
        "counts": {"documents": 0, "train": 0, "heldout": 0, "duplicates": 0, "rejected": {r: 0 for r in reasons}},
        "tokens": {"train": 0, "heldout": 0, "padding": 0},
        "splits": {s: {"examples": 0, "shards": []} for s in SPLITS},
    }


def build_sources(
    source_names: Iterable[str],
    tallies: Iterable[tuple[tuple[str, str], int]],
    shards: Iterable[Mapping[str, Any]],
    reasons: Iterable[str] | Mapping[str, Iterable[str]] = (),
) -> dict[str, Any]:
    """Assemble the per-source section and check that every document is accounted for.

    tallies: ((source, "documents" | "duplicates" | "rejected/<reason>"), n), summed or not.
    shards: dicts with source, split, index, count, path, records, sha256, documents, tokens, padding
      (tokens = document tokens including EOS; padding = PAD tokens) — one per written shard.
    reasons: reject reasons always listed (with 0) so every manifest has the same keys; or
      {source: reasons} when sources differ (jsonl and tokens sources reject for other reasons).
    Shards of tokens sources also carry dropped_tokens and documents_cut: summed into the
    source's `remainder` {tokens, documents} (contract.manifest.REMAINDER_KEY).
    """
    names = list(source_names)
    per_source = reasons if isinstance(reasons, Mapping) else {n: tuple(reasons) for n in names}
    out = {n: empty_source_entry(per_source.get(n, ())) for n in names}
    for (source, key), n in tallies:
        if source not in out:
            raise AccountingError(f"tally for unknown source {source!r}")
        c = out[source]["counts"]
        if key.startswith("rejected/"):
            reason = key.split("/", 1)[1]
            c["rejected"][reason] = c["rejected"].get(reason, 0) + n
        elif key in ("documents", "duplicates"):
            c[key] += n
        else:
            raise AccountingError(f"unknown tally {key!r}")
    by_split: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for sh in shards:
        if sh["source"] not in out or sh["split"] not in SPLITS:
            raise AccountingError(f"shard for unknown source/split: {sh['path']}")
        by_split.setdefault((sh["source"], sh["split"]), []).append(sh)
    for (source, split), lst in by_split.items():
        lst.sort(key=lambda s: s["index"])
        count = lst[0]["count"]
        if [s["index"] for s in lst] != list(range(count)) or any(s["count"] != count for s in lst):
            raise AccountingError(f"{source}/{split}: shards {[s['path'] for s in lst]} are not 0..{count - 1}")
        entry = out[source]
        entry["counts"][split] = sum(s["documents"] for s in lst)
        entry["tokens"][split] = sum(s["tokens"] for s in lst)
        entry["tokens"]["padding"] += sum(s["padding"] for s in lst)
        if any("dropped_tokens" in s for s in lst):
            rem = entry.setdefault(REMAINDER_KEY, {"tokens": 0, "documents": 0})
            rem["tokens"] += sum(s.get("dropped_tokens", 0) for s in lst)
            rem["documents"] += sum(s.get("documents_cut", 0) for s in lst)
        entry["splits"][split] = {
            "examples": sum(s["records"] for s in lst),
            "shards": [{"path": s["path"], "records": s["records"], "sha256": s["sha256"]} for s in lst],
        }
    for name, entry in out.items():
        c = entry["counts"]
        c["rejected"] = dict(sorted(c["rejected"].items()))
        placed = c["train"] + c["heldout"] + c["duplicates"] + sum(c["rejected"].values())
        if placed != c["documents"]:
            raise AccountingError(
                f"{name}: {c['documents']} documents read but {placed} placed "
                f"(train {c['train']}, heldout {c['heldout']}, duplicates {c['duplicates']}, rejected {c['rejected']})"
            )
    return out


def build_manifest(
    mixture: Mapping[str, Any],
    tokenizer: Mapping[str, Any],
    tallies: Iterable[tuple[tuple[str, str], int]],
    shards: Iterable[Mapping[str, Any]],
    reasons: Iterable[str] | Mapping[str, Iterable[str]] = (),
) -> dict[str, Any]:
    """The whole manifest (`contract.manifest`), fingerprint included and validated."""
    names = [s["name"] for s in mixture["sources"]]
    m: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "tokenizer": dict(tokenizer),
        "seq_len": mixture["seq_len"],
        "record_format": RECORD_FORMAT,
        "mixture": copy.deepcopy(dict(mixture)),
        "fingerprint": "",
        "sources": build_sources(names, tallies, shards, reasons),
    }
    m["fingerprint"] = fingerprint(m)
    validate(m, "the manifest being built")  # the writer writes only what every reader accepts
    return m
