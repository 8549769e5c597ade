"""The numpy reference of the eval-leakage candidate search's compiled kernels
(pipelines/leakage/kernels.py): the pre-filter and the word rule exactly as they ran before the
kernels (main c7ee524: pipelines/leakage/candidates.py `Candidates._hits` with its pieces and the rules
of `Candidates.docs`, pipelines/leakage/grams.py `near_grams` and `near_runs`, and
pipelines/leakage/words.py `WordEvidence.enough`), kept here so the tests can check the kernels
against them on any input, element for element."""

from __future__ import annotations

import numpy as np
from scipy import sparse

from pipelines.leakage.candidates import Candidates
from pipelines.leakage.grams import Inverted, gram_hashes, word_hashes
from pipelines.leakage.words import WordEvidence

PIECE_TOKENS = 1 << 19  # the numpy pre-filter's pieces (64 records at seq 8192)


def pieces(starts: np.ndarray, ends: np.ndarray, size: int) -> list[tuple[int, int]]:
    """Consecutive documents [a, b), every document in one, about `size` tokens each."""
    if not starts.size:
        return []
    lo = int(starts.min())
    span = int(ends.max()) - lo
    count = max(1, round(span / size))
    key = (starts - lo) * count // max(1, span)
    cut = np.flatnonzero(key[1:] != key[:-1]) + 1
    bounds = [0, *cut.tolist(), int(starts.size)]
    return list(zip(bounds[:-1], bounds[1:]))


def near_grams(
    inv: Inverted, c: np.ndarray, n: int, hit_pos: np.ndarray, lo: np.ndarray, hi: np.ndarray, window: int
) -> np.ndarray:
    """The index in `inv` of the n-gram of c at each position within `window` of each hit (-1:
    none, or outside [lo, hi], the document's n-gram starts), hits × (2·window + 1)."""
    near = hit_pos[:, None] + np.arange(-window, window + 1)
    inside = (near >= lo[:, None]) & (near <= hi[:, None])
    grams = np.full(near.shape, -1, np.int64)
    grams[inside] = inv.find(gram_hashes(c, n, near[inside]))
    return grams


def holds(inv: Inverted, grams: np.ndarray, items: np.ndarray) -> np.ndarray:
    """Whether item items[k] holds gram grams[k] (gram indexes, -1: none), broadcast: a search of
    the index's sorted gram·n_items + item keys (what the kernel's run rule looks up one by one)."""
    keys = inv.pair_keys()
    if not keys.size:
        return np.zeros(np.broadcast(grams, items).shape, bool)
    q = grams.astype(np.int64) * np.int64(inv.item_ptr.size - 1) + items
    at = np.minimum(np.searchsorted(keys, q), keys.size - 1)
    return (keys[at] == q) & (grams >= 0)


def near_runs(inv: Inverted, grams: np.ndarray, hit_gram: np.ndarray, need: np.ndarray) -> np.ndarray:
    """The hits k (hit_gram[k], its index in `inv`; grams[k]: the n-grams around it, `near_grams`)
    where an item holding the hit's gram has at least need[item] distinct n-grams of its own among
    them (its own included), numpy over all hits at once. The (gram, item) keys are looked up only
    for the pairs whose hit has that many n-grams of any item around it (a bound)."""
    df = inv.df[hit_gram]
    pair_hit = np.repeat(np.arange(hit_gram.size, dtype=np.int64), df)
    pair_item = inv.owners[
        np.repeat(inv.ptr[hit_gram], df) + np.arange(int(df.sum())) - np.repeat(np.cumsum(df) - df, df)
    ]
    maybe = np.flatnonzero((grams >= 0).sum(axis=1)[pair_hit] >= need[pair_item])
    pair_hit, pair_item = pair_hit[maybe], pair_item[maybe]
    rows = grams[pair_hit]
    held = np.full(rows.shape, -1, np.int64)
    r, col = np.nonzero(rows >= 0)  # only the grams found are looked up in the (gram, item) keys
    found = rows[r, col]
    held[r, col] = np.where(holds(inv, found, pair_item[r]), found, -1)
    held.sort(axis=1)
    count = ((held[:, 1:] != held[:, :-1]) & (held[:, 1:] >= 0)).sum(axis=1) + (held[:, 0] >= 0)
    return np.unique(pair_hit[count >= need[pair_item]])


