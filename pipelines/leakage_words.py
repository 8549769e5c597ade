"""The eval-leakage candidate check's evidence (pipelines/leakage_detect.py, `candidate_share`):
does a stretch of training tokens hold enough of one task item's question, counted in decon's
cleaned words (leakage_index.WordTables, leakage_grams.word_hashes: the same words in any case,
however BPE split them), without decoding anything? numpy over a whole batch of stretches."""

from __future__ import annotations

import dataclasses

import numpy as np

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
        inv.item_grams = inv.item_grams[:0]  # each item's own list is not used here (16 MB less per worker)

    def nbytes(self) -> int:
        t = self.tables
        tables = sum(a.nbytes for a in dataclasses.astuple(t))
        return self.grams.nbytes() + self.hot.nbytes + self.need.nbytes + self.bare.nbytes + tables

    def enough(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The stretches k (tokens[starts[k]:ends[k]]) holding at least the need of one item."""
        n, inv, n_items = self.n, self.grams, self.need.size
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
        df = inv.df[g]
        pair_gram = np.repeat(g, df)
        pair_item = inv.owners[np.repeat(inv.ptr[g], df) + np.arange(int(df.sum())) - np.repeat(np.cumsum(df) - df, df)]
        pairs, which = np.unique(np.repeat(s, df) * n_items + pair_item, return_inverse=True)
        have = np.bincount(which, weights=inv.idf[pair_gram])
        return np.unique(pairs[have >= self.need[pairs % n_items]] // n_items)
