"""Reading: manifests and the split's ArrayRecord shards (thin I/O).

A source's split is its shards in manifest (reading) order; the source's record ordinal r is
record r − start(k) of the shard k that holds it. At open every shard's record count and writer
options (`group_size:1`) and the size of its first and last record are checked against the
manifest, every source's shards at once on a bounded thread pool (`check_shards`; the error names
the first bad shard in reading order, whatever the threads' timing). The manifest itself is read
and validated (fingerprint recomputed, shard paths inside its folder) by the contract's
`Manifest.load` (`contract`).
Full checksum verification (sha256 of each shard against the manifest) is `dataloader.verify`,
which the trainer runs at start-up, and the audit's. A record that cannot be read mid-run (a
byte flipped since) raises ShardReadError naming the shard file and the record in it.

Each shard is read through a Grain `ArrayRecordDataSource` of that one file, made on the shard's
first read (given its record count, so making it opens nothing; Grain opens the reader on the
first record read); at most `max_open_shards` are open at once, the least recently read closed
first (`_OpenShards`; an open reader holds its shard's index in memory: READER_INDEX_BYTES_PER_RECORD
per record, READER_BYTES_PER_SHARD per shard, `reader_host_bytes`).

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
import collections
import concurrent.futures
import dataclasses
import os
import threading
from collections.abc import Sequence

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader
from grain.sources import ArrayRecordDataSource

from contract import TOKEN_DTYPE, Manifest, record_bytes, writer_options_problem
from contract.errors import Stopped
from dataloader.plan import SourceSpec

CHECK_THREADS = 32  # shard checks at open in flight at once (I/O waits, not CPU)
# ArrayRecord's random-access options: no footer prefetch, no readahead (Grain adds that one itself),
# so opening a shard reads its footer and index (~0.1 MB measured), not a 1 MiB prefetch, and a
# record costs its own bytes (tests/dataloader/test_shard_readers.py counts them)
READER_OPTIONS = {"footer_prefetch_bytes": "0"}  # (Grain's own: readahead_buffer_size 0)
DEFAULT_MAX_OPEN_SHARDS = 1024  # shard readers a source keeps open at once (LoaderConfig.max_open_shards)
# What an open reader holds (Grain's ArrayRecordDataSource reader, index in memory), measured by
# `python -m bench.loader_readers` (bench/RESULTS.md#loader-shard-readers): a uint64 chunk offset
# per record (group_size:1: one record per chunk; measured 8.04 B) and the reader's state per file
# (measured 2.3 KiB, counted as 4 KiB).
READER_INDEX_BYTES_PER_RECORD = 8
READER_BYTES_PER_SHARD = 4 * 1024


class ShardReadError(Stopped, RuntimeError):
    """A record of a shard cannot be read (ArrayRecord/Riegeli found the file corrupt): the
    message names the shard file, the record in it and how to find every damaged shard."""


def read_manifest(path: str) -> Manifest:
    """Reads and validates one manifest.json (`Manifest.load`: ManifestError on a contract
    violation or a fingerprint that does not match the content; FileNotFoundError)."""
    return Manifest.load(path)


def check_shard(path: str, expected_records: int, want_bytes: int) -> None:
    """Opens the shard and checks its record count, writer options and the size of its first and
    last record; ValueError (one line, naming the file) when any is not what the manifest says."""
    try:
        reader = ArrayRecordReader(path, "readahead_buffer_size:0,footer_prefetch_bytes:0")
    except Exception as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise ValueError(f"{path}: cannot be opened as an ArrayRecord file ({first})") from e
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
                raise ValueError(f"{path}: record {i} has {size} bytes, expected {want_bytes} (seq_len × 4)")
    finally:
        reader.close()


# The shards this process saw verified at this start (trainer.preflight.check_shards, dataloader.verify: hashed equal
# to the manifest now, or vouched for by the run's record), path -> stamp. The loader skips its
# open-time structure check (here) for them while their size and mtime are unchanged:
# a shard whose bytes have the manifest's sha256 has the structure the tokenize job wrote. Process-
# wide because start-up's check and the loader's open are apart (one start per process).
_VERIFIED: dict[str, tuple[int, int]] = {}


def vouch(verified: dict[str, tuple[int, int]]) -> None:
    _VERIFIED.clear()
    _VERIFIED.update(verified)


def vouched(path: str) -> bool:
    """``path`` was verified at this start and its size and mtime are unchanged since."""
    seen = _VERIFIED.get(path)
    try:
        return seen is not None and _stamp(path) == seen
    except OSError:
        return False


def _stamp(path: str) -> tuple[int, int]:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


@dataclasses.dataclass(frozen=True)
class ShardCheck:
    """One shard to check at open: its file, the records the manifest gives it, its source."""

    path: str
    records: int
    record_bytes: int
    source: str


def _check_one(c: ShardCheck) -> None:
    if vouched(c.path):  # hashed equal to the manifest at this start (or recorded so): not opened
        return
    if not os.path.exists(c.path):
        raise FileNotFoundError(f"source {c.source!r}: shard missing: {c.path}")
    check_shard(c.path, c.records, c.record_bytes)


def check_shards(checks: Sequence[ShardCheck], threads: int = CHECK_THREADS) -> None:
    """Checks every shard (`check_shard`, and that it exists) on a bounded thread pool: each check
    is a few small reads, a network round trip each on gcsfuse or NFS, so the threads overlap the
    waits (40,000 shards at 10 ms per open: ~14 s with 32 threads, ~7.4 min on one; measured in
    bench/RESULTS.md#loader-shard-readers). Raises the error of the FIRST bad shard in `checks`' order,
    whatever the threads' timing; the checks after it that have not started are cancelled."""
    if threads <= 1 or len(checks) <= 1:
        for c in checks:
            _check_one(c)
        return
    with concurrent.futures.ThreadPoolExecutor(min(threads, len(checks)), thread_name_prefix="shard-check") as pool:
        futures = [pool.submit(_check_one, c) for c in checks]
        try:
            for f in futures:  # in order: the first failure in manifest order is raised
                f.result()
        finally:
            for f in futures:
                f.cancel()


@dataclasses.dataclass(frozen=True)
class _WholeFile:
    """Grain's FileInstruction protocol (filename, skip, take, examples_in_shard): given one,
    ArrayRecordDataSource takes the record count from it instead of opening the file."""

    filename: str
    skip: int
    take: int
    examples_in_shard: int


class _OpenShards:
    """The split's shards, each a Grain `ArrayRecordDataSource` of one file made on first read, at
    most `max_open` of them open at once (least recently read closed first; None: no bound).

    Why not one ArrayRecordDataSource over every file: it keeps every reader it opens until it is
    closed, and each holds its shard's index in memory (READER_INDEX_BYTES_PER_RECORD per record,
    plus READER_BYTES_PER_SHARD), so a host that reads from every shard of a shuffled epoch ends up
    holding them all (dataloader/README.md#shards-at-start-up-and-reader-memory). A reader busy in another thread is never
    closed under it: the bound is exceeded for as long as more threads read at once than it
    allows."""

    def __init__(self, paths: Sequence[str], counts: Sequence[int], max_open: int | None):
        if max_open is not None and max_open < 1:
            raise ValueError(f"max_open_shards must be ≥ 1 or None, got {max_open}")
        self._files = [_WholeFile(p, 0, n, n) for p, n in zip(paths, counts)]
        self._max_open = max_open
        self._open: collections.OrderedDict[int, ArrayRecordDataSource] = collections.OrderedDict()
        self._busy: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()

    def read(self, shard: int, position: int) -> bytes:
        if self._max_open is None:  # nothing is ever closed: no bookkeeping past the first read
            source = self._open.get(shard)
            if source is not None:
                return source[position]
        with self._lock:
            source = self._open.get(shard)
            if source is None:
                source = self._open[shard] = ArrayRecordDataSource(  # no I/O yet
                    [self._files[shard]], reader_options=dict(READER_OPTIONS)
                )
            else:
                self._open.move_to_end(shard)
            self._busy[shard] += 1
            self._evict()
        try:
            return source[position]  # Grain opens the reader on first read (lazily)
        finally:
            with self._lock:
                self._busy[shard] -= 1
                self._evict()

    def _evict(self) -> None:
        if self._max_open is None:
            return
        while len(self._open) > self._max_open:
            idle = next((k for k in self._open if not self._busy[k]), None)
            if idle is None:
                return
            self._open.pop(idle).__exit__(None, None, None)

    @property
    def open_count(self) -> int:
        return len(self._open)

    def close(self) -> None:
        with self._lock:
            for source in self._open.values():
                source.__exit__(None, None, None)
            self._open.clear()


class SplitSource:
    """One source's split: `read_into(records int64 [k], out uint32 [n, seq_len], rows [k])`.

    check: run `check_shards` over its shards now (`open_sources` checks every source's at once
    instead). max_open_shards: readers held open at once (None: every shard read so far)."""

    def __init__(
        self,
        manifest: Manifest,
        spec: SourceSpec,
        split: str,
        *,
        check: bool = True,
        max_open_shards: int | None = None,
    ):
        self.spec = spec
        self.seq_len = manifest.seq_len
        self._record_bytes = record_bytes(self.seq_len)
        shards = split_shards(manifest, spec.name, split)
        if check:
            check_shards([ShardCheck(p, n, self._record_bytes, spec.name) for p, n in shards])
        # Shards with 0 records carry nothing to read.
        shards = [(p, n) for p, n in shards if n]
        self._paths = [p for p, _ in shards]
        counts = [n for _, n in shards]
        self._starts = [0, *np.cumsum(counts).tolist()][:-1]
        self._manifest = manifest.path or manifest.root
        self._shards = _OpenShards(self._paths, counts, max_open_shards)
        self.num_records = sum(counts)

    @property
    def open_shards(self) -> int:
        """Shards whose reader is open now."""
        return self._shards.open_count

    def read_into(self, records: np.ndarray, out: np.ndarray, rows: np.ndarray) -> None:
        """Copies records int64 [k] into out[rows] (out uint32 [n, seq_len], rows int [k])."""
        records = np.asarray(records, dtype=np.int64)
        if not len(records):
            return
        if records.min() < 0 or records.max() >= self.num_records:
            raise IndexError(f"source {self.spec.name!r}: record out of range [0, {self.num_records})")
        shard_of = np.searchsorted(self._starts, records, side="right") - 1
        for rec, k, row in zip(records.tolist(), shard_of.tolist(), np.asarray(rows).tolist()):
            try:
                blob = self._shards.read(k, rec - self._starts[k])
            except Exception as e:
                raise self._read_error(rec, e) from e
            if len(blob) != self._record_bytes:
                raise ValueError(
                    f"source {self.spec.name!r} record {rec}: {len(blob)} bytes, not seq_len × 4 = {self._record_bytes}"
                )
            out[row] = np.frombuffer(blob, dtype=TOKEN_DTYPE)

    def _read_error(self, rec: int, error: Exception) -> ShardReadError:
        k = bisect.bisect_right(self._starts, rec) - 1
        return ShardReadError(
            f"cannot read record {rec - self._starts[k]} of shard {self._paths[k]} (source {self.spec.name!r}; "
            f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}). The shard changed after "
            f"the tokenize job wrote it; `python -m audit --data {self._manifest}` names every damaged "
            "shard; restore them, or re-run the tokenize job"
        )

    def read(self, records: np.ndarray) -> np.ndarray:
        """records int64 [k] → uint32 [k, seq_len]."""
        out = np.empty((len(records), self.seq_len), dtype=TOKEN_DTYPE)
        self.read_into(records, out, np.arange(len(records)))
        return out

    def close(self) -> None:
        self._shards.close()


