"""N-gram hashing and the inverted index of the eval-leakage detectors (pipelines/leakage/detect.py):
polynomial hashes of canonical-id n-grams (numpy, every window at once), the items' n-grams, the
inverted index (n-gram → items, IDF, each item's n-grams, a bit filter), and datatrove's text
normalization and word n-grams for the 13-gram mode."""

from __future__ import annotations

import functools
import re
import unicodedata

import numpy as np
import xxhash

from .index import DIGIT_FIRST, DIGIT_LAST, SPACE_AFTER, SPACE_BEFORE, WordTables

_K = np.uint64(0x9E3779B97F4A7C15)
_MIX = np.uint64(0xBF58476D1CE4E5B9)
# datatrove.utils.text.PUNCTUATION (datatrove 0.10.1), replaced by spaces in simplify_text
DT_PUNCTUATION = "!/—”:％１〈&(、━\\【#%「」，】；+^]~“《„';’{|∶´[=-`*．（–？！：$～«〉,><》)?）。…@_.\"}►»" + "".join(
    map(chr, (x for a, b in ((0, 9), (11, 13), (13, 32), (127, 160)) for x in range(a, b)))
)
_DT_TRANS = str.maketrans(DT_PUNCTUATION, " " * len(DT_PUNCTUATION))
_DT_NUMBERS = re.compile(r"\d+([.,،٫⎖⎗⎘]{1}\d+)?")
_DT_WS = re.compile(r"\s+")


def gram_hashes(c: np.ndarray, n: int, positions: np.ndarray | None = None) -> np.ndarray:
    """uint64 hash of the n-gram of canonical ids starting at each of `positions` (default: every
    start); a polynomial over the ids (each plus one), then mixed (its top bits index the filter).
    Computed as poly(ids) + poly(ones), in place over views c[j:] (no index array per term): the
    same value modulo 2^64, in fewer numpy passes."""
    if positions is None:
        positions = np.arange(max(0, c.size - n + 1))
    with np.errstate(over="ignore"):
        h = np.take(c, positions).astype(np.uint64)
        for j in range(1, n):
            h *= _K
            h += np.take(c[j:], positions).astype(np.uint64, copy=False)
        h += _ones_poly(n)
        h ^= h >> np.uint64(31)
        h *= _MIX
        h ^= h >> np.uint64(29)
    return h


@functools.cache
def _ones_poly(n: int) -> np.uint64:
    """The polynomial's value on n ones (what the '+ 1' of every id adds, modulo 2^64)."""
    v = 0
    for _ in range(n):
        v = (v * int(_K) + 1) % (1 << 64)
    return np.uint64(v)


