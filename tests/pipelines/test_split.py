"""Held-out choice, shard choice and dedup choice are pure functions of the text (and ids)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from pipelines.split import choose_kept, split_of, text_digest


def test_heldout_is_a_function_of_the_text_and_close_to_the_fraction():
    digests = [text_digest(f"document number {i}") for i in range(20000)]
    held = sum(split_of(d, 0.1) == "heldout" for d in digests)
    assert 1800 < held < 2200
    assert all(split_of(d, 0.0) == "train" for d in digests[:1000])
    assert split_of(text_digest("same text"), 0.5) == split_of(text_digest("same text"), 0.5)
    with pytest.raises(ValueError):
        split_of(digests[0], 1.0)


def test_raising_the_fraction_only_moves_documents_into_heldout():
    digests = [text_digest(str(i)) for i in range(5000)]
    small = {d for d in digests if split_of(d, 0.05) == "heldout"}
    large = {d for d in digests if split_of(d, 0.2) == "heldout"}
    assert small < large


@dataclass(frozen=True)
class D:
    source: str
    id: str
    file: str = "f"
    line: int = 1


def test_dedup_keeps_the_smallest_source_then_id_whatever_the_order():
    copies = [D("web", "a"), D("books", "z"), D("books", "b"), D("web", "0")]
    for rot in range(len(copies)):
        kept, dups = choose_kept(copies[rot:] + copies[:rot])
        assert kept == D("books", "b")
        assert sorted(dups, key=lambda d: (d.source, d.id)) == [D("books", "z"), D("web", "0"), D("web", "a")]
