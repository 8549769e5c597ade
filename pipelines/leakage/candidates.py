"""Which training documents the eval-leakage decon mode decodes and scores (pipelines/leakage/detect.py,
`Detector.candidate_docs`): over a whole batch of documents, on the shard's own token ids (the
pre-filter and the word rule in compiled kernels, pipelines/leakage/kernels.py; the rest numpy).

A document is a candidate when one of its sampled 5-grams of canonical ids (every 10th, from its
start) is a question 5-gram of an indexed item, in one of its spaces (raw ids; cleaned and
re-tokenized: a lower-cased copy tokenizes as the cleaned text does; both with every whitespace
run as a tab or a newline: detect.respaced), and, with `candidate_share`
above 0 (the candidate check), when it also holds half of one item's question words near its hits
(`words.WordEvidence`) or a run of one item's own 5-grams at a hit. Every document pays
the sampling (the pre-filter); the check runs only around the few hits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .grams import _K, _MIX, FILTER_BITS, Inverted, _ones_poly, item_grams
from .index import LeakIndex, word_tables
from .words import WordEvidence


class Candidates:
    """The per-worker structures of the pre-filter and the candidate check (read-only once built)."""

    def __init__(
        self,
        index: LeakIndex,
        cfg: Any,
        spaces: list[tuple[np.ndarray, np.ndarray]],
        indexed: np.ndarray,
        q_unique: np.ndarray,
    ):
        """cfg: the DetectorConfig; spaces: the indexed items' question n-grams (hashes, owning
        item) in decon's space and the other forms the pre-filter looks up (the raw ids' are added
        here); indexed: the items decon scores; q_unique: each item's distinct question n-grams in
        decon's space."""
        self.cfg, n, N = cfg, cfg.ngram, index.items
        small = np.uint16 if int(index.canon.max(initial=0)) < 1 << 16 else np.uint32
        self.canon_small = index.canon.astype(small)
        raw_h, raw_o = item_grams([index.canonical("question", i) for i in range(N)], n, indexed)
        hashes, owners = (
            np.concatenate([h for h, _ in spaces] + [raw_h]),
            np.concatenate([o for _, o in spaces] + [raw_o]),
        )
        self.grams = cg = Inverted(hashes, owners, N, FILTER_BITS)
        q_ids, q_off = index.parts["question"]
        self.words = WordEvidence(
            word_tables(index.meta["tokenizer"]["name"]), q_ids, q_off, indexed, cfg.candidate_share,
            cfg.candidate_word_ngram,
        )  # fmt: skip
        reach = np.zeros(cg.grams.size, np.int32)
        np.maximum.at(reach, np.repeat(np.arange(cg.grams.size), cg.df), np.diff(q_off).astype(np.int32)[cg.owners])
        self.gram_reach = 4 * reach + 32  # raw tokens each side of a hit
        # the second way to pass: min(8, half its distinct question 5-grams) within 10 of a hit
        self.run_need = np.maximum(1, np.minimum(np.ceil(0.5 * q_unique).astype(np.int64), 8))
        cg.pair_keys()  # built now (nbytes)
        for name in ("item_grams", "idf", "item_idf"):  # not read here (~40 MiB per worker with 26 tasks)
            setattr(cg, name, getattr(cg, name)[:0])
        self.bare_gram = np.zeros(cg.grams.size, bool)
        self.bare_gram[np.repeat(np.arange(cg.grams.size), cg.df)[self.words.bare[cg.owners]]] = True

    def nbytes(self) -> int:
        own = self.canon_small.nbytes + self.gram_reach.nbytes + self.run_need.nbytes + self.bare_gram.nbytes
        return self.grams.nbytes() + self.words.nbytes() + own

    def docs(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The candidates among documents tokens[starts[k]:ends[k]] (raw ids): their indexes k. The
        pre-filter runs document by document in a compiled kernel, the check once on the hits of
        all of them (numpy's per-call costs paid once per batch)."""
        h_doc, g, h_at, near = self.hits(tokens, starts, ends)
        if not h_doc.size or self.cfg.candidate_share <= 0:
            return np.unique(h_doc)
        decided, seg_lo, seg_hi, seg_doc = self.rules(h_doc, g, h_at, near, starts, ends)
        return np.union1d(decided, seg_doc[self.words.enough(tokens, seg_lo, seg_hi)])

    def rules(
        self, h_doc: np.ndarray, g: np.ndarray, h_at: np.ndarray, near: np.ndarray, starts: np.ndarray, ends: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The documents the hits decide and the word rule's windows of the others
        (kernels.hit_windows): a hit on a gram of an item the word rule cannot rule out
        (`bare`), or a run of the item's own 5-grams at the hit (a copy whose punctuation was
        deleted joins words into other words, but keeps most 5-grams of canonical ids); else the
        words around the hits, as far as their items' questions could reach (four times their
        length in tokens: a copy holding the hit lies within one length of it, and a copy in
        capitals takes more tokens), the windows merged per document."""
        from . import kernels as lk  # numba (~110 MiB) only where a detector scores

        cg = self.grams
        return lk.hit_windows(
            h_doc, g, h_at, near, np.asarray(starts, np.int64), np.asarray(ends, np.int64), self.bare_gram,
            self.run_need, self.gram_reach, cg.ptr, cg.owners, cg.pair_keys(), np.int64(cg.item_ptr.size - 1),
        )  # fmt: skip

    def hits(
        self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The pre-filter on documents tokens[starts[k]:ends[k]] (kernels.sampled_hits): each
        sampled hit's document k, gram (index in `grams`), raw position and, for the run rule, the
        grams around it (2·sample_every + 1 of them, -1 where none or outside the document)."""
        from . import kernels as lk  # lazy: numba stays out of audit --help (via detect)

        cg, n = self.grams, self.cfg.ngram
        return lk.sampled_hits(
            np.ascontiguousarray(tokens), np.asarray(starts, np.int64), np.asarray(ends, np.int64),
            self.canon_small, n, self.cfg.sample_every, _K, _ones_poly(n), _MIX, cg.filter, cg.bits, cg.bucket,
            cg.bucket_bits, cg.grams,
        )  # fmt: skip
