"""Reading: manifests and the split's ArrayRecord shards (thin I/O).

Each source's split is one Grain `ArrayRecordDataSource` over its shards in manifest
(reading) order, so the source's record ordinal is the data source's record key. At
open every shard's record count and writer options (`group_size:1`) and the size of its
first and last record are checked against the manifest; a mismatch is a clear error. The
manifest itself is read and validated (fingerprint recomputed) by the contract's
`Manifest.load` (`contract`).
Full checksum verification (sha256 of each shard against the manifest) is `dataloader.verify`,
which the trainer runs at start-up, and the audit's. A record that cannot be read mid-run (a
byte flipped since) raises ShardReadError naming the shard file and the record in it.

Records are read one per call with the data source's public `__getitem__` — Grain's own
random-access path (`reader.read([position])` on the file's shared reader, GIL released
while it decodes), so prefetch threads decode batches in parallel — and each is copied
straight into its row of the caller's array. Batched calls (`__getitems__`, or
`reader.read(positions)`) cost more CPU here: `__getitems__` starts a Python thread pool
per call and joins the bytes, and a multi-record `read` hands each record to
array_record's 64-thread pool, whose wake-ups and spinning cost more than the decode on a
small host (dataloader/README.md).
"""
from __future__ import annotations

import bisect
import os
from typing import Sequence

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader
from grain.sources import ArrayRecordDataSource

from dataloader.plan import SourceSpec
from contract import TOKEN_DTYPE, Manifest, record_bytes, writer_options_problem


class ShardReadError(RuntimeError):
    """A record of a shard cannot be read (ArrayRecord/Riegeli found the file corrupt): the
    message names the shard file, the record in it and how to find every damaged shard."""


def read_manifest(path: str) -> Manifest:
    """Reads and validates one manifest.json (`Manifest.load`: ManifestError on a contract
    violation or a fingerprint that does not match the content; FileNotFoundError)."""
    return Manifest.load(path)


def check_shard(path: str, expected_records: int, want_bytes: int) -> None:
    reader = ArrayRecordReader(path)
    try:
        n = reader.num_records()
        if n != expected_records:
            raise ValueError(f"{path}: {n} records, the manifest says {expected_records}")
        problem = writer_options_problem(reader.writer_options_string())
        if problem:
            raise ValueError(f"{path}: {problem}")
        for i in sorted({0, n - 1}) if n else []:
            size = len(reader.read([i])[0])
            if size != want_bytes:
                raise ValueError(f"{path}: record {i} has {size} bytes, expected {want_bytes} "
                                 f"(seq_len × 4)")
    finally:
        reader.close()


class SplitSource:
    """One source's split: `read_into(records int64 [k], out uint32 [n, seq_len], rows [k])`."""

    def __init__(self, manifest: Manifest, spec: SourceSpec, split: str):
        self.spec = spec
        self.seq_len = manifest.seq_len
        self._record_bytes = record_bytes(self.seq_len)
        info = manifest.source(spec.name)["splits"][split]
        shards = info["shards"]
        paths = [os.path.join(manifest.root, s["path"]) for s in shards]
        total = sum(int(s["records"]) for s in shards)
        if total != int(info["examples"]):
            raise ValueError(f"source {spec.name!r} {split}: shards hold {total} records, "
                             f"the manifest says {info['examples']} examples")
        for path, shard in zip(paths, shards):
            if not os.path.exists(path):
                raise FileNotFoundError(f"source {spec.name!r}: shard missing: {path}")
            check_shard(path, int(shard["records"]), self._record_bytes)
        # Shards with 0 records carry nothing to read (and ArrayRecordDataSource needs ≥ 1 path).
        counts = [int(s["records"]) for s in shards if int(s["records"])]
        paths = [p for p, s in zip(paths, shards) if int(s["records"])]
        self._paths, self._starts = paths, [0, *np.cumsum(counts).tolist()][:-1]
        self._manifest = manifest.path or manifest.root
        self._source = ArrayRecordDataSource(paths) if paths else None
        self.num_records = total
        if self._source is not None and len(self._source) != total:
            raise ValueError(f"source {spec.name!r}: ArrayRecordDataSource sees "
                             f"{len(self._source)} records, expected {total}")

    def read_into(self, records: np.ndarray, out: np.ndarray, rows: np.ndarray) -> None:
        """Copies records int64 [k] into out[rows] (out uint32 [n, seq_len], rows int [k])."""
        records = np.asarray(records, dtype=np.int64)
        if not len(records):
            return
        if records.min() < 0 or records.max() >= self.num_records:
            raise IndexError(f"source {self.spec.name!r}: record out of range [0, {self.num_records})")
        for rec, row in zip(records.tolist(), np.asarray(rows).tolist()):
            try:
                blob = self._source[rec]
            except Exception as e:  # noqa: BLE001 — Riegeli's corruption errors are RuntimeErrors, others vary
                raise self._read_error(rec, e) from e
            if len(blob) != self._record_bytes:
                raise ValueError(f"source {self.spec.name!r} record {rec}: {len(blob)} bytes, "
                                 f"not seq_len × 4 = {self._record_bytes}")
            out[row] = np.frombuffer(blob, dtype=TOKEN_DTYPE)

    def _read_error(self, rec: int, error: Exception) -> ShardReadError:
        k = bisect.bisect_right(self._starts, rec) - 1
        return ShardReadError(
            f"cannot read record {rec - self._starts[k]} of shard {self._paths[k]} (source {self.spec.name!r}; "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). The shard changed after "
            f"the tokenize job wrote it; `python -m audit --data {self._manifest}` names every damaged "
            "shard; restore them, or re-run the tokenize job")

    def read(self, records: np.ndarray) -> np.ndarray:
        """records int64 [k] → uint32 [k, seq_len]."""
        out = np.empty((len(records), self.seq_len), dtype=TOKEN_DTYPE)
        self.read_into(records, out, np.arange(len(records)))
        return out

    def close(self) -> None:
        if self._source is not None:
            self._source.__exit__(None, None, None)


def open_sources(manifests: Sequence[Manifest], specs: Sequence[SourceSpec],
                 split: str) -> list[SplitSource]:
    """One SplitSource per spec (same order); manifests as read by `read_manifest`."""
    by_name = {name: m for m in manifests for name in m["sources"]}
    return [SplitSource(by_name[s.name], s, split) for s in specs]
