"""Compiled kernels (numba) of the eval-leakage candidate search (pipelines/leakage/candidates.py):
the pre-filter every training token pays and the word rule's hashing, lookup and IDF sums.

Why compiled: numpy needs about four passes over every token for the pre-filter (class gather,
non-zero mask, compaction, document bounds) and ~30 per window token for the word rule, each a
separate trip through memory; at ~50 + ~40 µs per 8,192-token record that alone put the check
over its budget (bench/RESULTS.md, "Eval leakage cost", rounds 3 and 4). One loop per token here
does the same work. Each kernel is the numpy path's exact twin: the same uint64 hash arithmetic
(wrapping modulo 2^64 as numpy's does), the same lookup (bit filter, then the sorted grams'
buckets) and the IDF sums in the same order (scipy's sparse product's: gram by gram, ascending),
so its results are equal bit for bit; tests/pipelines/leakage/reference.py keeps the numpy path and
tests/pipelines/leakage/test_kernels.py checks the two against each other. The word rule takes the
sums only of the items its prefix postings can pass (words.WordEvidence._prefix_postings),
the same stretches passing as where every item is summed (`stretch_sums` sums them all, for tests).

The per-token loops read tokens through a slice's iterator and write with unsigned indexes: numba
adds negative-index wraparound arithmetic to every signed index, and in the canonical pass that
took half of the loop's time (bench/RESULTS.md, "Eval leakage cost, round 6").

numba caches each compiled kernel (`cache=True`): in a `__pycache__` beside this file, or, when
the package directory is read-only (an installed wheel on a Dataflow worker), in the user-wide
cache directory (numba's `UserWideCacheLocator`: $XDG_CACHE_HOME/numba or ~/.cache/numba on Linux;
NUMBA_CACHE_DIR overrides both). Checked 2026-12-07 with numba 0.68.1: with pipelines/ bind-mounted
read-only the cache went to $HOME/.cache/numba/pipelines_<hash>/; with $HOME read-only too, numba
refuses cache=True and `_jit` compiles once per process instead (the kernels ran). A first run
compiles them, ~10 s of CPU. Importing the package does not import numba: candidates and
words import this module when a detector scores.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from .index import DIGIT_FIRST, DIGIT_LAST, SPACE_AFTER, SPACE_BEFORE


def _jit(fn: Any) -> Any:
    """njit with the on-disk cache, or without it where numba finds no writable cache directory
    (it refuses cache=True then, at decoration)."""
    try:
        return numba.njit(cache=True, nogil=True)(fn)
    except RuntimeError:
        return numba.njit(nogil=True)(fn)


_U64 = np.uint64
Array = np.ndarray  # every kernel's arrays (numba types them at the call, from the arguments)


@_jit
def gram_hash(c: Array, p: int, n: int, k: np.uint64, ones: np.uint64, mix: np.uint64) -> np.uint64:
    """grams.gram_hashes of the n-gram c[p:p+n]: Horner's rule over the ids (as uint64),
    plus the polynomial of n ones (`_ones_poly`), then mixed."""
    h = _U64(c[_U64(p)])  # (unsigned indexes: no negative-index wraparound)
    for j in range(1, n):
        h = h * k + _U64(c[_U64(p + j)])
    h += ones
    h ^= h >> _U64(31)
    h *= mix
    h ^= h >> _U64(29)
    return h


@_jit
def _walk(h: np.uint64, pos: int, end: int, grams: Array) -> int:
    """The index of hash h in the sorted grams[pos:end] (its bucket), or -1."""
    while pos < end:
        g = grams[pos]
        if g >= h:
            return pos if g == h else -1
        pos += 1
    return -1


@_jit
def _passing(h: Array, filt: Array, bits: int) -> Array:
    """Which of the hashes h the bit filter lets through (filt: a bit per value of the top `bits`
    bits), in one tight loop: its reads, mostly cache misses, overlap (a branch per hash in the
    loop that hashes made the pre-filter ~1.4x slower with the caches cold, as in the audit)."""
    shift = _U64(64 - bits)
    bit = np.empty(h.size, np.bool_)
    for x in range(h.size):
        top = h[x] >> shift
        bit[x] = (filt[top >> _U64(3)] >> np.uint8(top & _U64(7))) & np.uint8(1)
    return bit


@_jit
def _filtered(h: Array, a: Array, filt: Array, bits: int) -> tuple[Array, Array]:
    """(the hashes h that pass the bit filter, their a), in h's order (as `_filtered3`)."""
    keep = _passing(h, filt, bits)
    kept = np.count_nonzero(keep)
    out_h, out_a = np.empty(kept, np.uint64), np.empty(kept, a.dtype)
    y = 0
    for x in range(h.size):
        if keep[x]:
            out_h[y], out_a[y] = h[x], a[x]
            y += 1
    return out_h, out_a


