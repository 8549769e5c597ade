"""The tokenizer-exactness corpus (issue 60): built here, deterministically, covering what it
promises; the bench documents distinct, with a vocabulary that keeps growing."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

from bench.exactness_corpus import (
    KINDS,
    LONG_CHARS,
    bench_docs,
    fixture_docs,
    read_fixture,
    write_fixture,
)

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "pipelines" / "data" / "exactness.jsonl.gz"


def test_the_committed_fixture_is_what_the_generator_writes(tmp_path):
    write_fixture(tmp_path / "again.jsonl.gz", fixture_docs())
    assert (tmp_path / "again.jsonl.gz").read_bytes() == FIXTURE.read_bytes()
    assert len(FIXTURE.read_bytes()) < 200_000  # small enough to keep in the repository


def _has(texts, pred) -> bool:
    return any(pred(c) for t in texts for c in t)


def test_the_fixture_holds_every_kind_of_hard_text():
    docs = read_fixture(FIXTURE)
    by_kind = {k: [d["text"] for d in docs if d["id"].startswith(f"{k}-")] for k in KINDS}
    assert all(len(v) == 6 for v in by_kind.values()) and len(docs) == 6 * len(KINDS)
    assert len({unicodedata.name(c, "?").split()[0] for t in by_kind["multilingual"] for c in t}) >= 20  # scripts
    assert _has(by_kind["emoji"], lambda c: c == "\u200d") and _has(
        by_kind["emoji"], lambda c: 0x1F1E6 <= ord(c) <= 0x1F1FF
    )
    assert _has(by_kind["combining"], lambda c: unicodedata.category(c) == "Mn")
    assert _has(by_kind["rtl"], lambda c: unicodedata.bidirectional(c) in ("R", "AL"))
    assert _has(by_kind["rtl"], lambda c: c in "\u202e\u2067")  # bidi controls
    assert _has(by_kind["cjk"], lambda c: 0x4E00 <= ord(c) <= 0x9FFF) and _has(
        by_kind["cjk"], lambda c: ord(c) > 0xFFFF
    )
    runs = [len(m) for t in by_kind["whitespace"] for m in re.findall(r"\s{100,}", t)]
    assert runs and max(runs) >= 1000
    assert _has(by_kind["whitespace"], lambda c: c in "\u3000\u2028\x85\x0b")
    assert any(re.search(r"'(S|LL|RE|Ve)\b", t) for t in by_kind["contractions"])


def test_the_long_document_is_over_a_million_characters_of_every_kind():
    text = fixture_docs(per_kind=0, long_chars=LONG_CHARS)[-1]["text"]
    assert len(text) >= 1_000_000
    assert "\u200d" in text and re.search(r"\s{100,}", text) and re.search(r"[\u0590-\u06ff]", text)


def test_bench_documents_are_distinct_and_their_vocabulary_keeps_growing():
    base = ["the", "of", "and", "a", "to", "in", "is", "def", "return", "x"]
    gen = bench_docs(7, base)
    docs = [next(gen) for _ in range(400)]
    assert len({d["text"] for d in docs}) == len({d["id"] for d in docs}) == 400
    words = [set(re.findall(r"\w+", d["text"])) for d in docs]
    first, second = set().union(*words[:200]), set().union(*words[200:])
    assert len(second - first) > 0.2 * len(second)  # Heaps' law: new words keep coming
    again = bench_docs(7, base)
    assert [next(again) for _ in range(20)] == docs[:20]  # deterministic