def item_grams(parts: list[np.ndarray], n: int, keep: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Every n-gram inside each of `parts` (one array of canonical ids per item; items where `keep`
    is False give none) → (hashes, owning item), for all items at once."""
    lengths = np.array([x.size for x in parts], np.int64)
    flat = np.concatenate(parts) if parts else np.zeros(0, np.uint32)
    count = np.maximum(0, lengths - n + 1)
    if keep is not None:
        count = np.where(keep, count, 0)
    owner = np.repeat(np.arange(len(parts), dtype=np.int64), count)
    start = np.cumsum(lengths) - lengths
    within = np.arange(int(count.sum())) - np.repeat(np.cumsum(count) - count, count)
    return gram_hashes(flat, n, start[owner] + within), owner


FILTER_BITS = 24  # the question, candidate and word n-gram filters: 2^24 bits (2 MiB) each


class Inverted:
    """Sorted distinct gram hashes → the items holding each (owners[ptr[g]:ptr[g+1]]), their
    document frequency and IDF (ln(items / df)), each item's distinct grams (item_grams[
    item_ptr[i]:item_ptr[i+1]], indexes into `grams`), and a bit filter for the fast miss."""

    def __init__(
        self, hashes: np.ndarray, owners: np.ndarray, n_items: int, filter_bits: int = 0, idf_items: int | None = None
    ):
        """idf_items: the items IDF counts (default n_items; decon counts the indexed ones)."""
        order = np.lexsort((owners, hashes))
        h, o = hashes[order], owners[order]
        distinct = np.ones(h.size, bool)
        distinct[1:] = (h[1:] != h[:-1]) | (o[1:] != o[:-1])
        h, o = h[distinct], o[distinct]
        self.grams, first = np.unique(h, return_index=True)
        self.ptr = np.append(first, h.size).astype(np.int64)
        self.owners = o
        self.df = np.diff(self.ptr)
        self.idf = np.log(max(1, n_items if idf_items is None else idf_items) / np.maximum(self.df, 1))
        gram_of_pair = np.repeat(np.arange(self.grams.size, dtype=np.int64), self.df)
        by_item = np.argsort(o, kind="stable")
        self.item_grams = gram_of_pair[by_item]
        self.item_ptr = np.zeros(n_items + 1, np.int64)
        np.cumsum(np.bincount(o, minlength=n_items), out=self.item_ptr[1:])
        self.item_idf = np.bincount(o, weights=self.idf[gram_of_pair], minlength=n_items)
        self._pair_keys: np.ndarray | None = None
        # where each value of a hash's top `bucket_bits` bits starts among the sorted grams (about one
        # gram per bucket): a lookup reads a bucket or two instead of a binary search's ~20 reads
        # scattered over `grams` (np.searchsorted; numpy has no hash set for uint64 keys)
        self.bucket_bits = max(1, min(24, int(self.grams.size).bit_length() - 1)) if filter_bits else 0
        self.bucket: np.ndarray | None = None
        if self.bucket_bits:
            first = (self.grams >> np.uint64(64 - self.bucket_bits)).astype(np.int64)
            self.bucket = np.searchsorted(first, np.arange((1 << self.bucket_bits) + 1)).astype(np.int32)
        self.bits = filter_bits
        self.filter = np.zeros(1 << max(0, filter_bits - 3), np.uint8) if filter_bits else None
        if self.filter is not None and self.grams.size:
            top = self.grams >> np.uint64(64 - filter_bits)
            np.bitwise_or.at(
                self.filter,
                (top >> np.uint64(3)).astype(np.int64),
                np.left_shift(1, (top & np.uint64(7)).astype(np.uint8)).astype(np.uint8),
            )

    def find(self, h: np.ndarray) -> np.ndarray:
        """Index of each hash among `grams`, -1 where absent."""
        out = np.full(h.size, -1, np.int64)
        at, g = self.hits(h)
        out[at] = g
        return out

    def hits(self, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(the positions in h of the hashes among `grams`, their indexes there)."""
        if not self.grams.size or not h.size:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        cand = np.arange(h.size)
        if self.filter is not None:
            top = h >> np.uint64(64 - self.bits)
            bit = (self.filter[(top >> np.uint64(3)).astype(np.int64)] >> (top & np.uint64(7)).astype(np.uint8)) & 1
            cand = np.flatnonzero(bit)
        hc = h[cand]
        if self.bucket is None:
            pos = np.minimum(np.searchsorted(self.grams, hc), self.grams.size - 1)
            ok = self.grams[pos] == hc
            return cand[ok], pos[ok]
        top = (hc >> np.uint64(64 - self.bucket_bits)).astype(np.int64)
        pos, end = self.bucket[top].astype(np.int64), self.bucket[top + 1]
        found = np.full(hc.size, -1, np.int64)
        live = np.flatnonzero(pos < end)
        pos = pos[live]
        while live.size:  # one step along the (sorted) buckets still looking, at most the largest
            g = self.grams[pos]
            want = hc[live]
            eq = g == want
            found[live[eq]] = pos[eq]
            more = (g < want) & (pos + 1 < end[live])
            live, pos = live[more], pos[more] + 1
        ok = found >= 0
        return cand[ok], found[ok]

    def pair_keys(self) -> np.ndarray:
        """The sorted gram·n_items + item keys of the (gram, item) pairs (built on first use)."""
        if self._pair_keys is None:
            n = np.int64(self.item_ptr.size - 1)
            self._pair_keys = np.repeat(np.arange(self.grams.size, dtype=np.int64), self.df) * n + self.owners
        return self._pair_keys

    def items_of(self, g: int) -> np.ndarray:
        return self.owners[self.ptr[g] : self.ptr[g + 1]]

    def of_item(self, i: int) -> np.ndarray:
        """Item i's distinct grams (indexes into `grams`)."""
        return self.item_grams[self.item_ptr[i] : self.item_ptr[i + 1]]

    def nbytes(self) -> int:
        arrays = [self.grams, self.ptr, self.owners, self.df, self.idf, self.item_grams, self.item_ptr, self.item_idf]
        arrays += [a for a in (self._pair_keys, self.bucket) if a is not None]
        return int(sum(a.nbytes for a in arrays) + (self.filter.nbytes if self.filter is not None else 0))