def reader_bytes(manifest: Manifest, source: str, split: str, max_open_shards: int | None) -> int:
    """The most memory a source's split's open readers can hold: its `max_open_shards` largest
    shards (every shard when None), each READER_BYTES_PER_SHARD + READER_INDEX_BYTES_PER_RECORD
    per record. No I/O: from the manifest's record counts."""
    counts = sorted((n for _, n in split_shards(manifest, source, split) if n), reverse=True)
    held = counts if max_open_shards is None else counts[:max_open_shards]
    return len(held) * READER_BYTES_PER_SHARD + READER_INDEX_BYTES_PER_RECORD * sum(held)


def split_shards(manifest: Manifest, source: str, split: str) -> list[tuple[str, int]]:
    """(path, records) of a source's split, in reading order; ValueError when the records do not
    add up to the split's examples."""
    info = manifest.source(source)["splits"][split]
    shards = [(os.path.join(manifest.root, s["path"]), int(s["records"])) for s in info["shards"]]
    total = sum(n for _, n in shards)
    if total != int(info["examples"]):
        raise ValueError(
            f"source {source!r} {split}: shards hold {total} records, the manifest says {info['examples']} examples"
        )
    return shards


def open_sources(
    manifests: Sequence[Manifest], specs: Sequence[SourceSpec], split: str, max_open_shards: int | None = None
) -> list[SplitSource]:
    """One SplitSource per spec (same order); manifests as read by `read_manifest`. Every shard of
    every source is checked first, at once (`check_shards`: the first bad one in reading order is
    the error)."""
    by_name = {name: m for m in manifests for name in m["sources"]}
    checks = [
        ShardCheck(p, n, record_bytes(by_name[s.name].seq_len), s.name)
        for s in specs
        for p, n in split_shards(by_name[s.name], s.name, split)
    ]
    check_shards(checks)
    return [SplitSource(by_name[s.name], s, split, check=False, max_open_shards=max_open_shards) for s in specs]