def hits(cand: Candidates, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, size: int = PIECE_TOKENS):
    """Candidates.hits in numpy, piece by piece: (document, gram, raw position, near grams)."""
    parts = [_piece_hits(cand, tokens, starts[a:b], ends[a:b], a) for a, b in pieces(starts, ends, size)]
    if not parts:
        e = np.zeros(0, np.int64)
        return e, e, e, np.zeros((0, 2 * cand.cfg.sample_every + 1), np.int64)
    return tuple(np.concatenate(x) for x in zip(*parts))


def _piece_hits(cand: Candidates, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, first: int):
    n, s = cand.cfg.ngram, cand.cfg.sample_every
    base = int(starts.min()) if starts.size else 0
    t = tokens[base : max(base, int(ends.max(initial=base)))]
    starts, ends = starts - base, ends - base
    cls = np.take(cand.canon_small, t)
    raw_pos = np.flatnonzero(cls != 0)
    c = np.take(cls, raw_pos)
    cs, ce = np.searchsorted(raw_pos, starts), np.searchsorted(raw_pos, ends)
    count = np.maximum(0, (ce - cs - n + s) // s)
    total = int(count.sum())
    if not total:
        e = np.zeros(0, np.int64)
        return e, e, e, np.zeros((0, 2 * s + 1), np.int64)
    last = np.cumsum(count)
    pos = np.repeat(cs - s * (last - count), count) + np.arange(0, s * total, s)
    hit, g = cand.grams.hits(gram_hashes(c, n, pos))
    h_doc = np.searchsorted(last, hit, side="right")
    near = near_grams(cand.grams, c, n, pos[hit], cs[h_doc], ce[h_doc] - n, s)
    return h_doc + first, g, raw_pos[pos[hit]] + base, near


def item_sums(words: WordEvidence, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """The word rule's numpy path up to scipy's product: (stretch × item IDF sums, a CSR array;
    the stretch and gram of each distinct (stretch, gram) found, hot grams left out)."""
    n, inv = words.n, words.grams
    lengths = ends - starts
    offsets = np.cumsum(lengths) - lengths
    toks = tokens[np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))]
    first = np.zeros(toks.size, bool)
    first[offsets[lengths > 0]] = True
    wh, at = word_hashes(words.tables, toks, first)
    stretch = np.searchsorted(offsets, at, side="right") - 1
    same = np.flatnonzero(stretch[: max(0, stretch.size - n + 1)] == stretch[n - 1 :])
    found, g = inv.hits(gram_hashes(wh, n, same))
    keep = ~words.hot[g]
    found, g = found[keep], g[keep]
    key = np.unique(stretch[same[found]].astype(np.int64) * inv.grams.size + g)
    s, g = key // inv.grams.size, key % inv.grams.size
    ptr = np.searchsorted(s, np.arange(starts.size + 1)).astype(np.int32)
    rows = sparse.csr_array((np.ones(g.size), g.astype(np.int32), ptr), shape=(starts.size, inv.grams.size))
    return rows @ words.matrix, s, g


