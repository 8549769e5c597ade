"""Rows to look at: a few decoded training documents per source, rejected and duplicate documents
with their reason, and the held-out document that shares the most 13-grams with training (the
shared words highlighted).

This is a view, not a check: it reads a bounded prefix of the shards (the first
`OVERLAP_TRAIN_DOCS` training and `OVERLAP_HELDOUT_DOCS` held-out documents of each source, in
reading order) and the pipeline's rejects/ and duplicates/ files (their first `MAX_LISTED` rows),
so its cost does not grow with the dataset. `collect` is the I/O (JSON-able output, stored in
audit.json's `samples`); `render` is pure, and every text in it is cut to a bound, then escaped.
"""

from __future__ import annotations

import itertools
import json
import os
from collections.abc import Callable, Iterator
from html import escape
from typing import Any

import numpy as np

from contract import HELDOUT, TRAIN, DocumentSplitter, Manifest, parse_records

from .contamination import _WORD, NGRAM, ngram_hashes
from .shard_reader import iter_record_chunks

SAMPLES = "samples"  # audit.json's key
DOCS_PER_SOURCE = 2  # decoded training documents shown per source
MAX_DOC_CHARS = 700  # characters of a document shown (then "…")
MAX_LISTED = 3  # rejected / duplicate rows shown per source
OVERLAP_TRAIN_DOCS = 3000  # per source: training documents whose 13-grams the overlap view indexes
OVERLAP_HELDOUT_DOCS = 300  # per source: held-out documents searched for the most shared 13-grams
MAX_INDEX_NGRAMS = 4_000_000  # training 13-grams indexed at most (a sorted uint64 array: 32 MB)

Decode = Callable[[np.ndarray], bytes]


def documents(m: Manifest, split: str, source: str, limit: int, skipped: list[str]) -> Iterator[np.ndarray]:
    """The first `limit` documents of a source's split, in reading order (tokens without EOS). A
    shard that cannot be read ends the source's view, named in `skipped` (check 1 judges shards)."""
    splitter = DocumentSplitter(m.eos_id, m.pad_id)

    def all_docs() -> Iterator[np.ndarray]:
        for shard in m.shards(split, source):
            if not os.path.isfile(shard.abspath):  # a remote shard: this bounded view reads local files only
                skipped.append(f"{shard.path}: not a local file")
                return
            try:
                for raw in iter_record_chunks(shard.abspath):
                    arr, _ = parse_records(raw, m.seq_len, m.vocab_size)
                    yield from splitter.feed(arr)
            except (RuntimeError, OSError, ValueError) as e:  # ArrayRecord raises RuntimeError on damage
                skipped.append(f"{shard.path}: {str(e)[:200]}")
                return

    return itertools.islice(all_docs(), limit)


def _text(decode: Decode, doc: np.ndarray) -> str:
    return decode(doc).decode("utf-8", "replace")


def _jsonl_head(path: str, n: int) -> list[dict[str, Any]]:
    if not os.path.isfile(path):
        return []
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                out.append(json.loads(line))
            if len(out) >= n:
                break
    return out


def shared_words(text: str, index: np.ndarray) -> tuple[int, int, list[tuple[int, int]]]:
    """(shared 13-grams, all 13-grams, character spans of the words they cover) of `text`; index:
    sorted unique uint64 13-gram hashes (pure)."""
    hashes = ngram_hashes(text)
    if len(hashes) == 0:
        return 0, 0, []
    at = np.minimum(np.searchsorted(index, hashes), max(len(index) - 1, 0))
    hit = index[at] == hashes if len(index) else np.zeros(len(hashes), bool)
    covered = np.zeros(len(hashes) + NGRAM - 1, bool)
    for i in np.flatnonzero(hit):
        covered[i : i + NGRAM] = True
    words = [m.span() for m in _WORD.finditer(text)]
    if len(words) != len(covered):  # lower-casing changed the word split (rare scripts): no highlight
        return int(hit.sum()), len(hashes), []
    spans: list[tuple[int, int]] = []
    for k in np.flatnonzero(covered):
        a, b = words[k]
        if spans and k > 0 and covered[k - 1]:
            spans[-1] = (spans[-1][0], b)  # one span over consecutive covered words
        else:
            spans.append((a, b))
    return int(hit.sum()), len(hashes), spans