@_jit
def _filtered3(h: Array, a: Array, b: Array, filt: Array, bits: int) -> tuple[Array, Array, Array]:
    """(the hashes h that pass the bit filter, their a, their b), in h's order: one loop over the
    mask (numba's mask indexing, h[keep], makes two passes per array: the pre-filter took ~2 µs
    per record longer with three of them)."""
    keep = _passing(h, filt, bits)
    kept = np.count_nonzero(keep)
    out_h, out_a, out_b = np.empty(kept, np.uint64), np.empty(kept, a.dtype), np.empty(kept, b.dtype)
    y = 0
    for x in range(h.size):
        if keep[x]:
            out_h[y], out_a[y], out_b[y] = h[x], a[x], b[x]
            y += 1
    return out_h, out_a, out_b


@_jit
def _bucket_find(h: Array, bucket: Array, bucket_bits: int, grams: Array) -> Array:
    """grams.Inverted.find's bucket walk for hashes that passed the bit filter, in passes
    over all of them (the bucket bounds first, then the walks): each one's index in the sorted
    `grams`, or -1."""
    b_shift = _U64(64 - bucket_bits)
    b_lo, b_hi = np.empty(h.size, np.int64), np.empty(h.size, np.int64)
    for j in range(h.size):
        b = h[j] >> b_shift
        b_lo[j], b_hi[j] = bucket[b], bucket[b + _U64(1)]
    found = np.empty(h.size, np.int64)
    for j in range(h.size):
        found[j] = _walk(h[j], b_lo[j], b_hi[j], grams)
    return found


