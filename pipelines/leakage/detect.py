"""Eval-leakage detectors: is a training document a copy of a downstream task's instance?

Two modes over one `LeakIndex` (pipelines/leakage/index.py):

* **decon** (default): AI2's decon algorithm (allenai/decon, src/detect/: detection.rs, cluster.rs,
  scoring.rs; the defaults of its config/default.yaml), on canonical token ids. 5-grams of the
  document are sampled every 10 tokens and looked up in an inverted index of the items' question
  5-grams; a hit (not on a "hot" 5-gram, one in more than max(2·√items, 2000) items: those advance
  one token) starts a cluster, expanded left and right one 5-gram at a time, each candidate item
  dropping out after 11 consecutive misses. Each candidate is scored: its question overlap is the
  IDF-weighted share of its unique question 5-grams the cluster matched (IDF = ln(items / items
  holding the 5-gram)); below (threshold − 0.3) / 0.7 (raised towards 1.0 for questions of 20–50
  tokens) it is dropped. The answer must be near: a short answer (≤ 3 tokens) exactly within the 50
  tokens after the question, a long one by IDF-weighted 3-gram overlap within max(100, 2·length)
  tokens after it. A passage counts by IDF-weighted 4-gram overlap within 100 tokens (plus its
  length) before or after the question. decon's combined score weighs question/answer/passage
  0.7/0.2/0.1 (QA 0.75/0.25, QP 0.85/0.15, Q 1.0), moves weight away from short questions (< 20
  unique 5-grams) and short answers (< 4 tokens), and scales scores of items shorter than 50 tokens
  so that ≤ 20 tokens need a perfect match. A document is contaminated when one item scores at least
  the threshold (0.8); the whole document is flagged. Items under 20 tokens in all are not indexed
  (decon's eval_min_token_length), and documents under 10 canonical tokens are not scored.
* **ngram13**: the simple cross-check, datatrove's `NGramsDecontFilter` (find_query_ngrams and
  find_overlap_ngrams on, n = 13): the document's text is decoded, normalized as datatrove's
  `simplify_text` does (lower case, digit runs to 0, its punctuation set to spaces, whitespace
  collapsed, diacritics dropped), split into words at whitespace (datatrove uses spaCy's tokenizer,
  which also splits a few contractions such as "cannot"), and flagged when one word 13-gram occurs
  in an item's question-plus-answer text.

The sampling, hashing and membership tests run over a whole chunk of documents
(pipelines/leakage/candidates.py; compiled kernels in pipelines/leakage/kernels.py); only
candidates run the cluster expansion in Python (few: a hit needs a 5-gram of a task question, and
the candidate check more).
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from typing import Any

import numpy as np

from .candidates import Candidates
from .grams import FILTER_BITS, Inverted, gram_hashes, item_grams, simplify_words, word_gram_hashes
from .index import LeakIndex, clean_text
from .spans import SpanMap, raw_span, span_map

# The whitespace decon's cleaning turns into a space but BPE does not: a word after a space is
# " word", after a tab "\tword" (cl100k has ~1,170 tab+letters tokens) and after any other (a
# newline, a no-break space) "word" alone, each split its own way, so a copy whose words are
# separated by tabs shares no canonical 5-gram with the question as written. The pre-filter looks
# up the items' question 5-grams in these forms too (`respaced`; DetectorConfig.whitespace_forms).
WHITESPACE_FORMS = "\t\n"  # DetectorConfig.whitespace_forms's default: each character one form
_WHITESPACE_RUN = re.compile(r"\s+")


def respaced(texts: list[str], forms: str = WHITESPACE_FORMS) -> list[list[str]]:
    """The texts with every whitespace run written as each character of `forms`, as they are and as
    decon cleans them (lower case, punctuation to spaces): 2 × len(forms) lists."""
    cleaned = [clean_text(t) for t in texts]
    out = []
    for sep in forms:
        out.append([_WHITESPACE_RUN.sub(sep, t) for t in texts])
        out.append([sep + c.replace(" ", sep) for c in cleaned])
    return out


DECON, NGRAM13, BOTH = "decon", "ngram13", "both"
MODES = (DECON, NGRAM13, BOTH)
MAX_SPAN_TOKENS = 200  # of an example span's text (cleaned)
_SHARED: dict[tuple[str, str], Detector] = {}


@dataclasses.dataclass(frozen=True)
class DetectorConfig:
    """decon's defaults (config/default.yaml); `mode` picks the detector(s)."""

    mode: str = DECON
    threshold: float = 0.8  # contamination_score_threshold
    ngram: int = 5  # ngram_size
    sample_every: int = 10  # sample_every_m_tokens
    max_misses: int = 11  # question_max_consecutive_misses
    perfect_match_start: int = 20  # perfect_match_decay_start
    perfect_match_end: int = 50  # perfect_match_decay_end
    short_answer_tokens: int = 3  # short_answer_token_threshold
    short_answer_window: int = 50  # short_answer_window_length
    answer_ngram: int = 3  # answer_ngram_size
    min_long_answer_window: int = 100
    passage_ngram: int = 4  # passage_ngram_size
    min_passage_distance: int = 100
    min_item_tokens: int = 20  # eval_min_token_length
    exact_ngram: int = 13  # the ngram13 mode's n
    # olmax's candidate check (not decon's; Detector.candidate_docs): a document with a sampled
    # hit is scored only if it holds at least this IDF-weighted share of one item's distinct
    # question word n-grams (decon's cleaned words, whatever way BPE split them); 0: every hit
    candidate_share: float = 0.5
    candidate_word_ngram: int = 3
    # olmax's pre-filter (not decon's): each character a whitespace the items' questions are also
    # written with (`respaced`; "": none, the pre-filter before issue 55, which missed copies
    # whose words are separated by tabs). A setting, so that an audit or a manifest checked with
    # another pre-filter is not taken for this one.
    whitespace_forms: str = WHITESPACE_FORMS

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"eval-leakage mode must be one of {MODES}, got {self.mode!r}")
        if not 0 < self.threshold <= 1:  # NaN fails this too
            raise ValueError(f"eval-leakage threshold must be in (0, 1], got {self.threshold!r}")
        if not all(c.isspace() for c in self.whitespace_forms) or len(set(self.whitespace_forms)) != len(
            self.whitespace_forms
        ):
            raise ValueError(
                f"eval-leakage whitespace_forms must be distinct whitespace, got {self.whitespace_forms!r}"
            )
        if not 0 <= self.candidate_share <= 1:
            raise ValueError(f"eval-leakage candidate_share must be in [0, 1], got {self.candidate_share!r}")
        ints = [f.name for f in dataclasses.fields(self) if f.type == "int"]
        if any(getattr(self, n) < 1 for n in ints if n != "min_item_tokens"):
            raise ValueError("eval-leakage n-gram sizes, windows and miss counts must be >= 1")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def decon(self) -> bool:
        return self.mode in (DECON, BOTH)

    @property
    def exact(self) -> bool:
        return self.mode in (NGRAM13, BOTH)