def collect(manifests: list[Manifest], decode: Decode | None, why_not: str | None = None) -> dict[str, Any]:
    """The rows, JSON-able; {"not_run": why} when the shards cannot be decoded."""
    if decode is None:
        return {"not_run": why_not or "no tokenizer to decode the shards"}
    train, rejects, dups = [], [], []
    chunks: list[np.ndarray] = []
    indexed = 0
    best: dict[str, Any] | None = None
    skipped: list[str] = []
    for m in manifests:
        for source in m.source_names:
            for k, doc in enumerate(documents(m, TRAIN, source, OVERLAP_TRAIN_DOCS, skipped)):
                text = _text(decode, doc)
                if k < DOCS_PER_SOURCE:
                    train.append(
                        {"source": source, "document": k, "tokens": int(doc.size), "text": text[:MAX_DOC_CHARS]}
                    )
                if indexed < MAX_INDEX_NGRAMS:
                    chunks.append(ngram_hashes(text))
                    indexed += len(chunks[-1])
            for r in _jsonl_head(os.path.join(m.root, "rejects", f"{source}.jsonl"), MAX_LISTED):
                rejects.append(
                    {"source": source, "id": r.get("id"), "reason": r.get("reason"), "text": r.get("excerpt")}
                )
            for r in _jsonl_head(os.path.join(m.root, "duplicates", f"{source}.jsonl"), MAX_LISTED):
                kept = r.get("kept") or {}
                dups.append(
                    {
                        "source": source,
                        "id": r.get("id"),
                        "reason": f"same text as {kept.get('id')!r} ({kept.get('source')}), which was kept",
                        "text": None,
                    }
                )
    index = np.unique(np.concatenate(chunks)) if chunks else np.zeros(0, np.uint64)
    for m in manifests:
        for source in m.source_names:
            for k, doc in enumerate(documents(m, HELDOUT, source, OVERLAP_HELDOUT_DOCS, skipped)):
                text = _text(decode, doc)
                shared, total, spans = shared_words(text, index)
                if shared and (best is None or shared > best["shared"]):
                    best = {
                        "source": source,
                        "document": k,
                        "shared": shared,
                        "ngrams": total,
                        "text": text,
                        "spans": spans,
                    }
    if best is not None:  # bounded: the text up to MAX_DOC_CHARS × 2, the spans inside it
        limit = 2 * MAX_DOC_CHARS
        best["spans"] = [(a, min(b, limit)) for a, b in best["spans"] if a < limit]
        best["text"] = best["text"][:limit]
    return {
        "train": train,
        "rejected": rejects,
        "duplicates": dups,
        "most_overlap": best,
        "scanned": {"train_docs_per_source": OVERLAP_TRAIN_DOCS, "heldout_docs_per_source": OVERLAP_HELDOUT_DOCS},
        "skipped": skipped,
    }


def _doc(text: str | None, limit: int = MAX_DOC_CHARS) -> str:
    if text is None:
        return ""
    s = text if len(text) <= limit else text[: limit - 1] + "…"
    return f'<pre class="doc">{escape(s)}</pre>'


def highlighted(text: str, spans: list[tuple[int, int]]) -> str:
    """`text` escaped, each span in <mark> (spans: sorted, disjoint character ranges) (pure)."""
    out, at = [], 0
    for a, b in spans:
        out.append(escape(text[at:a]) + f"<mark>{escape(text[a:b])}</mark>")
        at = b
    out.append(escape(text[at:]))
    return '<pre class="doc">' + "".join(out) + "</pre>"


def render(samples: dict[str, Any] | None) -> str:
    """The "documents to look at" section ('' when there are none)."""
    if not samples:
        return ""
    head = '<section id="rows"><h2>Documents to look at</h2>'
    if samples.get("not_run"):
        return head + f"<p>Not shown: {escape(str(samples['not_run']))}</p></section>"
    parts = [head]
    best = samples.get("most_overlap")
    scanned = samples.get("scanned", {})
    if best:
        parts.append(
            f"<h3>Held-out document with the most shared {NGRAM}-grams: {escape(best['source'])} "
            f"#{best['document']}, {best['shared']:,} of {best['ngrams']:,} {NGRAM}-grams also in training</h3>"
            f"<p>Highlighted: words inside a {NGRAM}-gram that a training document also has (searched: the first "
            f"{scanned.get('heldout_docs_per_source', 0):,} held-out against the first "
            f"{scanned.get('train_docs_per_source', 0):,} training documents of each source). Downstream-task spans "
            "found in training are in check 8's examples.</p>" + highlighted(best["text"], best["spans"])
        )
    else:
        parts.append(f"<p>No held-out document shares a {NGRAM}-gram with the training documents searched.</p>")
    if samples.get("skipped"):
        parts.append(
            "<p>Shards this view stopped at (check 1 judges them): "
            + "; ".join(f"<code>{escape(x[:300])}</code>" for x in samples["skipped"][:MAX_LISTED])
            + "</p>"
        )
    by_source: dict[str, list[dict[str, Any]]] = {}
    for x in samples.get("train", []):
        by_source.setdefault(x["source"], []).append(x)
    docs = "".join(
        f"<h3>{escape(src)}</h3>"
        + "".join(f"<p>document #{x['document']} ({x['tokens']:,} tokens):</p>{_doc(x['text'])}" for x in xs)
        for src, xs in by_source.items()
    )
    parts.append(f"<details><summary>Training documents, decoded ({len(by_source)} sources)</summary>{docs}</details>")
    for key, label in (("rejected", "Rejected documents"), ("duplicates", "Duplicate documents")):
        rows = samples.get(key, [])
        body = "".join(
            f"<p>{escape(str(x['source']))} <code>{escape(str(x['id'])[:200])}</code>: {escape(str(x['reason'])[:300])}</p>"
            + _doc(x.get("text"), 300)
            for x in rows
        )
        parts.append(
            f"<details><summary>{label} with their reason ({len(rows)} shown)</summary>{body or '<p>(none)</p>'}</details>"
        )
    return "".join(parts) + "</section>"
