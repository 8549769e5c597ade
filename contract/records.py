"""Records: the on-disk layout of one example, and documents recovered from records (pure).

A record is one ArrayRecord record of exactly `seq_len` little-endian uint32 token ids
(`TOKEN_DTYPE`, `RECORD_FORMAT`), written with `WRITER_OPTIONS` (`group_size:1`, so every
record can be read on its own). Packing: each document's ids are followed by EOS, the
documents of one packing unit (one shard) are concatenated and cut into records; only the
unit's last record is PAD-filled (one trailing PAD run). Best-fit packing
(`pipelines.bestfit`) PAD-fills many records, each with one trailing PAD run after an EOS, and
writes a split document's pieces in consecutive records. So dropping PAD and cutting after
every EOS recovers the documents exactly: `unpack` (in memory) and `DocumentSplitter`
(streamed over record chunks and shards) are that inverse.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator

import numpy as np

TOKEN_DTYPE = np.dtype("<u4")  # little-endian uint32 token ids
RECORD_FORMAT = "uint32-le[seq_len]"  # the manifest's `record_format`
GROUP_SIZE = 1  # ArrayRecord group size: one record per chunk, for O(1) random access
WRITER_OPTIONS = f"group_size:{GROUP_SIZE}"


def record_bytes(seq_len: int) -> int:
    """Bytes of one record: seq_len × 4."""
    return int(seq_len) * TOKEN_DTYPE.itemsize


def writer_options_problem(options: str) -> str | None:
    """Why ArrayRecord writer options (as `writer_options_string()` returns them) break the
    contract, or None. An empty string (old files that do not record options) is accepted."""
    if not options:
        return None
    group = re.search(r"group_size:(\d+)", options)
    if not group or int(group[1]) != GROUP_SIZE:
        return (
            f"written with writer options {options!r}; the contract is {WRITER_OPTIONS} (needed for fast random access)"
        )
    return None


def decode_record(record: bytes, seq_len: int) -> np.ndarray:
    """One record → `[seq_len]` uint32 array, checking its size."""
    if len(record) != record_bytes(seq_len):
        raise ValueError(f"record has {len(record)} bytes, expected {record_bytes(seq_len)}")
    return np.frombuffer(record, dtype=TOKEN_DTYPE)


@dataclasses.dataclass
class RecordProblems:
    """Malformed records in one chunk: `(record_ordinal_in_chunk, reason)` pairs."""

    bad: list[tuple[int, str]]


def parse_records(raw: list[bytes], seq_len: int, vocab_size: int) -> tuple[np.ndarray, RecordProblems]:
    """Raw record bytes → `[n_ok, seq_len]` uint32 array of the well-formed ones, plus problems.

    A record is well-formed when it is exactly `seq_len` uint32 tokens, all `< vocab_size`.
    """
    want = record_bytes(seq_len)
    bad: list[tuple[int, str]] = []
    ok_idx = []
    for i, rec in enumerate(raw):
        if len(rec) != want:
            bad.append((i, f"has {len(rec)} bytes, expected {want} ({seq_len} uint32 tokens)"))
        else:
            ok_idx.append(i)
    if not ok_idx:
        return np.zeros((0, seq_len), TOKEN_DTYPE), RecordProblems(bad)
    joined = b"".join(raw[i] for i in ok_idx) if len(ok_idx) < len(raw) else b"".join(raw)
    arr = np.frombuffer(joined, TOKEN_DTYPE).reshape(len(ok_idx), seq_len)
    too_big = np.flatnonzero(arr.max(axis=1) >= vocab_size)
    if too_big.size:
        for j in too_big:
            bad.append((ok_idx[j], f"has token id {int(arr[j].max())} >= vocabulary size {vocab_size}"))
        keep = np.ones(len(ok_idx), bool)
        keep[too_big] = False
        arr = arr[keep]
    bad.sort()
    return arr, RecordProblems(bad)


@dataclasses.dataclass
class PackingProblems:
    misplaced_pad: int = 0  # records where PAD is not one trailing run
    cut_without_eos: int = 0  # a PAD run (or the end of the split) that cuts a document before its EOS
    all_pad_records: int = 0


class DocumentSplitter:
    """Streams records of one split (in reading order) and yields documents.

    Carries a partial document across record chunks and shards; `finish()` reports a trailing
    fragment (tokens after the last EOS), which a correct pipeline never writes.
    """

    def __init__(self, eos_id: int, pad_id: int):
        self.eos_id = eos_id
        self.pad_id = pad_id
        self.carry = np.zeros(0, TOKEN_DTYPE)
        self.problems = PackingProblems()

    def feed(self, records: np.ndarray) -> Iterator[np.ndarray]:
        """records: `[n, seq_len]` uint32. Yields each completed document (without EOS)."""
        if records.shape[0] == 0:
            return
        seq_len = records.shape[1]
        is_pad = records == self.pad_id
        n_pad = is_pad.sum(axis=1)
        trailing = np.cumprod(is_pad[:, ::-1], axis=1).sum(axis=1)
        self.problems.misplaced_pad += int(np.count_nonzero(trailing != n_pad))
        self.problems.all_pad_records += int(np.count_nonzero(n_pad == seq_len))
        padded = np.flatnonzero((n_pad > 0) & (n_pad < seq_len) & (trailing == n_pad))
        last_real = records[padded, seq_len - n_pad[padded] - 1]
        cut_rows = padded[last_real != self.eos_id]
        self.problems.cut_without_eos += int(cut_rows.size)
        tokens = records[~is_pad]
        if self.carry.size:
            tokens = np.concatenate([self.carry, tokens])
        ends = np.flatnonzero(tokens == self.eos_id)
        start = 0
        for end in ends:
            yield tokens[start:end]
            start = int(end) + 1
        self.carry = tokens[start:].copy()

    def finish(self) -> int:
        """Ends the split; returns the length of the trailing fragment (0 when well packed)."""
        n = int(self.carry.size)
        if n:
            self.problems.cut_without_eos += 1
        self.carry = np.zeros(0, TOKEN_DTYPE)
        return n


def unpack(examples: Iterable[np.ndarray], eos_id: int, pad_id: int) -> list[list[int]]:
    """Inverse of packing over a split's examples in reading order: drop PAD, cut after EOS.

    examples: 1-D token arrays (any length). Returns each document's ids (without EOS).
    Raises ValueError if the stream does not end with an EOS (a document would be truncated).
    """
    splitter = DocumentSplitter(eos_id, pad_id)
    docs = [d.tolist() for ex in examples for d in splitter.feed(np.asarray(ex, dtype=TOKEN_DTYPE).reshape(1, -1))]
    left = splitter.finish()
    if left:
        raise ValueError(f"token stream ends inside a document ({left} tokens after the last EOS)")
    return docs
