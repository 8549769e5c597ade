"""Packing: documents' token ids → fixed-length uint32 examples (pure functions, no I/O).

OLMo-style packing: every document's tokens are followed by EOS, the streams are
concatenated and cut into examples of exactly `seq_len` tokens. Only the last example of a
packing unit (here: one output shard) is filled up with PAD. Nothing is dropped or truncated.
The alternative, best-fit decreasing (a mixture's `packing: {method: best_fit}`), is
`pipelines.bestfit`.

The record layout and the inverse (drop PAD, cut after each EOS: `unpack`) are the contract's
(`contract.records`).
"""

from __future__ import annotations

import array
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from contract import TOKEN_DTYPE  # the record format: little-endian uint32 token ids

# array.array turns tiktoken's list[int] into machine words in C, about twice as fast as numpy;
# pick the typecode that is 4 bytes here, and byte-swap on big-endian machines.
_U32 = next(t for t in "IL" if array.array(t).itemsize == 4)
_SWAP = sys.byteorder != "little"


def _le_bytes(a: array.array) -> bytes:
    """Native uint32 words → uint32-le bytes (byte-swaps `a` in place on big-endian machines)."""
    if _SWAP:
        a.byteswap()
    return a.tobytes()


def tokens_to_bytes(tokens: list[int]) -> bytes:
    """Token ids → uint32-le bytes (raises OverflowError for ids that do not fit)."""
    return _le_bytes(array.array(_U32, tokens))


class Packer:
    """Streaming OLMo-style packing of one packing unit (pure, no I/O).

    `add(tokens)` appends a document and its EOS and returns the examples it completed, as
    `seq_len`·4 bytes (uint32-le) each; `finish()` returns the unit's last, PAD-filled example
    (or None when the stream ended exactly on an example boundary). The carry buffer holds less
    than one example plus one document, so memory is bounded by the largest document.
    `documents` and `tokens` (document tokens plus one EOS each) count what was added.
    """

    def __init__(self, seq_len: int, eos_id: int, pad_id: int):
        if seq_len <= 0:
            raise ValueError(f"seq_len must be positive, got {seq_len}")
        self.seq_len, self._eos, self._pad = seq_len, eos_id, pad_id
        self._buf = array.array(_U32)
        self.documents = self.tokens = 0

    def _cut(self, count: int) -> list[bytes]:
        head = self._buf[: count * self.seq_len]
        del self._buf[: count * self.seq_len]
        data = _le_bytes(head)
        step = self.seq_len * TOKEN_DTYPE.itemsize
        return [data[i : i + step] for i in range(0, len(data), step)]

    def add(self, tokens: memoryview | np.ndarray | Iterable[int]) -> list[bytes]:
        """tokens: one document's ids, without EOS: a native uint32 buffer or array (fastest:
        copied as bytes, e.g. `tokenizer.ordinary_ids`), another int array, or any int sequence."""
        buf = self._buf
        start = len(buf)
        if isinstance(tokens, memoryview):  # tokenizer.ordinary_ids' buffer: native uint32
            if tokens.itemsize != 4 or tokens.format not in ("I", "=I", "@I", "L"):
                raise TypeError(f"expected a uint32 buffer, got format {tokens.format!r}")
            buf.frombytes(tokens.cast("B"))
        elif isinstance(tokens, np.ndarray):
            if tokens.dtype != np.uint32:
                if tokens.size and (tokens.min() < 0 or tokens.max() > np.iinfo(np.uint32).max):
                    raise OverflowError("token ids must fit in uint32")
                tokens = tokens.astype(np.uint32)
            buf.frombytes(np.ascontiguousarray(tokens).data.cast("B"))
        else:
            try:
                buf.extend(tokens)
            except (OverflowError, TypeError):
                del buf[start:]  # a bad id leaves the unit as it was
                raise
        self.tokens += len(buf) + 1 - start  # ids of this document, plus its EOS
        buf.append(self._eos)
        self.documents += 1
        full = len(buf) // self.seq_len
        return self._cut(full) if full else []

    def add_batch(self, ids: np.ndarray, offsets: np.ndarray) -> list[bytes]:
        """Several documents at once, as an engine's `encode_batch` returns them: ids uint32 [N],
        offsets int [D+1] (document d is ids[offsets[d]:offsets[d+1]]). Same result as `add` per
        document; one EOS insert and one copy per batch instead of per document."""
        if ids.dtype != np.uint32:
            raise TypeError(f"expected uint32 ids, got {ids.dtype}")
        docs = len(offsets) - 1
        if docs <= 0:
            return []
        if offsets[0] != 0 or offsets[-1] != len(ids):
            raise ValueError(f"offsets must run from 0 to {len(ids)}, got {offsets[0]}..{offsets[-1]}")
        with_eos = np.insert(ids, offsets[1:], np.uint32(self._eos))
        self._buf.frombytes(with_eos.data.cast("B"))
        self.tokens += len(with_eos)
        self.documents += docs
        full = len(self._buf) // self.seq_len
        return self._cut(full) if full else []

    def finish(self) -> bytes | None:
        if not self._buf:
            return None
        self._buf.extend([self._pad] * (self.seq_len - len(self._buf)))
        return self._cut(1)[0]


def pack_examples(
    docs: Iterable[np.ndarray | list[int]], seq_len: int, eos_id: int, pad_id: int
) -> Iterator[np.ndarray]:
    """Yield examples `[seq_len]` uint32-le from token sequences, packed in the given order
    (one packing unit: only the last example is PAD-filled). docs: 1-D int sequences, without EOS."""
    packer = Packer(seq_len, eos_id, pad_id)
    for doc in docs:
        for ex in packer.add(doc):
            yield np.frombuffer(ex, dtype=TOKEN_DTYPE)
    last = packer.finish()
    if last is not None:
        yield np.frombuffer(last, dtype=TOKEN_DTYPE)


@dataclass(frozen=True)
class PackStats:
    documents: int
    tokens: int  # document tokens including one EOS per document
    padding: int  # PAD tokens added to complete the last example
    examples: int


def pack_stats(doc_lengths: Iterable[int], seq_len: int) -> PackStats:
    """Counts `pack_examples` produces for documents of these lengths (without EOS)."""
    lengths = list(doc_lengths)
    tokens = sum(lengths) + len(lengths)
    examples = -(-tokens // seq_len)
    return PackStats(len(lengths), tokens, examples * seq_len - tokens, examples)