def interpolate_threshold(length: int, start: int, end: int, target: float) -> float:
    """decon scoring.rs `interpolate_threshold`: 1.0 up to `start` tokens, `target` from `end`."""
    if length <= start:
        return 1.0
    if length >= end or start == end:
        return target
    return 1.0 - (1.0 - target) * (length - start) / (end - start)


def combined_score(
    cfg: DetectorConfig,
    q: float,
    q_unique: int,
    q_len: int,
    a: float | None,
    a_len: int,
    p: float | None,
    p_len: int,
) -> float:
    """decon scoring.rs `calculate_combined_contamination_score` (a/p: None when the item has no
    answer/passage)."""
    qc = 0.5 + 0.5 * q_unique / 20.0 if q_unique < 20 else 1.0
    av, pv = a or 0.0, p or 0.0
    if a is not None and p is not None:
        ac = 0.5 + 0.5 * a_len / 4.0 if a_len < 4 else 1.0
        if qc < 1 or ac < 1:
            qw, red = 0.7 * qc, 0.7 * (1 - qc)
            aw, pw = 0.2 + red * 0.5, 0.1 + red * 0.5
            base = q * qw + av * aw * ac + pv * (pw + aw * (1 - ac))
        else:
            base = q * 0.7 + av * 0.2 + pv * 0.1
    elif a is not None:
        base = q * 0.75 * qc + av * (0.25 + 0.75 * (1 - qc))
    elif p is not None:
        base = q * 0.85 * qc + pv * (0.15 + 0.85 * (1 - qc))
    else:
        base = q
    score = min(base, 1.0)
    total = q_len + (a_len if a is not None else 0) + (p_len if p is not None else 0)
    need = interpolate_threshold(total, cfg.perfect_match_start, cfg.perfect_match_end, cfg.threshold)
    if need > cfg.threshold:
        scale = cfg.threshold / need
        score = score * scale + (1.0 - scale) * float(score == 1.0)
    return score


