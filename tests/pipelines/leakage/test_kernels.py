"""The eval-leakage candidate search's compiled kernels (pipelines/leakage/kernels.py, through
leakage.candidates.Candidates and leakage.words.WordEvidence) against the numpy path they replaced
(tests/pipelines/leakage/reference.py): the pre-filter's hits, the word rule's words, sums and
stretches, the rules and candidates, bit for bit, on the planted corpus and on scrambled batches
with the sampling's edge cases; the word hashes, the bit filter and the bucketed lookup against
plainer computations; the word rule's prefix postings against each item's need."""

from __future__ import annotations

import numpy as np
import pytest

from pipelines.dolma2_tokenizer import dolma2
from pipelines.leakage import detect as ld
from pipelines.leakage import index as li
from tests.pipelines import leak_plants as lp
from tests.pipelines.leakage import reference as ref


@pytest.fixture(scope="module")
def index(tmp_path_factory):
    return li.build(str(lp.write_tasks(tmp_path_factory.mktemp("leak") / "tasks")))


@pytest.fixture(scope="module")
def batch(index) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The planted-contamination corpus's documents (leak_plants.plants) as one batch: (tokens,
    starts, ends)."""
    enc = dolma2()
    ids = [np.asarray(enc.encode_ordinary(t), np.uint32) for t, _, _ in lp.plants(index)]
    ends = np.cumsum([x.size for x in ids])
    return np.concatenate(ids), ends - np.array([x.size for x in ids]), ends


def _scrambled(index, tokens: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Documents cut at random from the corpus's tokens, with the edge cases of the pre-filter's
    sampling: empty ones, ones shorter than an n-gram, ones of class-0 ids only (a class-0 id
    shifts every later sample), class-0 ids sprinkled in, ids of every kind sprinkled in (the
    lowest classes, which no text holds, included), and the documents laid out in a random
    order with gaps between them (a batch's documents need not be in order or contiguous)."""
    rng = np.random.default_rng(seed)
    zero, vocab = np.flatnonzero(index.canon == 0)[:50].astype(np.uint32), index.canon.size
    docs = []
    for kind in rng.integers(0, 8, 400):
        length = [0, 1, 4, 5, 9][kind] if kind < 5 else int(rng.integers(6, 900))
        at = int(rng.integers(0, tokens.size - length + 1))
        doc = tokens[at : at + length].copy()
        if kind == 5:
            doc = rng.choice(zero, length)
        elif kind == 6:
            doc = np.insert(doc, rng.integers(0, doc.size + 1, doc.size // 7), rng.choice(zero, doc.size // 7))
        elif kind == 7:  # any id at all, the lowest classes too ("\x00", class 1, is in no text)
            odd = np.concatenate([np.flatnonzero((index.canon > 0) & (index.canon < 4)), rng.integers(0, vocab, 9)])
            doc = np.insert(doc, rng.integers(0, doc.size + 1, odd.size), odd.astype(np.uint32))
        docs.append(doc)
    layout = rng.permutation(len(docs))  # document k's place in the token array
    gaps = [rng.choice(zero, int(g)) for g in rng.integers(0, 3, len(docs))]
    flat, starts, ends, at = [], np.zeros(len(docs), np.int64), np.zeros(len(docs), np.int64), 0
    for k in layout:
        flat += [gaps[k], docs[k]]
        starts[k] = at + gaps[k].size
        ends[k] = at = starts[k] + docs[k].size
    return np.concatenate(flat).astype(np.uint32), starts, ends


def test_the_compiled_pre_filter_gives_the_numpy_references_hits(index, batch):
    """Candidates.hits (leakage.kernels.sampled_hits) against the numpy pre-filter it replaced
    (tests/pipelines/leakage/reference.py, pieces of any size): every sampled hit's document, gram,
    raw position and the grams around it, on the planted corpus, on documents cut from it at
    random with the sampling's edge cases, and on documents cut just after a hit, one a batch."""
    cand = ld.Detector.shared(index, ld.DetectorConfig(mode=ld.BOTH)).candidates
    tokens, starts, ends = batch
    batches = [(tokens, starts, ends, ref.PIECE_TOKENS), (tokens.astype(np.int64), starts, ends, 4096)]
    batches += [(*_scrambled(index, tokens, seed), size) for seed, size in ((0, ref.PIECE_TOKENS), (1, 2048))]
    for t, s, e, size in batches:
        got, want = cand.hits(t, s, e), ref.hits(cand, t, s, e, size)
        assert size == ref.PIECE_TOKENS or len(ref.pieces(s, e, size)) > 4  # the reference's piece bounds too
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
        assert got[0].size > 60 and (got[3] >= 0).sum() > 8 * got[0].size and (got[3] < 0).any()
    # documents cut 12 tokens after a hit, each alone: the last hit's last neighbours, found ones
    # among them, are the batch's last lookups
    h_doc, _, h_at, _ = cand.hits(tokens, starts, ends)
    first_hit = np.unique(h_doc, return_index=True)[1][:40]
    tails = 0
    for d, at in zip(h_doc[first_hit], h_at[first_hit]):
        s, e = starts[d : d + 1], np.minimum(ends[d : d + 1], at + 12)
        got, want = cand.hits(tokens, s, e), ref.hits(cand, tokens, s, e)
        for a, b in zip(got, want):
            assert a.dtype == b.dtype and a.shape == b.shape and (a == b).all()
        tails += got[0].size > 0 and (got[3][-1, 11:] >= 0).any()
    assert tails > 10
    empty = cand.hits(tokens, starts[:0], ends[:0])
    assert [x.shape for x in empty] == [(0,), (0,), (0,), (0, 21)]
    with pytest.raises(IndexError):  # an id outside the vocabulary is refused, as np.take refuses it
        cand.hits(np.array([index.canon.size] * 20, np.uint32), np.array([0]), np.array([20]))


def test_the_compiled_word_rule_gives_the_numpy_references_stretches(index, batch, monkeypatch):
    """WordEvidence.enough (leakage.kernels.words_enough) against the numpy word rule it replaced
    (word_hashes, the lookup, scipy's sparse product), on stretches of the planted corpus and of a
    text of capitals, digits and long words, at random (empty, one token, overlapping, whole
    documents): the same words, the same per-item IDF sums bit for bit, and the same stretches
    pass; also with the boilerplate ("hot") word n-grams of a lower cut-off, and with each item's
    need set exactly at its largest sum (those stretches pass) and one step above (none does), or
    out of reach with some grams passing on their own (`any_gram`), or at random below it (each
    time with the prefix postings cut for those needs: WordEvidence.with_needs)."""
    from pipelines.leakage import kernels as lk
    from pipelines.leakage import words as lw

    det = ld.Detector.shared(index, ld.DetectorConfig(mode=ld.BOTH))
    tokens, starts, ends = batch
    text = "What is the NAME of IGNEOUS rocks? x2y3 frac1z2 \\frac{1}{z^2} " + "Supercalifragilistic" * 9 + " é" * 30
    tokens = np.concatenate([tokens, np.asarray(dolma2().encode_ordinary(text * 3), np.uint32)])
    rng = np.random.default_rng(2)
    lo = np.concatenate([starts, [ends[-1]], rng.integers(0, tokens.size, 3000)])
    width = np.concatenate([ends - starts, [tokens.size - ends[-1]], rng.choice([0, 1, 2, 7, 40, 300, 2000], 3000)])
    hi = np.minimum(lo + width, tokens.size)
    words = det.candidates.words
    monkeypatch.setattr(lw, "WORD_HOT_DF", 10)
    q_ids, q_off = index.parts["question"]
    hot = lw.WordEvidence(words.tables, q_ids, q_off, det.indexed, 0.1, det.cfg.candidate_word_ngram)
    assert not words.hot.any() and hot.hot.any() and hot.any_gram.any()  # both ways of the hot grams
    t = words.tables
    for toks in (tokens, tokens.astype(np.int64)):
        wh, count = lk.stretch_words(toks, lo, hi, t.h, t.pow_, t.flags)
        want_wh, want_count = ref.stretch_words(words, toks, lo, hi)
        assert (count == want_count).all() and (wh == want_wh).all() and wh.size > 100_000
    for w in (hot, words):  # `have` is then words'
        got, want = w.enough(tokens, lo, hi), ref.enough(w, tokens, lo, hi)
        assert got.tolist() == want.tolist() and 200 < got.size < lo.size - 200, got.size
        have = ref.item_sums(w, tokens, lo, hi)[0].tocoo()  # scipy's, by stretch then item
        order = np.lexsort((have.col, have.row))
        row, col, total = w.item_sums(tokens, lo, hi)
        assert (row == have.row[order]).all() and (col == have.col[order]).all() and col.size > 10_000
        assert (total == have.data[order]).all()  # bit for bit: each item's IDF summed in the same order
    most = np.full(words.need.size, -np.inf)
    np.maximum.at(most, have.col, have.data)
    passed, free = [], np.zeros_like(words.any_gram)
    for need in (most, np.nextafter(most, np.inf), np.inf, most * rng.uniform(0.3, 1.0, most.size)):
        if np.isscalar(need):  # no need met: only a gram of an item that needs nothing passes a stretch
            free = rng.random(words.any_gram.size) < 0.02
        exact = words.with_needs(np.where(most > 0, need, np.inf), free)  # the prefix postings cut anew
        got, want = exact.enough(tokens, lo, hi), ref.enough(exact, tokens, lo, hi)
        assert got.tolist() == want.tolist()
        passed.append(got.size)
    assert passed[0] > 20 and passed[1] == 0 and passed[2] > 20 and passed[3] > passed[0]


def test_the_candidates_are_the_numpy_references_and_do_not_depend_on_the_order(index, batch):
    """Candidates.docs (the kernels: pre-filter, rules, word rule) gives the candidates of the
    numpy path (tests/pipelines/leakage/reference.py), and Candidates.rules its decided documents and
    windows, on the corpus and on scrambled batches (documents out of token order: their windows
    merge as numpy's running maximum merges them), also with every hit's document sent to the
    word rule; and the documents' order does not change the candidates."""
    import copy

    det = ld.Detector.shared(index, ld.DetectorConfig(mode=ld.BOTH))
    tokens, starts, ends = batch
    rng = np.random.default_rng(5)  # and documents of 8-15-token slices: other items' grams near a hit
    cuts = [tokens[a : a + w] for a, w in zip(rng.integers(0, tokens.size - 20, 4000), rng.integers(8, 16, 4000))]
    mixed = np.concatenate(cuts)
    m_ends = np.arange(1, 201) * (mixed.size // 200)
    batches = [(tokens, starts, ends), _scrambled(index, tokens, 3), _scrambled(index, tokens, 4)]
    batches.append((mixed, m_ends - mixed.size // 200, m_ends))
    got = [det.candidate_docs(*b) for b in batches]
    flip = np.arange(starts.size)[::-1]
    assert np.sort(flip[det.candidate_docs(tokens, starts[flip], ends[flip])]).tolist() == got[0].tolist()
    cand, runs, windows, shared = det.candidates, 0, 0, 0
    to_words = copy.copy(cand)  # no bare gram, no run long enough: every hit's document goes to the words
    to_words.bare_gram, to_words.run_need = np.zeros_like(cand.bare_gram), np.full_like(cand.run_need, 99)
    to_runs = copy.copy(to_words)  # runs of 1 to 5 grams needed: the run rule at its bounds
    to_runs.run_need = rng.integers(1, 6, cand.run_need.size)
    for b, g in zip(batches, got):
        assert ref.docs(cand, *b, size=1024).tolist() == g.tolist() and g.size > 0
        h = cand.hits(*b)  # the rules alone: the documents decided, and every window
        swapped = (*h[:3], h[3][rng.permutation(h[3].shape[0])])  # other hits' neighbours: others' grams
        for c, hh in ((cand, h), (to_words, h), (to_runs, h), (to_runs, swapped)):
            got_rules, want_rules = c.rules(*hh, *b[1:]), ref.rules(c, *hh, *b[1:])
            for x, y in zip(got_rules, want_rules):
                assert x.tolist() == y.tolist()
            windows, shared = windows + got_rules[1].size, shared + int((np.diff(got_rules[3]) == 0).sum())
            runs += np.setdiff1d(got_rules[0], hh[0][c.bare_gram[hh[1]]]).size  # decided by a run alone
    assert runs > 5 and windows > 100 and shared > 0  # decided by runs; two windows in a document
    every_hit = ld.Detector(index, ld.DetectorConfig(candidate_share=0)).candidates  # no check: every hit
    assert every_hit.docs(tokens, starts, ends).tolist() == ref.docs(every_hit, tokens, starts, ends).tolist()


def test_word_hashes_one_token_at_a_time_equal_the_prefix_products(monkeypatch):
    """word_hashes takes words of up to WORD_STEPS tokens by Horner's rule and longer ones by the
    prefix-product formula: both give every word the same hash."""
    from pipelines.leakage import grams as lg

    enc, tables = dolma2(), li.word_tables("dolma2")
    text = "Tokenization of ACGT" * 40 + " the " + "Supercalifragilistic" * 9 + " x2y3 frac1z2 " + "é" * 60
    ids = np.asarray(enc.encode_ordinary(text), np.int64)
    first = np.zeros(ids.size, bool)
    first[[0, ids.size // 2]] = True
    stepped, steps = lg.word_hashes(tables, ids, first), lg.WORD_STEPS
    monkeypatch.setattr(lg, "WORD_STEPS", 1)  # every word of two tokens or more by prefix products
    products = lg.word_hashes(tables, ids, first)
    assert (stepped[1] == products[1]).all() and (stepped[0] == products[0]).all()
    lengths = np.diff(np.append(stepped[1], ids.size))
    assert lengths.max() > steps > 2 and (lengths == 2).any()  # both ways were taken


def test_the_bit_filters_survivors_are_numpys_mask_of_the_same_bits():
    """leakage.kernels._filtered and _filtered3 (the hashes that pass the bit filter, with what goes
    with them, in their order) against numpy's boolean mask, element for element: empty, one and
    many hashes, every hash passing under a filter or under its complement (so the first and the
    last pass in one of the two), none and all passing."""
    from pipelines.leakage import kernels as lk

    rng = np.random.default_rng(0)
    bits = 10
    random = rng.integers(0, 256, 1 << (bits - 3), dtype=np.uint8)
    filters = [random, ~random, np.zeros_like(random), np.full_like(random, 255)]
    for size in (0, 1, 2, 3, 64, 1000):
        h = rng.integers(0, 2**64, size, dtype=np.uint64)
        a, b = rng.integers(-(2**40), 2**40, size), rng.integers(0, 2**40, size)
        top = (h >> np.uint64(64 - bits)).astype(np.int64)
        for filt in filters:
            keep = ((filt[top >> 3] >> (top & 7).astype(np.uint8)) & 1).astype(bool)
            for got, want in zip(lk._filtered3(h, a, b, filt, bits), (h[keep], a[keep], b[keep])):
                assert got.dtype == want.dtype and got.shape == want.shape and (got == want).all()
            for got, want in zip(lk._filtered(h, a, filt, bits), (h[keep], a[keep])):
                assert got.dtype == want.dtype and got.shape == want.shape and (got == want).all()


def test_the_bucketed_lookup_finds_what_a_binary_search_finds():
    """Inverted.hits (bit filter, then the grams' top-bit buckets) against np.searchsorted."""
    from pipelines.leakage.grams import Inverted

    rng = np.random.default_rng(0)
    grams = rng.integers(0, 2**64, 5000, dtype=np.uint64)
    grams[:50] = grams[50]  # held by several items
    grams[60:70] = np.arange(10, dtype=np.uint64)  # crowded into bucket 0
    inv = Inverted(grams, rng.integers(0, 40, grams.size), 40, filter_bits=16)
    queries = np.concatenate([rng.choice(grams, 3000), rng.integers(0, 2**64, 3000, dtype=np.uint64), grams[60:70]])
    at = np.minimum(np.searchsorted(inv.grams, queries), inv.grams.size - 1)
    want = np.flatnonzero(inv.grams[at] == queries)
    got, g = inv.hits(queries)
    assert (got == want).all() and (g == at[want]).all() and got.size > 3000


def test_the_word_rules_pairs_are_the_inverted_indexs_and_its_prefix_postings_cover_each_need(index):
    """WordEvidence keeps each item's distinct question word n-grams and builds the gram × item IDF
    matrix from them: exactly the pairs and IDF of the Inverted index of the same n-grams. Its
    2-prefix postings hold only live grams (not hot) of items that need something; what an item's
    postings leave out weighs less than its need less its largest gram (nothing where one gram may
    meet the need: no stretch without two of its votes can meet it), and a gram votes twice exactly
    where it alone may meet it; also with needs lowered below some items' largest gram."""
    from pipelines.leakage.grams import FILTER_BITS, Inverted, gram_hashes, word_hashes

    det = ld.Detector.shared(index, ld.DetectorConfig(mode=ld.BOTH))
    w, indexed = det.candidates.words, det.indexed
    q_ids, q_off = index.parts["question"]
    first = np.zeros(q_ids.size, bool)
    first[q_off[:-1][np.diff(q_off) > 0]] = True
    wh, at = word_hashes(w.tables, q_ids, first)
    item = np.searchsorted(q_off, at, side="right") - 1
    same = np.flatnonzero(item[: max(0, item.size - w.n + 1)] == item[w.n - 1 :])
    same = same[indexed[item[same]]]
    inv = Inverted(gram_hashes(wh, w.n, same), item[same], indexed.size, FILTER_BITS, int(indexed.sum()))
    m = w.matrix.tocoo()
    got = sorted(zip(m.row.tolist(), m.col.tolist(), m.data.tolist()))
    want = sorted(
        zip(
            np.repeat(np.arange(inv.grams.size), inv.df).tolist(),
            inv.owners.tolist(),
            np.repeat(inv.idf, inv.df).tolist(),
        )
    )
    assert got == want and len(got) > 1000

    live = ~w.hot[m.row] & (w.need[m.col] > 0)
    total = np.bincount(m.col[live], m.data[live], minlength=w.need.size)
    largest = np.zeros(w.need.size)
    np.maximum.at(largest, m.col[live], m.data[live])
    low = np.where(np.random.default_rng(3).random(w.need.size) < 0.3, 0.9 * largest, w.need)  # one gram may do
    for words in (w, w.with_needs(np.where(w.need > 0, low, w.need), w.any_gram)):
        p_item, double = words.pre_items >> 1, (words.pre_items & 1).astype(bool)
        p_gram = np.repeat(np.arange(words.pre_ptr.size - 1), np.diff(words.pre_ptr))
        need = words.need
        assert p_item.size > 100 and (need[p_item] > 0).all() and not words.hot[p_gram].any()
        weight = words.idf[p_gram]
        assert (weight[double] >= need[p_item[double]] * (1 - 1e-6)).all()
        assert (weight[~double] < need[p_item[~double]]).all()
        left_out = total - np.bincount(p_item, weight, minlength=need.size)
        some = need > 0
        reach = np.maximum(need - largest, 0) + 1e-9 * total  # (nothing left out where one gram may do)
        assert (left_out[some] < reach[some]).all() and (left_out[some] > 1e-9 * total[some]).any()
    assert double.sum() > 10  # (the lowered needs)
