"""The eval-leakage candidate check's evidence (pipelines/leakage/detect.py, `candidate_share`):
does a stretch of training tokens hold enough of one task item's question, counted in decon's
cleaned words (index.WordTables, grams.word_hashes: the same words in any case,
however BPE split them), without decoding anything? Over a whole batch of stretches, in a compiled
kernel (pipelines/leakage/kernels.py, `words_enough`), summing only the items that prefix filtering
(`WordEvidence._prefix_postings`) cannot rule out."""

from __future__ import annotations

import copy
import dataclasses
import functools
from typing import Any

import numpy as np

from .grams import _K, _MIX, FILTER_BITS, Inverted, _ones_poly, gram_hashes, word_hashes
from .index import WordTables

WORD_HOT_DF = 256  # word n-grams in more items are not looked up (counted as present)


class WordEvidence:
    """Each indexed item's distinct question word n-grams, their IDF (ln(indexed items / items
    holding it)) and what an item needs: `share` of its IDF total. A word n-gram in more than
    WORD_HOT_DF items (boilerplate: "which of the following") is not looked up but counted as
    present in every stretch, so it can only keep more; `bare` marks the items this cannot rule
    out (no word n-gram: a question of fewer words; or a need the boilerplate alone meets)."""

    def __init__(
        self, tables: WordTables, ids: np.ndarray, offsets: np.ndarray, indexed: np.ndarray, share: float, n: int
    ):
        self.tables, self.n, n_items = tables, n, indexed.size
        first = np.zeros(ids.size, bool)
        first[offsets[:-1][np.diff(offsets) > 0]] = True
        wh, at = word_hashes(tables, ids, first)
        item = np.searchsorted(offsets, at, side="right") - 1
        same = np.flatnonzero(item[: max(0, item.size - n + 1)] == item[n - 1 :])
        same = same[indexed[item[same]]]
        inv = Inverted(gram_hashes(wh, n, same), item[same], n_items, FILTER_BITS, idf_items=int(indexed.sum()))
        self.grams = inv
        self.hot = inv.df > WORD_HOT_DF
        hot_pair = np.repeat(self.hot, inv.df)
        hot_idf = np.bincount(inv.owners[hot_pair], weights=np.repeat(inv.idf, inv.df)[hot_pair], minlength=n_items)
        self.need = share * inv.item_idf - hot_idf - 1e-9
        self.bare = indexed & ((np.diff(inv.item_ptr) == 0) | (self.need <= 0))
        self.any_gram = np.zeros(inv.grams.size, bool)
        self.any_gram[np.repeat(np.arange(inv.grams.size), inv.df)[self.need[inv.owners] <= 0]] = True
        # what `enough` reads: each gram's IDF, each item's distinct grams (ascending) and the
        # prefix postings (`_prefix_postings`); the gram-major pairs are dropped (16+ MB per worker)
        self.idf = inv.idf
        self.item_ptr, self.item_grams = inv.item_ptr, inv.item_grams.astype(np.int32)
        self.pre_ptr, self.pre_items = self._prefix_postings()
        for name in ("item_grams", "df", "idf", "owners", "ptr", "item_ptr"):
            setattr(inv, name, getattr(inv, name)[:0])

    def _prefix_postings(self) -> tuple[np.ndarray, np.ndarray]:
        """Prefix filtering with two common grams (the 2-prefix of Wang, Li and Feng, "Can we beat
        the prefix filtering?", SIGMOD 2012, weighted by IDF): each item's live grams (not hot)
        ordered rarest first (IDF descending, then gram), its 2-prefix the leading ones from which
        the rest weighs at least its need less its largest weight. A stretch meeting an item's need
        holds either one gram that alone may meet it, or two or more grams, the first two in that
        order both in the 2-prefix (the first weighs at most the item's largest weight, so the
        grams from the second on must make up the rest of the need). So an item is summed only where the
        postings give it two votes (a gram that alone may meet the need votes twice): ~0.9 items
        per record on the bench set, from ~14 postings, where the full product took all ~340
        postings of the grams found. Its sum runs over its own grams in ascending order, as the
        product sums it: the same sums, bit for bit, and the same stretches pass. Items needing
        nothing have no postings: `any_gram` passes them. → (pre_ptr, pre_items): gram g's
        postings are pre_items[pre_ptr[g]:pre_ptr[g+1]], each item·2, plus 1 for a double vote."""
        from . import kernels as lk  # numba (~110 MiB) only where a detector scores

        n_grams, ptr = self.idf.size, self.item_ptr
        item = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
        gram = self.item_grams.astype(np.int64)
        live = ~self.hot[gram] & (self.need[item] > 0)
        item, gram = item[live], gram[live]
        order = np.lexsort((gram, -self.idf[gram], item))
        item, gram = item[order], gram[order]
        votes = lk.prefix_votes(np.searchsorted(item, np.arange(ptr.size)), self.idf[gram], self.need)
        keep = votes > 0
        item, gram, votes = item[keep], gram[keep], votes[keep]
        order = np.lexsort((item, gram))
        pre_ptr = np.searchsorted(gram[order], np.arange(n_grams + 1)).astype(np.int32)
        return pre_ptr, (2 * item[order] + (votes[order] == 2)).astype(np.int32)

    def with_needs(self, need: np.ndarray, any_gram: np.ndarray) -> WordEvidence:
        """A copy whose items need `need` (any_gram: the grams that pass a stretch on their own), its
        prefix postings rebuilt for them (what the tests set at their edges)."""
        other = copy.copy(self)
        other.need, other.any_gram = need, any_gram
        other.__dict__.pop("matrix", None)
        other.pre_ptr, other.pre_items = other._prefix_postings()
        return other

    @functools.cached_property
    def matrix(self) -> Any:  # a scipy.sparse.csr_array (scipy ships no types)
        """The (gram, item) pairs as a sparse gram × item matrix of the grams' IDF (scipy): a
        stretch's IDF per item is its row of distinct grams times it (scipy sums each item's IDF in
        gram order, as `enough` does). What `item_sums` and the tests' numpy path read; built on
        first use (a worker that only runs `enough` holds none of it)."""
        from scipy import sparse  # only where the full sums are asked for (the tests), not per worker

        ix = np.int32  # item and pair counts stay far below 2^31; int32 keeps scipy from converting per call
        by_item = sparse.csr_array(
            (self.idf[self.item_grams], self.item_grams, self.item_ptr.astype(ix)),
            shape=(self.item_ptr.size - 1, self.idf.size),
        )
        m = by_item.T.tocsr()
        m.indices, m.indptr = m.indices.astype(ix), m.indptr.astype(ix)
        return m

    def nbytes(self) -> int:
        tables = sum(a.nbytes for a in dataclasses.astuple(self.tables))
        sums = self.idf.nbytes + self.item_ptr.nbytes + self.item_grams.nbytes + self.pre_ptr.nbytes
        sums += self.pre_items.nbytes + self.any_gram.nbytes
        return self.grams.nbytes() + self.hot.nbytes + self.need.nbytes + self.bare.nbytes + tables + sums

    def enough(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The stretches k (tokens[starts[k]:ends[k]]) holding at least the need of one item (or a
        word n-gram of an item that needs nothing), in a compiled kernel
        (kernels.words_enough: word_hashes, their n-grams' lookup, and the sums of the
        items the prefix postings name, each bit for bit the sparse product's)."""
        from . import kernels as lk  # lazy: numba stays out of audit --help (via detect)

        passed = lk.words_enough(
            *self._stretches(tokens, starts, ends), *self._lookup(), self.pre_ptr, self.pre_items, self.item_ptr,
            self.item_grams, self.idf, self.need, self.any_gram,
        )  # fmt: skip
        return np.flatnonzero(passed)

    def item_sums(
        self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Each stretch's non-zero IDF sum per item over all its items (what `enough` computes only
        for the items its prefix postings name) → (stretch, item, sum) arrays, by stretch then item
        (kernels.stretch_sums, on `matrix`)."""
        from . import kernels as lk  # numba (~110 MiB) only where a detector scores

        m = self.matrix
        return lk.stretch_sums(
            *self._stretches(tokens, starts, ends), *self._lookup(), m.indptr, m.indices, m.data, self.need.size
        )

    def _stretches(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple:
        return np.ascontiguousarray(tokens), np.asarray(starts, np.int64), np.asarray(ends, np.int64)

    def _lookup(self) -> tuple:
        """The kernels' arguments after the stretches: the word tables, the n-gram hash, the word
        n-grams' lookup (filter, buckets, grams, hot)."""
        t, inv, n = self.tables, self.grams, self.n
        return (
            t.h, t.pow_, t.flags, n, _K, _ones_poly(n), _MIX, inv.filter, inv.bits, inv.bucket, inv.bucket_bits,
            inv.grams, self.hot,
        )  # fmt: skip