@dataclasses.dataclass
class Hit:
    """One item found in a document."""

    item: int
    score: float
    start: int  # decon: the span in the document's cleaned ids; ngram13: the whole document
    end: int
    mode: str
    text: str = ""  # decon: the span as the document has it with context (else its cleaned text); ngram13: the first shared word 13-gram
    mark: tuple[int, int] | None = None  # decon: the span's [first, last) character in `text` (None: no context)


@dataclasses.dataclass
class DocResult:
    """A scored document (only those with a candidate cluster or an exact hit are returned)."""

    doc: int  # index in the batch
    best: float  # the best decon score of any candidate item (0.0 if none / exact only)
    hits: list[Hit]  # contaminated items (decon: score >= threshold; ngram13: a shared 13-gram)


class Detector:
    """The per-worker structures of one index and configuration (built once, then read-only).

    decon scores in its own space: the text cleaned (`index.clean_text`) and tokenized
    again (" " + cleaned, as decon pads it; ordinary cl100k ids, which dolma2's are), ids mapped to
    their canonical class. Re-tokenizing every training document would cost more than the tokenize
    job, so candidates are found first, on the shard's own ids: a document is scored only when one
    of its sampled 5-grams of canonical ids (every 10th, from its start) is a question 5-gram of an
    item in one of its spaces (raw ids; cleaned and re-tokenized: a lower-cased copy tokenizes as
    the cleaned text does; and both with their whitespace as tabs or newlines, `respaced`:
    a copy whose words are separated by tabs tokenizes as neither). Only candidates are decoded,
    cleaned, re-tokenized and run through decon's discovery and scoring, and of the documents with
    a hit only those that hold half of one item's question words near their hits, or a run of its
    5-grams at one (the candidate check, `candidate_docs`)."""

    def __init__(self, index: LeakIndex, cfg: DetectorConfig):
        # lazy: the tokenizer stays out of audit --help (it imports this module)
        from pipelines import dolma2_tokenizer as tk

        self.index, self.cfg = index, cfg
        name = index.meta["tokenizer"]["name"]
        self.enc = tk.get_tokenizer(name)
        self.engine = tk.get_engine(tk.default_engine(name), name)  # the job's fast encoder, same ids
        n, N = cfg.ngram, index.items
        text = {p: [self.text(index.part(p, i)) for i in range(N)] for p in ("question", "answer", "passage")}
        clean = {p: self.clean_batch(t) for p, t in text.items()}
        q, a, p_ = clean["question"], clean["answer"], clean["passage"]
        self.q_len = np.array([x.size for x in q], np.int64)
        self.a = a
        self.p_len = np.array([x.size for x in p_], np.int64)
        total = self.q_len + np.array([x.size for x in a], np.int64) + self.p_len
        self.indexed = (total >= cfg.min_item_tokens) & (self.q_len >= n)
        h, o = item_grams(q, n, self.indexed)
        self.questions = Inverted(h, o, N, FILTER_BITS, idf_items=int(self.indexed.sum()))
        forms = [
            item_grams(self.canonical_batch(t), n, self.indexed)
            for t in respaced(text["question"], cfg.whitespace_forms)
        ]
        self.q_unique = np.diff(self.questions.item_ptr)
        self.q_total = self.questions.item_idf
        self.hot_df = max(2 * int(math.isqrt(max(1, int(self.indexed.sum())))), 2000)
        self.candidates = Candidates(index, cfg, [(h, o), *forms], self.indexed, self.q_unique)
        long_answer = np.array([x.size > cfg.short_answer_tokens for x in a], bool)
        self.answers = Inverted(*item_grams(a, cfg.answer_ngram, long_answer), N)
        self.passages = Inverted(*item_grams(p_, cfg.passage_ngram), N)
        self.exact_index: Inverted | None = None
        if cfg.exact:
            words = [
                simplify_words(text["passage"][i] + text["question"][i]) + simplify_words(text["answer"][i])
                for i in range(N)
            ]
            hashes = [word_gram_hashes(w, cfg.exact_ngram) for w in words]
            owners = np.repeat(np.arange(N, dtype=np.int64), [x.size for x in hashes])
            flat = np.concatenate(hashes) if hashes else np.zeros(0, np.uint64)
            self.exact_index = Inverted(flat, owners, N, FILTER_BITS)

    @classmethod
    def shared(cls, index: LeakIndex, cfg: DetectorConfig) -> Detector:
        """One Detector per process for an index and settings (the driver and an in-process Beam
        worker share it; the structures are read-only)."""
        key = (index.sha256, json.dumps(cfg.to_json(), sort_keys=True))
        if key not in _SHARED:
            while len(_SHARED) >= 2:  # two at most: OLMo 3's 26 tasks take ~170 MiB (decon)
                _SHARED.pop(next(iter(_SHARED)))
            _SHARED[key] = cls(index, cfg)
        return _SHARED[key]

    def clean_batch(self, texts: list[str]) -> list[np.ndarray]:
        """`clean_ids` of many texts (one encoder call)."""
        return self.canonical_batch([" " + clean_text(t) for t in texts])

    def canonical_batch(self, texts: list[str]) -> list[np.ndarray]:
        """The canonical ids of many texts as they are (one encoder call; 0s dropped)."""
        ids, offsets = self.engine.encode_batch(texts)
        c = self.index.canon[ids]
        keep = c != 0
        ends = np.cumsum(keep)
        bounds = np.concatenate([[0], ends])[offsets]
        flat = c[keep]
        return [flat[bounds[k] : bounds[k + 1]] for k in range(len(texts))]

    def text(self, ids: np.ndarray) -> str:
        return self.enc.decode_bytes(ids.tolist()).decode("utf-8", "replace")

    def clean_ids(self, text: str) -> np.ndarray:
        """decon's space: canonical ids of " " + clean_text(text), tokenized again (0s dropped)."""
        c = self.index.canon[np.asarray(self.enc.encode_ordinary(" " + clean_text(text)), np.int64)]
        return c[c != 0]

    def span_map(self, text: str) -> SpanMap | None:
        """`spans.span_map` of a document, in this detector's tokenizer and classes."""
        return span_map(self.enc, self.index.canon, text)

    def nbytes(self) -> int:
        """Memory of the structures a worker holds (the index's arrays and the inverted indexes)."""
        inv = [self.questions, self.answers, self.passages]
        inv += [self.exact_index] if self.exact_index else []
        return self.index.bytes_per_worker() + sum(x.nbytes() for x in inv) + self.candidates.nbytes()

    # ---- a batch of documents ----

    def scan(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> list[DocResult]:
        """Documents tokens[starts[k]:ends[k]] (raw ids) → the scored ones, in batch order."""
        found: dict[int, DocResult] = {}
        if self.cfg.decon and self.questions.grams.size and starts.size:
            cand = self.candidate_docs(tokens, starts, ends).tolist()
            texts = [self.text(tokens[starts[k] : ends[k]]) for k in cand]
            for k, text, c in zip(cand, texts, self.clean_batch(texts)):
                r = self._decon_doc(c)
                if r is not None:
                    r.doc = k
                    found[k] = r
                    m = self.span_map(text) if r.hits else None  # once per document, not per hit
                    for h in r.hits:  # the span as the document has it (the report shows it)
                        span = raw_span(m, h.start, h.end) if m is not None else None
                        if span is not None:
                            h.text, h.mark = span[0], (span[1], span[2])
        if self.cfg.exact and self.exact_index is not None and self.exact_index.grams.size:
            for k in range(starts.size):
                hits = self._exact_doc(tokens[starts[k] : ends[k]])
                if hits:
                    found.setdefault(k, DocResult(k, 0.0, [])).hits.extend(hits)
        return [found[k] for k in sorted(found)]

    def candidate_docs(self, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """The documents to decode and score (pipelines/leakage/candidates.py): a sampled hit, and
        the candidate check passed (every hit when candidate_share is 0)."""
        return self.candidates.docs(tokens, starts, ends)

    def _decon_doc(self, c: np.ndarray) -> DocResult | None:
        """decon's cluster discovery and scoring on one document's ids in its space."""
        cfg, n = self.cfg, self.cfg.ngram
        if c.size < 2 * n:  # decon skips documents under 2·ngram tokens
            return None
        gi = self.questions.find(gram_hashes(c, n))
        total = gi.size
        best, hits, scored = 0.0, [], False
        i = 0
        while i < total:
            g = int(gi[i])
            if g < 0:
                i += cfg.sample_every
                continue
            if self.questions.df[g] > self.hot_df:
                i += 1
                continue
            matches, bounds, end = self._expand(i, gi)
            for item in sorted(matches):
                score, ok, span = self._score(item, matches[item], bounds[item], c)
                scored = True
                best = max(best, score)
                if ok:
                    hits.append(Hit(item, score, span[0], span[1], DECON, self._span_text(c[span[0] : span[1]])))
            i = max(i, end + 1)
        if not scored:
            return None
        return DocResult(-1, best, hits)

    def _span_text(self, c: np.ndarray) -> str:
        """Canonical ids back to text (each class's cleaned text), for the report's examples."""
        inv = self._class_text()
        return " ".join(inv.get(int(x), "?") for x in c[:MAX_SPAN_TOKENS].tolist())

    def _class_text(self) -> dict[int, str]:
        if not hasattr(self, "_classes"):
            first = np.unique(self.index.canon, return_index=True)[1]
            self._classes = {
                int(self.index.canon[i]): clean_text(
                    self.enc.decode_single_token_bytes(int(i)).decode("utf-8", "replace")
                )
                for i in first.tolist()
            }
        return self._classes

    def _expand(self, hit: int, gi: np.ndarray) -> tuple[dict[int, set[int]], dict[int, list[int]], int]:
        """decon cluster.rs `expand_simple_contamination_cluster`: → ({item: matched gram ids},
        {item: [first, last] gram position}, last position visited on the right)."""
        inv, limit = self.questions, self.cfg.max_misses
        g0 = int(gi[hit])
        initial = set(inv.items_of(g0).tolist())
        matches = {d: {g0} for d in initial}
        bounds = {d: [hit, hit] for d in initial}
        idx = hit
        for step in (-1, 1):
            active = set(initial)
            misses = dict.fromkeys(initial, 0)
            idx = hit
            while active and 0 <= idx + step < gi.size:
                idx += step
                g = int(gi[idx])
                here = set(inv.items_of(g).tolist()) if g >= 0 else set()
                both = active & here
                missed = active - here if both else set(active)
                for d in both:
                    if g not in matches[d]:
                        matches[d].add(g)
                        misses[d] = 0
                    bounds[d][0 if step < 0 else 1] = idx
                for d in missed:
                    misses[d] += 1
                    if misses[d] >= limit:
                        active.discard(d)
        return matches, bounds, idx

    def _score(
        self, item: int, matched: set[int], bound: list[int], c: np.ndarray
    ) -> tuple[float, bool, tuple[int, int]]:
        """(score, contaminated, span [start, end) in `c`) of one candidate item."""
        cfg = self.cfg
        q_total = self.q_total[item]
        q = float(self.questions.idf[sorted(matched)].sum()) / q_total if q_total > 0 else 0.0
        q_len = int(self.q_len[item])
        need_q = interpolate_threshold(
            q_len, cfg.perfect_match_start, cfg.perfect_match_end, max(0.0, (cfg.threshold - 0.3) / 0.7)
        )
        qs, qe = bound[0], bound[1] + cfg.ngram  # question span [qs, qe)
        end = qe
        ans = self.a[item]
        p_len = int(self.p_len[item])
        if q < need_q:  # decon's pre-check: no answer or passage can lift it to the threshold; scored
            # (for the histogram) without their evidence, which would take a window search each
            a0, p0 = (0.0 if ans.size else None), (0.0 if p_len else None)
            score = combined_score(cfg, q, int(self.q_unique[item]), q_len, a0, int(ans.size), p0, p_len)
            return float(score), False, (qs, min(end, c.size))
        a_ov: float | None = None
        if ans.size:
            if ans.size <= cfg.short_answer_tokens:
                at = _find_sub(c[qe : qe + cfg.short_answer_window], ans)
                a_ov = 1.0 if at >= 0 else 0.0
                if at >= 0:
                    end = qe + at + ans.size
            else:
                width = max(cfg.min_long_answer_window, 2 * ans.size)
                a_ov = self._overlap(self.answers, item, c[qe : qe + width], cfg.answer_ngram)
        p_ov: float | None = None
        if p_len:
            reach = cfg.min_passage_distance + p_len
            near = np.concatenate([c[max(0, qs - reach) : qs], c[qe : qe + reach]])
            p_ov = self._overlap(self.passages, item, near, cfg.passage_ngram)
        score = combined_score(cfg, q, int(self.q_unique[item]), q_len, a_ov, int(ans.size), p_ov, p_len)
        ok = q >= need_q and score >= cfg.threshold
        return float(score), ok, (qs, min(end, c.size))

    @staticmethod
    def _overlap(inv: Inverted, item: int, window: np.ndarray, n: int) -> float:
        """IDF-weighted share of an item's distinct n-grams present in `window`."""
        mine = inv.of_item(item)
        total = float(inv.item_idf[item])
        if not mine.size or total <= 0 or window.size < n:
            return 0.0
        there = np.isin(mine, inv.find(gram_hashes(window, n)))
        return float(inv.idf[mine[there]].sum()) / total

    def _exact_doc(self, doc: np.ndarray) -> list[Hit]:
        assert self.exact_index is not None
        words = simplify_words(self.text(doc))
        g = self.exact_index.find(word_gram_hashes(words, self.cfg.exact_ngram))
        at = np.flatnonzero(g >= 0)
        if not at.size:
            return []
        items = np.unique(np.concatenate([self.exact_index.items_of(int(g[j])) for j in at.tolist()]))
        gram = " ".join(words[int(at[0]) : int(at[0]) + self.cfg.exact_ngram])
        return [Hit(int(i), 1.0, 0, int(doc.size), NGRAM13, gram) for i in items.tolist()]


def _find_sub(window: np.ndarray, pattern: np.ndarray) -> int:
    """First position of `pattern` in `window`, -1 if absent."""
    m = pattern.size
    if window.size < m:
        return -1
    cand = np.flatnonzero(window[: window.size - m + 1] == pattern[0])
    for j in cand.tolist():
        if np.array_equal(window[j : j + m], pattern):
            return j
    return -1
