"""The eval-leakage candidate check's evidence (pipelines/leakage_detect.py, `candidate_share`):
does a stretch of training tokens hold enough of one task item's question, counted in decon's
cleaned words (leakage_index.WordTables, leakage_grams.word_hashes: the same words in any case,
however BPE split them), without decoding anything? Over a whole batch of stretches, in a compiled
kernel (pipelines/leakage_kernels.py, `words_enough`)."""

from __future__ import annotations

import dataclasses

import numpy as np

from .leakage_grams import _K, _MIX, FILTER_BITS, Inverted, _ones_poly, gram_hashes, word_hashes
from .leakage_index import WordTables

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
        # the (gram, item) pairs as a sparse gram × item matrix of the grams' IDF: a stretch's IDF
        # per item is its row of distinct grams times it (scipy's sparse product, which sums each
        # item's IDF in gram order; the kernel reads the matrix's CSR arrays and sums in the same
        # order, bit for bit; sums of 0 are left out, so an item whose need the boilerplate alone
        # meets is passed by `any_gram`: any of its grams)
        from scipy import sparse

        idf = np.repeat(inv.idf, inv.df)
        ix = np.int32  # item and pair counts stay far below 2^31; int32 keeps scipy from converting per call
        self.matrix = sparse.csr_array(
            (idf, inv.owners.astype(ix), inv.ptr.astype(ix)), shape=(inv.grams.size, n_items)
        )
        self.any_gram = np.zeros(inv.grams.size, bool)
        self.any_gram[np.repeat(np.arange(inv.grams.size), inv.df)[self.need[inv.owners] <= 0]] = True
        # the lookup (`hits`) is all `enough` uses of the inverted index: its pairs live in the matrix
        for name in ("item_grams", "df", "idf", "owners", "ptr"):
            setattr(inv, name, getattr(inv, name)[:0])  # 16+ MB less per worker

    def nbytes(self) -> int:
        t, m = self.tables, self.matrix
        tables = sum(a.nbytes for a in dataclasses.astuple(t))
        matrix = m.data.nbytes + m.indices.nbytes + m.indptr.nbytes + self.any_gram.nbytes
        return self.grams.nbytes() + self.hot.nbytes + self.need.nbytes + self.bare.nbytes + tables + matrix

    def enough(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The stretches k (tokens[starts[k]:ends[k]]) holding at least the need of one item (or a
        word n-gram of an item that needs nothing), in a compiled kernel
        (leakage_kernels.words_enough: word_hashes, their n-grams' lookup and the sparse product's
        sums, bit for bit)."""
        from . import leakage_kernels as lk  # lazy: numba stays out of audit --help (via leakage_detect)

        passed = lk.words_enough(*self._stretches(tokens, starts, ends), *self._lookup(), self.need, self.any_gram)
        return np.flatnonzero(passed)

    def item_sums(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray):
        """What `enough` compares with the needs: each stretch's non-zero IDF sum per item →
        (stretch, item, sum) arrays, by stretch then item (leakage_kernels.stretch_sums)."""
        from . import leakage_kernels as lk  # numba (~110 MiB) only where a detector scores

        return lk.stretch_sums(*self._stretches(tokens, starts, ends), *self._lookup(), self.need.size)

    def _stretches(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> tuple:
        return np.ascontiguousarray(tokens), np.asarray(starts, np.int64), np.asarray(ends, np.int64)

    def _lookup(self) -> tuple:
        """The kernels' arguments after the stretches: the word tables, the n-gram hash, the word
        n-grams' lookup (filter, buckets, grams, hot) and the gram × item IDF matrix (CSR)."""
        t, inv, m, n = self.tables, self.grams, self.matrix, self.n
        return (
            t.h, t.pow_, t.flags, n, _K, _ones_poly(n), _MIX, inv.filter, inv.bits, inv.bucket, inv.bucket_bits,
            inv.grams, self.hot, m.indptr, m.indices, m.data,
        )  # fmt: skip