WORD_STEPS = 16  # words spanning more tokens take the prefix-product way (word_hashes)


def word_hashes(t: WordTables, tokens: np.ndarray, first: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The cleaned words (index.WordTables: decon's cleaned words, also cut where digits
    meet letters) of token ids, numpy over the whole array:
    `first` marks each document's first token (no word crosses it). → (uint64 hash of each word,
    the index of its first token). A word's hash is that of its characters, however BPE split it:
    over tokens a..b, Σ h[u]·Π_{u<v≤b} P[v] (modulo 2^64), with h the tokens' hashes and P their
    WORD_BASE^length (empty tokens add 0, times 1). Most words are one or two tokens, so it is
    computed by Horner's rule one token at a time over the words still going (WORD_STEPS at most);
    the longer ones as C[b]·(S[b] − S[a−1]), C the running product of P and S the running sum of
    h·C⁻¹ (the same sum; three running passes over every token, so only when a word needs it)."""
    if not tokens.size:
        return np.zeros(0, np.uint64), np.zeros(0, np.int64)
    tokens = tokens.astype(np.intp, copy=False)  # once, not in every np.take (~3x indexing's speed)
    h = np.take(t.h, tokens)
    f = np.take(t.flags, tokens)
    cut = (f & SPACE_BEFORE).astype(bool) | first
    dl, df = (f[:-1] & DIGIT_LAST) != 0, (f[1:] & DIGIT_FIRST) != 0
    cut[1:] |= ((f[:-1] & SPACE_AFTER) != 0) | (dl != df)
    at = np.flatnonzero(cut & (h != 0))
    if not at.size:
        return np.zeros(0, np.uint64), at
    end = np.append(at[1:], tokens.size)  # exclusive
    out = h[at]
    live = np.flatnonzero(end - at > 1)
    with np.errstate(over="ignore"):
        for k in range(1, WORD_STEPS):
            if not live.size:
                return out, at
            u = at[live] + k
            out[live] = out[live] * np.take(t.pow_, tokens[u]) + h[u]
            live = live[end[live] - at[live] > k + 1]
        if live.size:
            c = np.cumprod(np.take(t.pow_, tokens))
            s = np.cumsum(h * np.cumprod(np.take(t.inv, tokens)))
            a, b = at[live], end[live] - 1
            out[live] = c[b] * (s[b] - np.where(a > 0, s[np.maximum(a - 1, 0)], np.uint64(0)))
    return out, at


def simplify_words(text: str) -> list[str]:
    """datatrove's `simplify_text` (default TextNormConfig), split at whitespace."""
    text = _DT_NUMBERS.sub("0", text.lower()).translate(_DT_TRANS)
    text = _DT_WS.sub(" ", text.strip())
    text = "".join(ch for ch in unicodedata.normalize("NFD", text) if unicodedata.category(ch) != "Mn")
    return text.split()


def word_gram_hashes(words: list[str], n: int) -> np.ndarray:
    """uint64 hash of every word n-gram (stable across processes: xxh64 of each word, then the
    n-gram polynomial)."""
    if len(words) < n:
        return np.zeros(0, np.uint64)
    wh = np.fromiter((xxhash.xxh64_intdigest(w.encode()) for w in words), np.uint64, count=len(words))
    with np.errstate(over="ignore"):
        h = np.zeros(len(words) - n + 1, np.uint64)
        for j in range(n):
            h = h * _K + wh[j : j + h.size]
    return h
