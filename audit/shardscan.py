"""The per-shard work of the data side (checks 1, 6, 7): one shard in, one `ShardScan` out.

Pure apart from reading the shard, so that a Beam worker can run it on any shard in any order
(audit/engine.py); `audit/merge.py` then replays the result in reading order, exactly as one
process streaming every shard would. Documents are cut with numpy (the EOS positions of a chunk
of records at once) and their per-document facts are computed as arrays (lengths, log2 bins,
sampling by digest); the only per-document Python left is one XXH3-128 call (xxhash).

A document that starts in an earlier shard (no EOS between the shard boundary and its end) can
only be completed by the merge: a shard reports the tokens before its first EOS (`head`) and
after its last (`tail`), and only the documents wholly inside it are processed here. Local
document ordinal 0 is the one that ends at the first EOS (head + whatever the previous shards
carried); the ones inside the shard are 1, 2, …
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import NamedTuple

import numpy as np
import xxhash
from apache_beam.io.filesystems import FileSystems

from audit.shard_reader import iter_record_chunks
from contract import HELDOUT, TOKEN_DTYPE, PackingProblems, parse_records
from pipelines import dolma2_tokenizer as tk
from pipelines.progress import Meter

from . import contamination, eval_leakage, statistics

MAX_BAD_RECORDS = 5  # malformed records named per shard (the rest are counted)
MAX_EXACT = 25  # exact copies named per shard (checks.MAX_LISTED_FAILURES over the whole audit)
HASH_BLOCK = 1 << 22
FILTER_BITS = 26  # the held-out 13-gram filter: 2^26 bits (8 MiB), ~5% false hits at 3·10^6 grams

Decoder = Callable[[np.ndarray], bytes]  # tokens → the bytes they encode (a tokenizer's decode_bytes)


class ShardTask(NamedTuple):
    """Everything a worker needs for one shard (picklable; no Manifest object)."""

    order: tuple[int, int, int, int]  # (split 0 held-out / 1 train, manifest, source, shard): reading order
    manifest: int
    source: str
    split: str
    path: str  # as the manifest lists it (for messages)
    abspath: str  # local path or any URL Beam's FileSystems reads
    seq_len: int
    vocab_size: int
    eos_id: int
    pad_id: int
    tokenizer: str | None  # decode sampled documents with it; None: no decoder
    heldout_rate: float
    train_rate: float
    tpb_rate: float
    expected_records: int = 0
    expected_sha256: str = ""


@dataclasses.dataclass
class ShardScan:
    """What one shard contributes. Record and document ordinals are local to the shard."""

    order: tuple[int, int, int, int]
    stream: tuple[int, str, str] = (0, "", "")  # (manifest, source, split)
    exists: bool = True
    sha256: str | None = None
    records: int = 0  # records read (also when reading stopped at an error)
    read_error: str | None = None
    io_error: str | None = None  # the shard's bytes could not be read at all (the audit exits 2 with it)
    bad_records: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    bad_record_count: int = 0
    stats: statistics.SplitStats | None = None  # documents wholly inside the shard; records all
    packing: PackingProblems = dataclasses.field(default_factory=PackingProblems)
    has_eos: bool = False
    head: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, TOKEN_DTYPE))
    tail: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, TOKEN_DTYPE))
    inner_docs: int = 0  # documents 1..inner_docs
    empty: int = 0  # empty inner documents (counted, never compared)
    # held-out: (local ordinal, digest) of every non-empty inner document; (local ordinal, 13-gram
    # hashes) of the sampled ones with a 13-gram; sampled ones too short for one
    digest_ordinals: list[np.ndarray] = dataclasses.field(default_factory=list)  # int64 per batch
    digests: list[bytes] = dataclasses.field(default_factory=list)  # 16 bytes per ordinal, per batch
    grams: list[tuple[int, np.ndarray]] = dataclasses.field(default_factory=list)
    short: int = 0
    # training: exact copies (local ordinal, the held-out document's position in the HeldoutIndex),
    # first MAX_EXACT + count; n-gram sample
    exact: list[tuple[int, int]] = dataclasses.field(default_factory=list)
    exact_count: int = 0
    sampled_train: int = 0
    contaminated: set = dataclasses.field(default_factory=set)
    # training, eval leakage (eval_leakage.py): counts, instances found, the first contaminated
    # documents and the histogram of the best decon scores, bounded in size
    leak: eval_leakage.Tally = dataclasses.field(default_factory=eval_leakage.Tally)


@dataclasses.dataclass(frozen=True)
class HeldoutIndex:
    """What training documents are checked against: every held-out digest → where it first
    occurs, and the sampled held-out 13-grams (sorted, distinct) → the k of the sampled held-out
    documents holding each: owners[ptr[i]:ptr[i+1]] for grams[i]. Arrays, not a dict per 13-gram:
    the index is a side input, copied to and sized by every worker."""

    key: np.ndarray  # uint64 [D]: the first 8 bytes of each distinct digest (little-endian), sorted …
    rest: np.ndarray  # uint64 [D]: … then by its last 8 (the index is sorted by the digest as two numbers)
    ordinal: np.ndarray  # int64 [D]: the document ordinal of its first occurrence …
    place: np.ndarray  # int64 [D]: … in the split named places[place]
    places: list[str]  # "source/heldout (ends in PATH[ of MANIFEST])"
    grams: np.ndarray  # uint64 [G]
    ptr: np.ndarray  # int64 [G + 1]
    owners: np.ndarray  # int64 [ptr[-1]]
    bloom: np.ndarray  # uint8 [2^(FILTER_BITS-3)]: bit (g >> (64 - FILTER_BITS)) set for every gram g

    @property
    def documents(self) -> int:
        """Distinct held-out documents."""
        return int(self.key.size)

    def where(self, i: int) -> str:
        return f"document {int(self.ordinal[i])} of {self.places[int(self.place[i])]}"

    def for_lookups(self) -> HeldoutIndex:
        """The index without where each document is (`where`: 16 of its 32 bytes per held-out
        document; the 13-gram filter is a fixed 2^(FILTER_BITS-3) bytes): what the workers need to
        find copies and 13-grams. A copy is named by its position in the index, which the driver,
        holding the whole index built from the same scans, turns into `where`."""
        empty = np.zeros(0, np.int64)
        return dataclasses.replace(self, ordinal=empty, place=empty, places=[])

    def find(self, digests: np.ndarray) -> np.ndarray:
        """Position in the index of each of `digests` (S16), -1 where absent. The digests are
        searched as two uint64 (a binary search over numbers costs half one over 16-byte strings)."""
        if not self.key.size or not digests.size:
            return np.full(digests.size, -1, np.int64)
        halves = _halves(digests)
        key, rest = halves[:, 0], halves[:, 1]
        pos = np.minimum(np.searchsorted(self.key, key), self.key.size - 1)
        same = self.key[pos] == key
        found = np.where(same & (self.rest[pos] == rest), pos, -1)
        for j in np.flatnonzero(same & (found < 0)).tolist():  # digests sharing their first 8 bytes
            lo, hi = int(pos[j]), int(np.searchsorted(self.key, key[j], "right"))
            p = lo + int(np.searchsorted(self.rest[lo:hi], rest[j]))
            if p < hi and self.rest[p] == rest[j]:
                found[j] = p
        return found

    @staticmethod
    def build(
        digests: np.ndarray, ordinal: np.ndarray, place: np.ndarray, places: list[str], grams: list[np.ndarray]
    ) -> HeldoutIndex:
        """digests (S16)/ordinal/place: every non-empty held-out document in reading order;
        grams[k]: the 13-gram hashes of the k-th sampled held-out document."""
        halves = _halves(digests)
        order = np.lexsort((halves[:, 1], halves[:, 0]))  # stable: equal digests stay in reading order
        srt = halves[order]
        first = np.ones(order.size, bool)  # the first occurrence of each distinct digest
        first[1:] = np.any(srt[1:] != srt[:-1], axis=1)
        first_d = order[first]
        flat = np.concatenate(grams) if grams else np.zeros(0, np.uint64)
        ks = np.repeat(np.arange(len(grams), dtype=np.int64), [g.size for g in grams])
        order = np.argsort(flat, kind="stable")
        uniq, first = np.unique(flat[order], return_index=True)
        bloom = np.zeros(1 << (FILTER_BITS - 3), np.uint8)
        top = uniq >> np.uint64(64 - FILTER_BITS)
        np.bitwise_or.at(
            bloom,
            (top >> np.uint64(3)).astype(np.int64),
            np.left_shift(1, (top & np.uint64(7)).astype(np.uint8)).astype(np.uint8),
        )
        return HeldoutIndex(
            halves[first_d, 0],
            halves[first_d, 1],
            ordinal[first_d],
            place[first_d],
            places,
            uniq,
            np.append(first, flat.size).astype(np.int64),
            ks[order],
            bloom,
        )

    def owners_of(self, grams: np.ndarray) -> np.ndarray:
        """The k of every sampled held-out document sharing one of `grams`."""
        if not self.grams.size or not grams.size:
            return np.zeros(0, np.int64)
        top = grams >> np.uint64(64 - FILTER_BITS)  # most grams are in no held-out document: a bit test
        grams = grams[
            (self.bloom[(top >> np.uint64(3)).astype(np.int64)] >> (top & np.uint64(7)).astype(np.uint8)) & 1 > 0
        ]
        if not grams.size:
            return np.zeros(0, np.int64)
        pos = np.minimum(np.searchsorted(self.grams, grams), self.grams.size - 1)
        pos = pos[self.grams[pos] == grams]
        if not pos.size:
            return np.zeros(0, np.int64)
        return np.concatenate([self.owners[self.ptr[i] : self.ptr[i + 1]] for i in pos.tolist()])


def _halves(digests: np.ndarray) -> np.ndarray:
    """S16 digests → uint64 [n, 2]: their first and last 8 bytes, little-endian."""
    return np.ascontiguousarray(digests, "S16").view("<u8").reshape(-1, 2)


def splits_docs(tokens: np.ndarray, eos_id: int) -> tuple[np.ndarray, np.ndarray]:
    """tokens (PAD removed) → (starts, ends) of every document that ends in them (end = its EOS)."""
    ends = np.flatnonzero(tokens == eos_id)
    starts = np.empty_like(ends)
    if ends.size:
        starts[0] = 0
        starts[1:] = ends[:-1] + 1
    return starts, ends


def digests_of(data: bytes | memoryview, starts: np.ndarray, ends: np.ndarray) -> list[bytes]:
    """`contamination.doc_digest` of each [start, end) token slice of `data` (uint32-le bytes)."""
    mv = memoryview(data)
    xxh = xxhash.xxh3_128_digest
    return [xxh(mv[4 * s : 4 * e]) for s, e in zip(starts.tolist(), ends.tolist())]


def sampled_mask(prefix: np.ndarray, rate: float) -> np.ndarray:
    """`contamination.sampled(d, rate)` for each digest, given their first 8 bytes as little-endian
    uint64 (`prefix`), as one comparison (exact: the float threshold rate·2⁶⁴ becomes the smallest
    integer not below it)."""
    threshold = math.ceil(rate * 2.0**64)
    if threshold >= 2**64:
        return np.ones(prefix.size, bool)
    return prefix < np.uint64(threshold)


def length_hist(lengths: np.ndarray) -> np.ndarray:
    """`SplitStats` log2 bins of document lengths."""
    lengths = np.maximum(lengths.astype(np.int64), 1)
    bins = np.minimum(np.floor(np.log2(lengths)).astype(np.int64), statistics.LENGTH_BINS - 1)
    return np.bincount(bins, minlength=statistics.LENGTH_BINS)


def packing_of(records: np.ndarray, n_pad: np.ndarray, eos_id: int, pad_id: int, into: PackingProblems) -> np.ndarray:
    """Adds the chunk's packing problems (as `DocumentSplitter.feed` counts them) and returns its
    tokens with PAD removed. n_pad: PAD tokens per record. Only the records with PAD (the last of
    a packing unit) are looked at token by token; a chunk without PAD is returned as a view."""
    seq_len = records.shape[1]
    rows = np.flatnonzero(n_pad)
    if not rows.size:
        return records.reshape(-1)
    is_pad = records[rows] == pad_id
    trailing = np.cumprod(is_pad[:, ::-1], axis=1).sum(axis=1)
    n = n_pad[rows]
    into.misplaced_pad += int(np.count_nonzero(trailing != n))
    into.all_pad_records += int(np.count_nonzero(n == seq_len))
    padded = np.flatnonzero((n < seq_len) & (trailing == n))
    last_real = records[rows[padded], seq_len - n[padded] - 1]
    into.cut_without_eos += int(np.count_nonzero(last_real != eos_id))
    return records[records != pad_id]


class DocWork:
    """The per-document facts of a batch of documents, for one split (shared by the shard pass
    and the merge, which completes the documents that cross shards)."""

    def __init__(
        self,
        task: ShardTask,
        decode_bytes: Decoder | None,
        index: HeldoutIndex | None,
        leak: eval_leakage.Detector | None = None,
    ) -> None:
        self.task, self.decode_bytes, self.index = task, decode_bytes, index
        self.leak = leak  # a pipelines.leakage.Detector for training documents, or None

    def run(
        self,
        out: ShardScan,
        st: statistics.SplitStats,
        data: bytes | memoryview,
        starts: np.ndarray,
        ends: np.ndarray,
        first_ordinal: int,
    ) -> None:
        t = self.task
        lengths = ends - starts
        st.documents += int(lengths.size)
        st.doc_tokens += int(lengths.sum())
        st.length_hist += length_hist(lengths)
        blob = b"".join(digests_of(data, starts, ends))
        digests = np.frombuffer(blob, "S16")  # contamination.DIGEST_BYTES
        prefix = np.frombuffer(blob, "<u8")[::2]
        nonempty = lengths > 0
        if self.decode_bytes is not None and t.tpb_rate > 0:
            for i in np.flatnonzero(sampled_mask(prefix, t.tpb_rate)).tolist():
                st.sampled_docs += 1
                st.sampled_tokens += int(lengths[i])
                st.sampled_bytes += len(self.decode_bytes(self._doc(data, starts[i], ends[i])))
        out.empty += int(lengths.size - np.count_nonzero(nonempty))
        idx = np.flatnonzero(nonempty)
        if t.split == HELDOUT:
            out.digest_ordinals.append(first_ordinal + idx)
            out.digests.append(digests[idx].tobytes())
            if self.decode_bytes is not None:
                mask = sampled_mask(prefix, t.heldout_rate) & nonempty
                for i in np.flatnonzero(mask).tolist():
                    g = contamination.ngram_hashes(self._text(data, starts[i], ends[i]))
                    if g.size:
                        out.grams.append((first_ordinal + i, g))
                    else:
                        out.short += 1
            return
        if self.leak is not None and idx.size:
            eval_leakage.scan_batch(
                self.leak, out.leak, np.frombuffer(data, TOKEN_DTYPE), starts, ends, idx, first_ordinal
            )
        if self.index is not None and self.index.documents and idx.size:
            found = self.index.find(digests[idx])
            for j in np.flatnonzero(found >= 0).tolist():
                out.exact_count += 1
                if len(out.exact) < MAX_EXACT:
                    out.exact.append((first_ordinal + int(idx[j]), int(found[j])))
        if self.decode_bytes is not None and self.index is not None and self.index.grams.size:
            for i in np.flatnonzero(sampled_mask(prefix, t.train_rate) & nonempty).tolist():
                out.sampled_train += 1
                hit = self.index.owners_of(contamination.ngram_hashes(self._text(data, starts[i], ends[i])))
                if hit.size:
                    out.contaminated.update(hit.tolist())

    @staticmethod
    def _doc(data: bytes | memoryview, s: int, e: int) -> np.ndarray:
        return np.frombuffer(data, TOKEN_DTYPE, count=int(e - s), offset=4 * int(s))

    def _text(self, data: bytes | memoryview, s: int, e: int) -> str:
        assert self.decode_bytes is not None  # called only with a decoder
        return self.decode_bytes(self._doc(data, s, e)).decode("utf-8", "replace")


def decoder(tokenizer: str | None) -> Decoder | None:
    """tokens → bytes with the named tokenizer (checked against the manifest by the driver)."""
    if tokenizer is None:
        return None

    enc = tk.get_tokenizer(tokenizer)
    return lambda toks: enc.decode_bytes(toks.tolist())


def _local_copy(task: ShardTask, tmpdir: str) -> tuple[str, str]:
    """(sha256 of the shard, a local path to read its records from), reading its bytes once: a
    local shard is hashed in place (`hashlib.file_digest`: one reused buffer, where 4 MiB reads
    cost ~4 µs more per record), a remote one is hashed while it is copied through Beam's
    FileSystems to `tmpdir` (ArrayRecord reads only local files)."""
    if os.path.exists(task.abspath):
        with open(task.abspath, "rb") as f:
            return hashlib.file_digest(f, "sha256").hexdigest(), task.abspath

    h = hashlib.sha256()
    dest = os.path.join(tmpdir, "shard.arrayrecord")
    with FileSystems.open(task.abspath, compression_type="uncompressed") as f, open(dest, "wb") as w:
        while block := f.read(HASH_BLOCK):
            h.update(block)
            w.write(block)
    return h.hexdigest(), dest


def exists(path: str) -> bool:
    return os.path.exists(path) or (not os.path.isabs(path) and FileSystems.exists(path))


def scan_shard(
    task: ShardTask,
    decode_bytes: Decoder | None,
    index: HeldoutIndex | None,
    leak: eval_leakage.Detector | None = None,
    meter: Meter | None = None,
) -> ShardScan:
    """Reads one shard (hash, records, documents) into a ShardScan; meter: a
    pipelines.progress.Meter counting the records read (the progress line), or None."""
    out = ShardScan(task.order, (task.manifest, task.source, task.split), stats=statistics.SplitStats(task.vocab_size))
    if not exists(task.abspath):
        out.exists = False
        return out
    work = DocWork(task, decode_bytes, index, leak)
    st = out.stats
    assert st is not None  # the ShardScan above is built with its stats
    tmpdir = tempfile.mkdtemp(prefix="audit-shard-")
    try:
        try:
            out.sha256, path = _local_copy(task, tmpdir)
        except OSError as e:  # e.g. a directory where the shard belongs: unusable input, not a finding
            out.io_error = str(e)
            return out
        carry = np.zeros(0, TOKEN_DTYPE)
        ordinal = 0  # local ordinal of the next document to end
        try:
            for raw in iter_record_chunks(path):
                arr, problems = parse_records(raw, task.seq_len, task.vocab_size)
                for i, reason in problems.bad:
                    out.bad_record_count += 1
                    if len(out.bad_records) < MAX_BAD_RECORDS:
                        out.bad_records.append((out.records + i, reason))
                out.records += len(raw)
                if meter is not None:
                    meter.add(records=len(raw))
                if not arr.shape[0]:
                    continue
                n_pad = st.add_records(arr, task.eos_id, task.pad_id)
                tokens = packing_of(arr, n_pad, task.eos_id, task.pad_id, out.packing)
                if carry.size:
                    tokens = np.concatenate([carry, tokens])
                starts, ends = splits_docs(tokens, task.eos_id)
                if not ends.size:  # the document goes on past this chunk
                    carry = tokens.copy()
                    continue
                rest = int(ends[-1]) + 1
                if not out.has_eos:  # document 0 (it may have begun in an earlier shard) is the merge's
                    out.has_eos = True
                    out.head = tokens[: ends[0]].copy()
                    starts, ends = starts[1:], ends[1:]
                    ordinal = 1
                if ends.size:
                    data = np.ascontiguousarray(tokens, TOKEN_DTYPE).data.cast("B")  # a memoryview: no copy
                    work.run(out, st, data, starts, ends, ordinal)
                    ordinal += int(ends.size)
                carry = tokens[rest:].copy()
        except Exception as e:  # noqa: BLE001 - a corrupt shard is a finding, not a crash
            out.read_error = f"{type(e).__name__}: {e}"
        out.inner_docs = ordinal - 1 if out.has_eos else 0
        if out.has_eos:
            out.tail = carry
        else:
            out.head = carry
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return out
