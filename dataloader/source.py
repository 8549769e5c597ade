"""Reading: manifests and the split's ArrayRecord shards (thin I/O).

Each source's split is one Grain `ArrayRecordDataSource` over its shards in manifest
(reading) order, so the source's record ordinal is the data source's record key. At
open every shard's record count and writer options (`group_size:1`) and the size of its
first and last record are checked against the manifest; a mismatch is a clear error.
Full checksum verification (sha256 of each shard) belongs to the audit.
"""
from __future__ import annotations

import json
import os
import re
from typing import Mapping, Sequence

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader
from grain.sources import ArrayRecordDataSource

from dataloader.plan import SourceSpec

FORMAT_VERSION = 1
RECORD_FORMAT = "uint32-le[seq_len]"
TOKEN_DTYPE = np.dtype("<u4")
_REQUIRED = ("format_version", "tokenizer", "seq_len", "record_format", "sources")


def read_manifest(path: str) -> dict:
    """Reads and validates one manifest.json; adds `_dir` (its folder, for shard paths)."""
    try:
        with open(path, encoding="utf-8") as f:
            manifest = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(f"manifest not found: {path} (run `python -m pipelines.tokenize`?)")
    missing = [k for k in _REQUIRED if k not in manifest]
    if missing:
        raise ValueError(f"{path}: manifest lacks {missing}")
    if manifest["format_version"] != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {manifest['format_version']} unsupported "
                         f"(this loader reads {FORMAT_VERSION})")
    if manifest["record_format"] != RECORD_FORMAT:
        raise ValueError(f"{path}: record_format {manifest['record_format']!r}, expected {RECORD_FORMAT!r}")
    manifest["_dir"] = os.path.dirname(os.path.abspath(path))
    return manifest


def _check_shard(path: str, expected_records: int, record_bytes: int) -> None:
    reader = ArrayRecordReader(path)
    try:
        n = reader.num_records()
        if n != expected_records:
            raise ValueError(f"{path}: {n} records, the manifest says {expected_records}")
        options = reader.writer_options_string()
        group = re.search(r"group_size:(\d+)", options)
        if options and (not group or group[1] != "1"):
            raise ValueError(f"{path}: written with writer options {options!r}; the contract is "
                             "group_size:1 (needed for fast random access)")
        for i in sorted({0, n - 1}) if n else []:
            size = len(reader.read([i])[0])
            if size != record_bytes:
                raise ValueError(f"{path}: record {i} has {size} bytes, expected {record_bytes} "
                                 f"(seq_len × 4)")
    finally:
        reader.close()


class SplitSource:
    """One source's split: `read(records int64 [k]) → uint32 [k, seq_len]`."""

    def __init__(self, manifest: Mapping, spec: SourceSpec, split: str):
        self.spec = spec
        self.seq_len = int(manifest["seq_len"])
        info = manifest["sources"][spec.name]["splits"][split]
        shards = info["shards"]
        paths = [os.path.join(manifest["_dir"], s["path"]) for s in shards]
        total = sum(int(s["records"]) for s in shards)
        if total != int(info["examples"]):
            raise ValueError(f"source {spec.name!r} {split}: shards hold {total} records, "
                             f"the manifest says {info['examples']} examples")
        for path, shard in zip(paths, shards):
            if not os.path.exists(path):
                raise FileNotFoundError(f"source {spec.name!r}: shard missing: {path}")
            _check_shard(path, int(shard["records"]), self.seq_len * TOKEN_DTYPE.itemsize)
        # Shards with 0 records carry nothing to read (and ArrayRecordDataSource needs ≥ 1 path).
        paths = [p for p, s in zip(paths, shards) if int(s["records"])]
        self._source = ArrayRecordDataSource(paths) if paths else None
        if self._source is not None and len(self._source) != total:
            raise ValueError(f"source {spec.name!r}: ArrayRecordDataSource sees "
                             f"{len(self._source)} records, expected {total}")

    def read(self, records: np.ndarray) -> np.ndarray:
        records = np.asarray(records, dtype=np.int64)
        out = np.empty((len(records), self.seq_len), dtype=TOKEN_DTYPE)
        if not len(records):
            return out
        raw = self._source.__getitems__(records.tolist())
        sizes = {len(blob) for blob in raw}
        if sizes != {out.shape[1] * TOKEN_DTYPE.itemsize}:
            bad = [r for r, b in zip(records.tolist(), raw) if len(b) != out.shape[1] * TOKEN_DTYPE.itemsize]
            raise ValueError(f"source {self.spec.name!r} records {bad[:8]}: size is not seq_len × 4 "
                             f"= {out.shape[1] * TOKEN_DTYPE.itemsize} bytes")
        out[:] = np.frombuffer(b"".join(raw), dtype=TOKEN_DTYPE).reshape(out.shape)
        return out

    def close(self) -> None:
        if self._source is not None:
            self._source.__exit__(None, None, None)


def open_sources(manifests: Sequence[Mapping], specs: Sequence[SourceSpec],
                 split: str) -> list[SplitSource]:
    """One SplitSource per spec (same order); manifests as read by `read_manifest`."""
    by_name = {name: m for m in manifests for name in m["sources"]}
    return [SplitSource(by_name[s.name], s, split) for s in specs]
