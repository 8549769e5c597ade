"""Reading a pipeline manifest and its shards (thin I/O; the checks stay pure).

Contract (README "Pipeline output"): `DIR/manifest.json` lists, per source and split, shards in
reading order with their record count and sha256; each record is `seq_len` little-endian uint32
token ids, written to ArrayRecord with `group_size:1`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Iterator
from typing import Any

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader

SPLITS = ("train", "heldout")
READ_CHUNK_RECORDS = 512  # records fetched per ArrayRecord call: bounds memory, amortises calls
HASH_CHUNK_BYTES = 1 << 20
RECORD_DTYPE = np.dtype("<u4")


class ManifestError(ValueError):
    """The manifest is missing a field the contract requires."""


@dataclasses.dataclass(frozen=True)
class ShardRef:
    source: str
    split: str
    path: str  # as written in the manifest: relative to the manifest's folder
    abspath: str
    records: int
    sha256: str


@dataclasses.dataclass(frozen=True)
class Manifest:
    path: str
    root: str
    raw: dict[str, Any]
    seq_len: int
    vocab_size: int
    eos_id: int
    pad_id: int
    tokenizer_name: str
    fingerprint: str
    source_names: tuple[str, ...]

    def source(self, name: str) -> dict[str, Any]:
        return self.raw["sources"][name]

    def shards(self, split: str, source: str | None = None) -> list[ShardRef]:
        names = self.source_names if source is None else (source,)
        out = []
        for name in names:
            entry = self.source(name).get("splits", {}).get(split, {})
            for shard in entry.get("shards", []):
                out.append(ShardRef(name, split, shard["path"], os.path.join(self.root, shard["path"]),
                                    int(shard["records"]), shard["sha256"]))
        return out

    def mixture_sources(self) -> list[dict[str, Any]]:
        return list(self.raw.get("mixture", {}).get("sources", []))


def _require(d: dict[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise ManifestError(f"{where}: missing required field {key!r}")
    return d[key]


def load_manifest(path: str) -> Manifest:
    """Loads and validates the fields the audit relies on; raises ManifestError naming the field."""
    with open(path, encoding="utf-8") as f:
        raw = json.load(f)
    tok = _require(raw, "tokenizer", path)
    sources = _require(raw, "sources", path)
    for name, entry in sources.items():
        where = f"{path}: sources.{name}"
        counts = _require(entry, "counts", where)
        for key in ("documents", "train", "heldout", "duplicates", "rejected"):
            _require(counts, key, f"{where}.counts")
        _require(entry, "splits", where)
    return Manifest(
        path=path,
        root=os.path.dirname(os.path.abspath(path)),
        raw=raw,
        seq_len=int(_require(raw, "seq_len", path)),
        vocab_size=int(_require(tok, "vocab_size", f"{path}: tokenizer")),
        eos_id=int(_require(tok, "eos_id", f"{path}: tokenizer")),
        pad_id=int(_require(tok, "pad_id", f"{path}: tokenizer")),
        tokenizer_name=str(tok.get("name", "dolma2")),
        fingerprint=str(raw.get("fingerprint", "")),
        source_names=tuple(sources),
    )


def file_sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def iter_record_chunks(path: str, chunk: int = READ_CHUNK_RECORDS) -> Iterator[list[bytes]]:
    """Yields the shard's records in order, `chunk` at a time (raw bytes, unvalidated)."""
    reader = ArrayRecordReader(path, "readahead_buffer_size:16M,max_parallelism:0")
    try:
        n = reader.num_records()
        for start in range(0, n, chunk):
            yield reader.read(start, min(n, start + chunk))
    finally:
        reader.close()


def num_records(path: str) -> int:
    reader = ArrayRecordReader(path)
    try:
        return reader.num_records()
    finally:
        reader.close()
