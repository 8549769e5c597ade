"""The eval-leakage candidate check's evidence (pipelines/leakage_detect.py, `candidate_share`):
does a stretch of training tokens hold enough of one task item's question, counted in decon's
cleaned words (leakage_index.WordTables, leakage_grams.word_hashes: the same words in any case,
however BPE split them), without decoding anything? numpy over a whole batch of stretches."""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy import sparse

from .leakage_grams import FILTER_BITS, Inverted, gram_hashes, word_hashes
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
        # per item is its row of distinct grams times it (scipy's sparse product sums each item's
        # IDF in gram order, as the sort and np.bincount it replaces did, bit for bit, at a
        # fraction of their cost; it leaves out sums of 0, so an item whose need the boilerplate
        # alone meets is passed by `any_gram`: any of its grams)
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
        """The stretches k (tokens[starts[k]:ends[k]]) holding at least the need of one item."""
        n, inv = self.n, self.grams
        lengths = ends - starts
        offsets = np.cumsum(lengths) - lengths
        toks = tokens[np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))]
        first = np.zeros(toks.size, bool)
        first[offsets[lengths > 0]] = True
        wh, at = word_hashes(self.tables, toks, first)
        stretch = np.searchsorted(offsets, at, side="right") - 1
        same = np.flatnonzero(stretch[: max(0, stretch.size - n + 1)] == stretch[n - 1 :])
        found, g = inv.hits(gram_hashes(wh, n, same))
        keep = ~self.hot[g]
        found, g = found[keep], g[keep]
        if not g.size:
            return np.zeros(0, np.int64)
        key = np.unique(stretch[same[found]].astype(np.int64) * inv.grams.size + g)  # distinct (stretch, gram)
        s, g = key // inv.grams.size, key % inv.grams.size
        ptr = np.searchsorted(s, np.arange(starts.size + 1)).astype(np.int32)
        rows = sparse.csr_array((np.ones(g.size), g.astype(np.int32), ptr), shape=(starts.size, inv.grams.size))
        have = rows @ self.matrix  # stretch × item: the IDF of the item's grams in the stretch
        row_of = np.repeat(np.arange(starts.size), np.diff(have.indptr))
        passed = row_of[have.data >= self.need[have.indices]]
        return np.union1d(passed, s[self.any_gram[g]])
