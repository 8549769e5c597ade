"""Packing: documents' token ids → fixed-length uint32 examples (pure functions, no I/O).

OLMo-style packing: every document's tokens are followed by EOS, the streams are
concatenated and cut into examples of exactly `seq_len` tokens. Only the last example of a
packing unit (here: one output shard) is filled up with PAD. Nothing is dropped or truncated.

`unpack` is the exact inverse used by tests and audits: drop PAD, cut after each EOS.
"""
from __future__ import annotations

import array
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

TOKEN_DTYPE = np.dtype("<u4")  # the record format: little-endian uint32 token ids
# array.array("I") turns tiktoken's list[int] into bytes about twice as fast as numpy does;
# usable when the C unsigned int is 4 bytes and the machine is little-endian (x86, ARM).
_FAST_U32 = array.array("I").itemsize == 4 and sys.byteorder == "little"


def tokens_to_bytes(tokens: list[int]) -> bytes:
    """Token ids → uint32-le bytes (raises OverflowError for ids that do not fit)."""
    if _FAST_U32:
        return array.array("I", tokens).tobytes()
    return np.asarray(tokens, dtype=TOKEN_DTYPE).tobytes()


@dataclass(frozen=True)
class PackStats:
    documents: int
    tokens: int  # document tokens including one EOS per document
    padding: int  # PAD tokens added to complete the last example
    examples: int


def pack_examples(
    docs: Iterable[np.ndarray | list[int]], seq_len: int, eos_id: int, pad_id: int
) -> Iterator[np.ndarray]:
    """Yield examples `[seq_len]` uint32-le from token sequences, packed in the given order.

    docs: iterable of 1-D int sequences (one per document, without EOS).
    The carry buffer never holds more than one example plus one document, so memory is
    bounded by the largest document rather than by the unit.
    """
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    buf = np.empty(seq_len, dtype=TOKEN_DTYPE)
    fill = 0
    for doc in docs:
        arr = np.asarray(doc, dtype=TOKEN_DTYPE)
        pieces = (arr, np.array([eos_id], dtype=TOKEN_DTYPE))
        for piece in pieces:
            pos = 0
            while pos < len(piece):
                take = min(seq_len - fill, len(piece) - pos)
                buf[fill : fill + take] = piece[pos : pos + take]
                fill += take
                pos += take
                if fill == seq_len:
                    yield buf.copy()
                    fill = 0
    if fill:
        buf[fill:] = pad_id
        yield buf.copy()


def pack_stats(doc_lengths: Iterable[int], seq_len: int) -> PackStats:
    """Counts `pack_examples` produces for documents of these lengths (without EOS)."""
    lengths = list(doc_lengths)
    tokens = sum(lengths) + len(lengths)
    examples = -(-tokens // seq_len)
    return PackStats(len(lengths), tokens, examples * seq_len - tokens, examples)


def unpack(examples: Iterable[np.ndarray], eos_id: int, pad_id: int) -> list[list[int]]:
    """Inverse of packing over a split's examples in reading order: drop PAD, cut after EOS.

    Returns each document's token ids (without EOS). Raises if the stream does not end
    with an EOS (a document would have been truncated).
    """
    docs: list[list[int]] = []
    cur: list[int] = []
    for ex in examples:
        for tok in np.asarray(ex).tolist():
            if tok == pad_id:
                continue
            if tok == eos_id:
                docs.append(cur)
                cur = []
            else:
                cur.append(tok)
    if cur:
        raise ValueError(f"token stream ends inside a document ({len(cur)} tokens after the last EOS)")
    return docs


def decode_record(record: bytes, seq_len: int) -> np.ndarray:
    """One ArrayRecord record → `[seq_len]` uint32 array, checking its size."""
    if len(record) != seq_len * TOKEN_DTYPE.itemsize:
        raise ValueError(f"record has {len(record)} bytes, expected {seq_len * TOKEN_DTYPE.itemsize}")
    return np.frombuffer(record, dtype=TOKEN_DTYPE)
