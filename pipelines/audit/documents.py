"""Pure functions turning packed records back into documents.

Packing contract: each document's tokens + EOS are concatenated and cut into `seq_len`
examples; only the last example of each packing unit is PAD-filled (a trailing PAD run). So
dropping PAD and cutting after every EOS recovers the documents exactly (shapes below are
`[n, seq_len]` uint32 record chunks; documents are 1-D token arrays *without* their EOS).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np

from .manifest import RECORD_DTYPE


@dataclasses.dataclass
class RecordProblems:
    """Malformed records in one chunk: `(record_ordinal_in_chunk, reason)` pairs."""

    bad: list[tuple[int, str]]


def parse_records(raw: list[bytes], seq_len: int, vocab_size: int) -> tuple[np.ndarray, RecordProblems]:
    """Raw record bytes → `[n_ok, seq_len]` uint32 array of the well-formed ones, plus problems.

    A record is well-formed when it is exactly `seq_len` uint32 tokens, all `< vocab_size`.
    """
    want = seq_len * RECORD_DTYPE.itemsize
    bad: list[tuple[int, str]] = []
    ok_idx = []
    for i, rec in enumerate(raw):
        if len(rec) != want:
            bad.append((i, f"has {len(rec)} bytes, expected {want} ({seq_len} uint32 tokens)"))
        else:
            ok_idx.append(i)
    if not ok_idx:
        return np.zeros((0, seq_len), RECORD_DTYPE), RecordProblems(bad)
    joined = b"".join(raw[i] for i in ok_idx) if len(ok_idx) < len(raw) else b"".join(raw)
    arr = np.frombuffer(joined, RECORD_DTYPE).reshape(len(ok_idx), seq_len)
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
        self.carry = np.zeros(0, RECORD_DTYPE)
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
            start = end + 1
        self.carry = tokens[start:].copy()

    def finish(self) -> int:
        """Ends the split; returns the length of the trailing fragment (0 when well packed)."""
        n = int(self.carry.size)
        if n:
            self.problems.cut_without_eos += 1
        self.carry = np.zeros(0, RECORD_DTYPE)
        return n
