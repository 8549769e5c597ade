"""Best-fit packing: documents' token ids → fixed-length uint32 examples (pure, no I/O).

OLMo 3's long-context stage packs with best-fit decreasing (OLMo-core's `InstancePacker`, after
https://arxiv.org/abs/2404.10830) instead of concat-and-chunk. Here, per packing unit (one output
shard, fed in its file's order, so the result does not depend on runners or worker counts):

* each document's ids plus its EOS are split at `seq_len` (OLMo-core's `LongDocStrategy.fragment`:
  pieces of exactly `seq_len`, then the remainder; nothing is truncated);
* documents are buffered until they hold at least `window`·`seq_len` tokens (the last window of a
  unit may hold less), and each window's pieces are placed by best-fit decreasing: longest first
  (ties in document order), each into the open sequence with the least room that fits it (among
  equals, the one that reached that room first), else into a new sequence — OLMo-core's rule;
* one constraint keeps the record layout of `contract.records` (drop PAD, cut after each EOS
  recovers every document): the remainder of a split document (its *continuation*) goes first in
  its sequence, right after the document's full pieces, so a sequence holds at most one
  continuation; a continuation whose best fit already holds one takes the next best fit;
* sequences are written in the order they were opened, a split document's full pieces just
  before the sequence with its continuation; each sequence is its pieces then a trailing PAD run.

Document boundaries stay EOS (the loader's document mask: `dataloader.loader.batch_fields` starts
a segment after each EOS and gives PAD segment 0), so every piece is its own segment.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Iterable, Sequence

import numpy as np

from contract import TOKEN_DTYPE

BEST_FIT, CONCAT = "best_fit", "concat"  # a mixture's `packing.method`
DEFAULT_WINDOW = 256  # sequences of documents buffered per best-fit window (256·seq_len·4 bytes)


def best_fit_decreasing(
    lengths: Sequence[int], capacity: int, continuation: Sequence[bool] | None = None
) -> list[list[int]]:
    """Item indices per bin, bins in opening order, items in placement order.

    lengths: each item's size (1..capacity). continuation: items of which a bin holds at most one
    (None: no constraint, exactly OLMo-core's `InstancePacker`)."""
    cont = list(continuation) if continuation is not None else [False] * len(lengths)
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])  # stable: ties in input order
    bins: list[list[int]] = []
    rooms: list[int] = []
    has_cont: list[bool] = []
    by_space: dict[int, deque[int]] = {}  # room left → bins with it, in the order they got it
    spaces: list[int] = []  # sorted rooms that some bin has
    for i in order:
        n = int(lengths[i])
        if not 0 < n <= capacity:
            raise ValueError(f"item {i} has length {n}, outside [1, {capacity}]")
        b = _take_bin(by_space, spaces, n, cont[i], has_cont)
        if b is None:
            bins.append([])
            rooms.append(capacity)
            has_cont.append(False)
            b = len(bins) - 1
        bins[b].append(i)
        has_cont[b] = has_cont[b] or cont[i]
        rooms[b] -= n
        left = rooms[b]
        if left > 0:
            if left not in by_space:
                by_space[left] = deque()
                bisect.insort(spaces, left)
            by_space[left].append(b)
    return bins


def _take_bin(
    by_space: dict[int, deque[int]], spaces: list[int], n: int, is_cont: bool, has_cont: list[bool]
) -> int | None:
    """Remove and return the best-fit bin for an item of size n (None: open a new one)."""
    for at in range(bisect.bisect_left(spaces, n), len(spaces)):
        room = spaces[at]
        queue = by_space[room]
        pick = next((b for b in queue if not (is_cont and has_cont[b])), None)
        if pick is None:
            continue
        queue.remove(pick)
        if not queue:
            del by_space[room]
            del spaces[at]
        return pick
    return None


def pieces(length: int, seq_len: int) -> list[int]:
    """A document's pieces (its ids plus EOS, `length` tokens) split at seq_len: sizes in order."""
    full, rest = divmod(length, seq_len)
    return [seq_len] * full + ([rest] if rest else [])