def enough(words: WordEvidence, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """WordEvidence.enough in numpy (word_hashes, gram_hashes, Inverted.hits, scipy's product)."""
    have, s, g = item_sums(words, tokens, starts, ends)
    if not g.size:
        return np.zeros(0, np.int64)
    row_of = np.repeat(np.arange(starts.size), np.diff(have.indptr))
    passed = row_of[have.data >= words.need[have.indices]]
    return np.union1d(passed, s[words.any_gram[g]])


def stretch_words(words: WordEvidence, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray):
    """word_hashes over stretches → (the words' hashes, each stretch's count of words)."""
    lengths = ends - starts
    offsets = np.cumsum(lengths) - lengths
    toks = tokens[np.repeat(starts - offsets, lengths) + np.arange(int(lengths.sum()))]
    first = np.zeros(toks.size, bool)
    first[offsets[lengths > 0]] = True
    wh, at = word_hashes(words.tables, toks, first)
    stretch = np.searchsorted(offsets, at, side="right") - 1
    return wh, np.bincount(stretch, minlength=starts.size)


def docs(cand: Candidates, tokens: np.ndarray, starts: np.ndarray, ends: np.ndarray, size: int = PIECE_TOKENS):
    """Candidates.docs in numpy: the reference pre-filter, run rule, windows and word rule."""
    h_doc, g, h_at, near = hits(cand, tokens, starts, ends, size)
    if not h_doc.size or cand.cfg.candidate_share <= 0:
        return np.unique(h_doc)
    decided, seg_lo, seg_hi, seg_doc = rules(cand, h_doc, g, h_at, near, starts, ends)
    return np.union1d(decided, seg_doc[enough(cand.words, tokens, seg_lo, seg_hi)])


def rules(cand: Candidates, h_doc, g, h_at, near, starts: np.ndarray, ends: np.ndarray):
    """Candidates.rules in numpy: (the documents decided by a bare gram or a run, sorted; the
    word rule's merged windows of the others: lo, hi, document)."""
    bare = np.unique(h_doc[cand.bare_gram[g]])
    runs = h_doc[near_runs(cand.grams, near, g, cand.run_need)]
    decided = np.union1d(bare, runs)
    rest = ~np.isin(h_doc, decided)
    h_doc, g, h_at = h_doc[rest], g[rest], h_at[rest]
    reach = cand.gram_reach[g]
    lo, hi = np.maximum(h_at - reach, starts[h_doc]), np.minimum(h_at + reach, ends[h_doc])
    order = np.lexsort((lo, h_doc))
    h_doc, lo, hi = h_doc[order], lo[order], hi[order]
    new = np.ones(lo.size, bool)  # a window inside the ones before it (same document) joins them
    new[1:] = (h_doc[1:] != h_doc[:-1]) | (lo[1:] > np.maximum.accumulate(hi)[:-1])
    seg = np.cumsum(new) - 1
    seg_lo, seg_doc = lo[new], h_doc[new]
    seg_hi = np.zeros(seg_lo.size, hi.dtype)
    np.maximum.at(seg_hi, seg, hi)
    return decided, seg_lo, seg_hi, seg_doc


def old_raw_span(det, text: str, start: int, end: int) -> str | None:
    """pipelines/leakage/detect.py `Detector.raw_span` as it was before issue 55 (main 5e459f8): the
    document cleaned, traced and re-encoded for every hit, the span between 【 and 】 in the text
    (the reference of `span_map` + `raw_span`: the same characters, cleaned once per document)."""
    from pipelines.leakage.index import clean_text
    from pipelines.leakage.spans import CONTEXT_CHARS, DECON_PUNCT_SET, MAX_SPAN_CHARS

    origin: list[int] = []
    out: list[str] = []
    for i, ch in enumerate(text):
        low = ch.lower()
        if len(low) != 1:
            return None
        low = " " if low in DECON_PUNCT_SET or low.isspace() else low
        if low == " " and (not out or out[-1] == " "):
            continue
        out.append(low)
        origin.append(i)
    while out and out[-1] == " ":
        out.pop()
        origin.pop()
    cleaned = "".join(out)
    if cleaned != clean_text(text):
        return None
    ids = det.enc.encode_ordinary(" " + cleaned)
    _, offsets = det.enc.decode_with_offsets(ids)
    kept = [o for t, o in zip(ids, offsets) if det.index.canon[t] != 0]
    if not 0 <= start < end <= len(kept):
        return None
    lo = max(0, kept[start] - 1)
    while lo < len(cleaned) - 1 and cleaned[lo] == " ":
        lo += 1
    hi = kept[end] - 1 if end < len(kept) else len(cleaned)
    a, b = origin[min(lo, len(origin) - 1)], origin[max(lo, min(hi, len(origin)) - 1)] + 1
    b = min(b, a + MAX_SPAN_CHARS)
    before, after = text[max(0, a - CONTEXT_CHARS) : a], text[b : b + CONTEXT_CHARS]
    pre, post = "…" if a > CONTEXT_CHARS else "", "…" if b + CONTEXT_CHARS < len(text) else ""
    return f"{pre}{before}【{text[a:b]}】{after}{post}"