@_jit
def sampled_hits(
    tokens: Array,
    starts: Array,
    ends: Array,
    canon: Array,
    n: int,
    s: int,
    k: np.uint64,
    ones: np.uint64,
    mix: np.uint64,
    filt: Array,
    bits: int,
    bucket: Array,
    bucket_bits: int,
    grams: Array,
) -> tuple[Array, Array, Array, Array]:
    """The pre-filter (candidates.Candidates.hits) on documents tokens[starts[d]:ends[d]]:
    each document's canonical ids (canon[token], the zeros dropped), its n-grams sampled every
    s-th from its start, each looked up. → for each hit, in document then position order: its
    document d, its gram's index in `grams`, the raw position of its first token, and the index
    of the n-gram at each of the 2s+1 positions around it (-1: none, or outside the document).
    A token outside `canon` raises IndexError (numpy's np.take does too).

    In passes, as numpy did, because much of the time is memory latency: a lookup that passes the
    bit filter reads a bucket and a gram at random in ~14 MB, and one lookup at a time (the walk
    depends on the bucket) waits for each read in turn; a pass over all the survivors' buckets,
    then over their grams, lets the reads overlap (`_found_grams`: the word rule's lookups in
    passes took 14 µs per record on the bench set where one at a time took 37).

    Over 80 lines (tests/test_function_length.py names it): its 14 arguments annotated one a line;
    the body is one compiled pass of ~70 lines, cut only with the cost measured again (bench/
    RESULTS.md, "Eval leakage cost"). Measured 2026-12-08 (numba 0.68.1, one process, the kernels
    interleaved on the same 3.7M tokens): steps 1-2 and 4 as helpers took 13% more CPU, step 4
    alone 3% more (hit_windows' split: no change), so it stays whole."""
    docs, vocab = starts.size, canon.size
    total = 0
    for d in range(docs):
        total += max(0, ends[d] - starts[d])
    # 1. each document's canonical ids, compacted without a branch (a zero is written, then
    # overwritten: a branch on it would mispredict on ~40% of code's tokens), and 2. its sampled
    # n-grams' hashes, while they are in cache: the few that pass the bit filter (~7%) are kept
    c = np.empty(total + 1, canon.dtype)
    first = np.empty(docs + 1, np.int64)
    cap = 0
    for d in range(docs):
        cap += max(0, (ends[d] - starts[d] - n + s) // s)
    all_h, all_d, all_p = np.empty(cap, np.uint64), np.empty(cap, np.int64), np.empty(cap, np.int64)
    m = j = 0
    for d in range(docs):
        first[d] = m
        for t in tokens[starts[d] : ends[d]]:  # (a slice's iterator: no index arithmetic per token)
            if t < 0 or t >= vocab:
                raise IndexError("a token id outside the vocabulary")
            v = canon[t]
            c[_U64(m)] = v  # an unsigned index: numba adds no negative-index wraparound (~2x the loop)
            m += v != 0
        for p in range(first[d], m - n + 1, s):
            all_h[j], all_d[j], all_p[j] = gram_hash(c, p, n, k, ones, mix), d, p
            j += 1
    first[docs] = m
    keep_h, keep_d, keep_p = _filtered3(all_h[:j], all_d[:j], all_p[:j], filt, bits)
    kept = keep_h.size
    # 3. their buckets, then the grams there, each pass over all of them
    found = _bucket_find(keep_h, bucket, bucket_bits, grams)
    hits = 0
    for j in range(kept):
        hits += found[j] >= 0
    # 4. the hits: their raw positions (one walk over each document with a hit) and the hashes of
    # the grams around them inside the document
    width = 2 * s + 1
    h_doc, h_gram, h_at = np.empty(hits, np.int64), np.empty(hits, np.int64), np.empty(hits, np.int64)
    near_h, near_at, v = np.empty(hits * width, np.uint64), np.empty(hits * width, np.int64), 0
    r, walked, raw, seen = 0, -1, 0, 0
    for j in range(kept):
        if found[j] < 0:
            continue
        d, p = keep_d[j], keep_p[j]
        if d != walked:  # (hits come in document then position order)
            walked, raw, seen = d, starts[d], first[d] - 1
        while seen < p:  # raw - 1: the token of compacted position p
            seen += canon[tokens[raw]] != 0
            raw += 1
        h_doc[r], h_gram[r], h_at[r] = d, found[j], raw - 1
        last = first[d + 1] - n  # the document's last n-gram start
        for x in range(width):
            q = p - s + x
            if first[d] <= q <= last:
                near_h[v], near_at[v] = gram_hash(c, q, n, k, ones, mix), r * width + x
                v += 1
        r += 1
    # 5. their lookups in passes too (mostly grams of the index: one at a time, each waited on its
    # filter byte, bucket and gram in turn)
    pass_h, pass_at = _filtered(near_h[:v], near_at[:v], filt, bits)
    near = np.full((hits, width), -1, np.int64)
    near.reshape(hits * width)[pass_at] = _bucket_find(pass_h, bucket, bucket_bits, grams)
    return h_doc, h_gram, h_at, near


@_jit
def hit_windows(
    h_doc: Array,
    g: Array,
    h_at: Array,
    near: Array,
    starts: Array,
    ends: Array,
    bare_gram: Array,
    run_need: Array,
    reach: Array,
    ptr: Array,
    owners: Array,
    pair_keys: Array,
    n_items: int,
) -> tuple[Array, Array, Array, Array]:
    """The candidate check's rules on the pre-filter's hits (`sampled_hits`: document, gram, raw
    position, neighbour grams; in document order) → (the documents they decide, sorted; the word
    rule's windows of the others: lo, hi, document). A document is decided by a hit on a `bare`
    gram, or by a run (`_decided`). The windows reach reach[gram] tokens each side of a hit,
    within its document, sorted by document then start and merged where one starts inside the
    ones before it (`_merged`)."""
    decided = _decided(h_doc, g, near, starts.size, bare_gram, run_need, ptr, owners, pair_keys, n_items)
    hits = h_doc.size
    lo, hi, doc = np.empty(hits, np.int64), np.empty(hits, np.int64), np.empty(hits, np.int64)
    m = 0
    for j in range(hits):
        d = h_doc[j]
        if decided[d]:
            continue
        r = reach[g[j]]
        lo[m], hi[m], doc[m] = max(h_at[j] - r, starts[d]), min(h_at[j] + r, ends[d]), d
        m += 1
    seg_lo, seg_hi, seg_doc = _merged(lo[:m], hi[:m], doc[:m])
    return np.flatnonzero(decided), seg_lo, seg_hi, seg_doc


@_jit
def _decided(
    h_doc: Array,
    g: Array,
    near: Array,
    docs: int,
    bare_gram: Array,
    run_need: Array,
    ptr: Array,
    owners: Array,
    pair_keys: Array,
    n_items: int,
) -> Array:
    """Which of the `docs` documents the hits decide (bool [docs]): a hit on a `bare` gram, or a
    run: an item holding the hit's gram has min(8, half its question 5-grams) (run_need) of its
    own distinct grams among the hit's neighbours (grams.Inverted.pair_keys: the sorted
    gram·n_items + item keys)."""
    hits, width = h_doc.size, near.shape[1]
    decided = np.zeros(docs, np.bool_)
    for j in range(hits):
        if bare_gram[g[j]]:
            decided[h_doc[j]] = True
    for j in range(hits):
        if decided[h_doc[j]]:  # (a run would decide it again)
            continue
        present = 0
        for x in range(width):
            present += near[j, x] >= 0
        for kk in range(ptr[g[j]], ptr[g[j] + 1]):
            item = owners[kk]
            need = run_need[item]
            if present < need:  # a bound: its own grams are fewer
                continue
            count = 0
            for x in range(width):
                v = near[j, x]
                if v < 0:
                    continue
                seen = False
                for y in range(x):
                    seen |= near[j, y] == v
                if seen:
                    continue
                key = v * n_items + item
                at = np.searchsorted(pair_keys, key)
                count += at < pair_keys.size and pair_keys[at] == key
            if count >= need:
                decided[h_doc[j]] = True
                break
    return decided


@_jit
def _merged(lo: Array, hi: Array, doc: Array) -> tuple[Array, Array, Array]:
    """Windows [lo, hi) of documents `doc` (in document order) → the same, sorted by document then
    start and merged where one starts inside the ones before it (their running end, over the whole
    batch, as numpy's maximum.accumulate)."""
    m = lo.size
    order = np.empty(m, np.int64)
    a = 0
    while a < m:  # within each document (hits come in document order), by start
        b = a
        while b < m and doc[b] == doc[a]:
            b += 1
        order[a:b] = a + np.argsort(lo[a:b], kind="mergesort")
        a = b
    seg_lo, seg_hi, seg_doc = np.empty(m, np.int64), np.empty(m, np.int64), np.empty(m, np.int64)
    segs, run = 0, np.int64(0)
    for i in range(m):
        x = order[i]
        if i == 0 or doc[x] != seg_doc[segs - 1] or lo[x] > run:
            seg_lo[segs], seg_hi[segs], seg_doc[segs] = lo[x], hi[x], doc[x]
            segs += 1
        else:
            seg_hi[segs - 1] = max(seg_hi[segs - 1], hi[x])
        run = hi[x] if i == 0 else max(run, hi[x])
    return seg_lo[:segs].copy(), seg_hi[:segs].copy(), seg_doc[:segs].copy()


@_jit
def words_enough(
    tokens: Array,
    lo: Array,
    hi: Array,
    word_h: Array,
    word_pow: Array,
    flags: Array,
    n: int,
    k: np.uint64,
    ones: np.uint64,
    mix: np.uint64,
    filt: Array,
    bits: int,
    bucket: Array,
    bucket_bits: int,
    grams: Array,
    hot: Array,
    pre_ptr: Array,
    pre_items: Array,
    item_ptr: Array,
    item_grams: Array,
    idf: Array,
    need: Array,
    any_gram: Array,
) -> Array:
    """The word rule (words.WordEvidence.enough) on stretches tokens[lo[r]:hi[r]] → whether
    each passes: a gram found belongs to an item that needs nothing (`any_gram`), or one item's
    IDF sum is non-zero and at least its need (scipy's product leaves zero sums out). Only an item
    with two votes in the prefix postings of the stretch's grams can pass (pre_items[pre_ptr[g]:
    pre_ptr[g+1]]: item·2 + 1 where the gram alone may meet the item's need, a vote of two;
    WordEvidence._prefix_postings): only its sum is taken (`_item_sum`, bit for bit the product's)."""
    stretches, items = lo.size, need.size
    out = np.zeros(stretches, np.bool_)
    f_ptr, f_gram = _found_grams(
        tokens, lo, hi, word_h, word_pow, flags, n, k, ones, mix, filt, bits, bucket, bucket_bits, grams, hot
    )
    seen, votes, named = np.full(items, -1, np.int64), np.zeros(items, np.int64), np.empty(items, np.int64)
    for r in range(stretches):
        if f_ptr[r] == f_ptr[r + 1]:
            continue
        distinct = _distinct(f_gram[f_ptr[r] : f_ptr[r + 1]])
        free = False
        for g in distinct:
            free |= any_gram[g]
        if free:
            out[r] = True
            continue
        nn = 0
        for g in distinct:
            for kk in range(pre_ptr[g], pre_ptr[g + 1]):
                item, vote = pre_items[kk] >> 1, 1 + (pre_items[kk] & 1)
                if seen[item] != r:
                    seen[item], votes[item] = r, 0
                named[nn] = item
                nn += votes[item] < 2 <= votes[item] + vote  # (named once: when its votes reach two)
                votes[item] += vote
        for j in range(nn):
            item = named[j]
            total = _item_sum(distinct, item_grams[item_ptr[item] : item_ptr[item + 1]], idf)
            if total != 0.0 and total >= need[item]:
                out[r] = True
                break
    return out


@_jit
def _distinct(found: Array) -> Array:
    """The distinct values of `found`, ascending (np.unique's, which numba builds through a list:
    2-2.4x slower on 5-200 values)."""
    order = np.sort(found)
    m = 0
    for j in range(order.size):
        if j == 0 or order[j] != order[m - 1]:
            order[m] = order[j]
            m += 1
    return order[:m]


@_jit
def _item_sum(distinct: Array, own: Array, idf: Array) -> float:
    """The IDF of the grams in both `distinct` and `own` (both ascending), summed in ascending order
    from 0.0: the sum scipy's sparse product (and `_item_sums`) gives the item owning `own`."""
    total, a, b = 0.0, 0, 0
    while a < distinct.size and b < own.size:
        x, y = distinct[a], own[b]
        if x == y:
            total += idf[x]
        a += x <= y
        b += y <= x
    return total


@_jit
def prefix_votes(ptr: Array, weight: Array, need: Array) -> Array:
    """words.WordEvidence._prefix_postings's cut: for each item i, its pairs ptr[i]:ptr[i+1]
    (rarest first: their IDF `weight` descending) → each pair's vote: 0 outside the item's
    2-prefix (the weight from it to the end is below need[i] less the item's largest weight), 2
    where its weight alone may meet the need, else 1. Floors are lowered by 1e-7 of the need and
    largest weight (far more than float summation can differ); an infinite need gives no votes."""
    votes = np.zeros(weight.size, np.int8)
    for i in range(ptr.size - 1):
        if ptr[i] == ptr[i + 1] or need[i] == np.inf:
            continue
        largest = weight[ptr[i]]
        margin = 1e-7 * max(1.0, abs(need[i]) + largest)
        rest = 0.0
        for j in range(ptr[i + 1] - 1, ptr[i] - 1, -1):
            rest += weight[j]
            if rest >= need[i] - largest - margin:
                votes[j] = 2 if weight[j] >= need[i] - margin else 1
    return votes


@_jit
def stretch_sums(
    tokens: Array,
    lo: Array,
    hi: Array,
    word_h: Array,
    word_pow: Array,
    flags: Array,
    n: int,
    k: np.uint64,
    ones: np.uint64,
    mix: np.uint64,
    filt: Array,
    bits: int,
    bucket: Array,
    bucket_bits: int,
    grams: Array,
    hot: Array,
    indptr: Array,
    indices: Array,
    idf: Array,
    items: int,
) -> tuple[Array, Array, Array]:
    """Every stretch's non-zero per-item IDF sums as `words_enough` computes them → (stretch,
    item, sum), by stretch then item: what the tests compare, bit for bit, with scipy's product."""
    f_ptr, f_gram = _found_grams(
        tokens, lo, hi, word_h, word_pow, flags, n, k, ones, mix, filt, bits, bucket, bucket_bits, grams, hot
    )
    acc, seen, touched = np.zeros(items, np.float64), np.full(items, -1, np.int64), np.empty(items, np.int64)
    no_free = np.zeros(indptr.size - 1, np.bool_)
    rows, cols, sums = [0], [0], [0.0]  # typed by their first (dropped) element
    for r in range(lo.size):
        nt, _ = _item_sums(f_gram[f_ptr[r] : f_ptr[r + 1]], r, indptr, indices, idf, no_free, acc, seen, touched)
        for item in np.sort(touched[:nt]):
            if acc[item] != 0.0:
                rows.append(r)
                cols.append(item)
                sums.append(acc[item])
    return np.array(rows[1:], np.int64), np.array(cols[1:], np.int64), np.array(sums[1:], np.float64)


@_jit
def _found_grams(
    tokens: Array,
    lo: Array,
    hi: Array,
    word_h: Array,
    word_pow: Array,
    flags: Array,
    n: int,
    k: np.uint64,
    ones: np.uint64,
    mix: np.uint64,
    filt: Array,
    bits: int,
    bucket: Array,
    bucket_bits: int,
    grams: Array,
    hot: Array,
) -> tuple[Array, Array]:
    """Each stretch's cleaned words (`_words`), their n-grams hashed and looked up, the hot ones
    left out → (ptr, gram): stretch r's grams found are gram[ptr[r]:ptr[r+1]] (indexes in `grams`,
    in word order). In passes, as in `sampled_hits`: the filter on all, then the buckets of the
    ones that pass, then their grams (the random reads overlap)."""
    stretches = lo.size
    total = 0
    for r in range(stretches):
        total += max(0, hi[r] - lo[r])
    words = np.empty(total + 1, np.uint64)
    all_h, all_r = np.empty(total + 1, np.uint64), np.empty(total + 1, np.int64)
    j = 0
    for r in range(stretches):
        w = _words(tokens, lo[r], hi[r], word_h, word_pow, flags, words)
        for i in range(w - n + 1):
            all_h[j], all_r[j] = gram_hash(words, i, n, k, ones, mix), r
            j += 1
    keep_h, keep_r = _filtered(all_h[:j], all_r[:j], filt, bits)
    kept = keep_h.size
    found = _bucket_find(keep_h, bucket, bucket_bits, grams)
    ptr = np.zeros(stretches + 1, np.int64)
    gram = np.empty(kept, np.int64)
    nf = 0
    for j in range(kept):
        g = found[j]
        if g >= 0 and not hot[g]:
            gram[nf] = g
            nf += 1
            ptr[keep_r[j] + 1] += 1
    for r in range(stretches):
        ptr[r + 1] += ptr[r]
    return ptr, gram[:nf]


@_jit
def _item_sums(
    found: Array,
    r: int,
    indptr: Array,
    indices: Array,
    idf: Array,
    any_gram: Array,
    acc: Array,
    seen: Array,
    touched: Array,
) -> tuple[int, bool]:
    """Stretch r's grams found (indexes, any order, repeats): per item the IDF of its distinct
    ones (idf: the gram × item matrix's CSR data), summed gram by gram in ascending order from
    0.0, as scipy's sparse product does (bit for bit) → (how many items it touched: touched[:count],
    their sums in acc; whether a gram found is `any_gram`)."""
    distinct = np.sort(found)
    nt, free, last = 0, False, -1
    for j in range(distinct.size):
        g = distinct[j]
        if g == last:
            continue
        last = g
        free |= any_gram[g]
        for kk in range(indptr[g], indptr[g + 1]):
            item = indices[kk]
            if seen[item] != r:
                seen[item] = r
                acc[item] = 0.0
                touched[nt] = item
                nt += 1
            acc[item] += idf[kk]
    return nt, free


@_jit
def _words(tokens: Array, a: int, b: int, word_h: Array, word_pow: Array, flags: Array, out: Array) -> int:
    """The cleaned words of tokens[a:b] (grams.word_hashes, the stretch's first token
    starting one) into out[:count] → count: a word starts at a non-empty token that begins with a
    space, follows one that ends with a space, or where digits and letters meet; its hash is
    Horner's rule over its tokens' hashes and powers (an empty token, hash 0 and power 1, changes
    nothing)."""
    vocab = word_h.size
    w = 0
    prev = np.uint8(0)
    start = True
    for t in tokens[a:b]:  # (a slice's iterator, unsigned indexes: no index arithmetic or wraparound)
        if t < 0 or t >= vocab:
            raise IndexError("a token id outside the vocabulary")
        f, h = flags[t], word_h[t]
        cut = start or (
            (f & SPACE_BEFORE) != 0
            or (prev & SPACE_AFTER) != 0
            or ((prev & DIGIT_LAST) != 0) != ((f & DIGIT_FIRST) != 0)
        )
        start = False
        if cut and h != 0:
            out[_U64(w)] = h
            w += 1
        elif w > 0:
            out[_U64(w - 1)] = out[_U64(w - 1)] * word_pow[t] + h
        prev = f
    return w


@_jit
def stretch_words(
    tokens: Array, lo: Array, hi: Array, word_h: Array, word_pow: Array, flags: Array
) -> tuple[Array, Array]:
    """The cleaned words of each stretch tokens[lo[r]:hi[r]] as `words_enough` cuts and hashes
    them → (their hashes, stretch after stretch; each stretch's count). What the tests compare
    with grams.word_hashes."""
    total = 0
    for r in range(lo.size):
        total += max(0, hi[r] - lo[r])
    out = np.empty(total, np.uint64)
    count = np.zeros(lo.size, np.int64)
    w = 0
    for r in range(lo.size):
        count[r] = _words(tokens, lo[r], hi[r], word_h, word_pow, flags, out[w:])
        w += count[r]
    return out[:w].copy(), count