def pack_window(docs: Sequence[np.ndarray], seq_len: int, pad_id: int) -> list[bytes]:
    """One window's documents (each its ids plus EOS, uint32) → records, best-fit packed."""
    sizes: list[int] = []
    owner: list[tuple[int, int]] = []  # item → (document, start in it)
    cont: list[bool] = []
    for d, doc in enumerate(docs):
        parts = pieces(len(doc), seq_len)
        for k, size in enumerate(parts):
            sizes.append(size)
            owner.append((d, k * seq_len))
            cont.append(k > 0 and k == len(parts) - 1)
    bins = best_fit_decreasing(sizes, seq_len, cont)
    full_bins: dict[int, list[int]] = {}  # document → its bins of one non-final full piece
    for b, items in enumerate(bins):
        d, start = owner[items[0]]
        if start + sizes[items[0]] < len(docs[d]):
            full_bins.setdefault(d, []).append(b)
    out: list[bytes] = []
    for items in bins:
        d, start = owner[items[0]]
        if start + sizes[items[0]] < len(docs[d]):
            continue  # a non-final full piece: written with its document's final piece
        head = next((i for i in items if owner[i][1] > 0), None)  # a split document's last piece
        if head is not None:
            for fb in full_bins.get(owner[head][0], []):
                out.append(_record(docs, owner, sizes, bins[fb], seq_len, pad_id))
            items = [head] + [i for i in items if i != head]
        out.append(_record(docs, owner, sizes, items, seq_len, pad_id))
    return out


def _record(
    docs: Sequence[np.ndarray], owner: list[tuple[int, int]], sizes: list[int], items: list[int], seq_len: int, pad: int
) -> bytes:
    rec = np.full(seq_len, pad, TOKEN_DTYPE)
    at = 0
    for i in items:
        d, start = owner[i]
        rec[at : at + sizes[i]] = docs[d][start : start + sizes[i]]
        at += sizes[i]
    return rec.tobytes()


def _as_u32(tokens: memoryview | np.ndarray | Iterable[int]) -> np.ndarray:
    if isinstance(tokens, memoryview):  # tokenizer.ordinary_ids' buffer: native uint32
        if tokens.itemsize != 4 or tokens.format not in ("I", "=I", "@I", "L"):
            raise TypeError(f"expected a uint32 buffer, got format {tokens.format!r}")
        return np.frombuffer(tokens, dtype=np.uint32)
    arr = np.asarray(tokens if isinstance(tokens, np.ndarray) else list(tokens))
    if arr.dtype == np.uint32:
        return arr.reshape(-1)
    if arr.size and (arr.dtype.kind not in "iu" or arr.min() < 0 or arr.max() > np.iinfo(np.uint32).max):
        raise OverflowError("token ids must fit in uint32")
    return arr.astype(np.uint32).reshape(-1)


class BestFitPacker:
    """Best-fit packing of one packing unit, with `pipelines.pack.Packer`'s interface: `add`,
    `add_batch` and `finish` return finished records (`seq_len`·4 bytes, uint32-le); `documents`
    and `tokens` (ids plus one EOS each) count what was added. Memory: one window of documents."""

    def __init__(self, seq_len: int, eos_id: int, pad_id: int, window: int = DEFAULT_WINDOW):
        if seq_len <= 0 or window <= 0:
            raise ValueError(f"seq_len and window must be positive, got {seq_len} and {window}")
        self.seq_len, self.window, self._eos, self._pad = seq_len, window, eos_id, pad_id
        self._docs: list[np.ndarray] = []
        self._held = 0
        self.documents = self.tokens = 0

    def _push(self, doc: np.ndarray) -> None:
        with_eos = np.empty(len(doc) + 1, TOKEN_DTYPE)
        with_eos[:-1] = doc
        with_eos[-1] = self._eos
        self._docs.append(with_eos)
        self._held += len(with_eos)
        self.tokens += len(with_eos)
        self.documents += 1

    def _flush(self, last: bool) -> list[bytes]:
        if not self._docs or (not last and self._held < self.window * self.seq_len):
            return []
        out = pack_window(self._docs, self.seq_len, self._pad)
        self._docs, self._held = [], 0
        return out

    def add(self, tokens: memoryview | np.ndarray | Iterable[int]) -> list[bytes]:
        """One document's ids, without EOS (anything `Packer.add` takes)."""
        self._push(_as_u32(tokens))
        return self._flush(last=False)

    def add_batch(self, ids: np.ndarray, offsets: np.ndarray) -> list[bytes]:
        """Several documents: ids uint32 [N], offsets [D+1] (as `Packer.add_batch`)."""
        if ids.dtype != np.uint32:
            raise TypeError(f"expected uint32 ids, got {ids.dtype}")
        if len(offsets) - 1 <= 0:
            return []
        if offsets[0] != 0 or offsets[-1] != len(ids):
            raise ValueError(f"offsets must run from 0 to {len(ids)}, got {offsets[0]}..{offsets[-1]}")
        out: list[bytes] = []
        for d in range(len(offsets) - 1):
            self._push(ids[offsets[d] : offsets[d + 1]])
            out += self._flush(last=False)
        return out

    def finish(self) -> list[bytes]:
        """The unit's remaining records (the last window's)."""
        return self._flush(last=True)
