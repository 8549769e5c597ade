"""The training span a decon hit shows (pipelines/leakage/detect.py, audit check 8's examples): the
characters of the document that a hit's decon-space ids come from, between some context.

decon scores the text cleaned (`index.clean_text`) and tokenized again; a hit is a range of
those ids. `span_map` traces one document's cleaned characters back to its own and takes the
character offset of each decon-space id, once per document (cleaning and encoding it per hit made a
document's cost quadratic in its hits: 400 copies in a 51k-token document took 51 s); `raw_span`
then reads any number of hits from it. The span is returned as character offsets into the text
shown, not as markers inside it: a document may hold any character (CJK text holds 【 and 】).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import numpy as np

from .index import DECON_PUNCTUATION, clean_text

if TYPE_CHECKING:
    import tiktoken

DECON_PUNCT_SET = frozenset(DECON_PUNCTUATION)
MAX_SPAN_CHARS = 1500  # of an example span's text (as the document has it)
CONTEXT_CHARS = 200  # shown on each side of it


@dataclasses.dataclass(frozen=True)
class SpanMap:
    """One document's text, its cleaning (decon's), each cleaned character's index in the text, and
    each decon-space id's character offset in " " + cleaned."""

    text: str
    cleaned: str
    origin: list[int]
    kept: list[int]


def span_map(enc: tiktoken.Encoding, canon: np.ndarray, text: str) -> SpanMap | None:
    """A document's cleaned text traced back to its characters, and the character offset of each of
    its decon-space ids (enc: the tokenizer; canon: its ids' canonical classes, 0 dropped): cleaned
    and encoded once per document, whatever number of hits `raw_span` then reads it for (None when
    the cleaning cannot be traced character by character, e.g. a character whose lower case is
    longer)."""
    origin: list[int] = []  # for each character of the cleaned text: its index in `text`
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
    ids = enc.encode_ordinary(" " + cleaned)
    _, offsets = enc.decode_with_offsets(ids)
    live = canon[np.asarray(ids, np.int64)] != 0
    kept = [o for o, keep in zip(offsets, live.tolist()) if keep]
    return SpanMap(text, cleaned, origin, kept)


def raw_span(m: SpanMap, start: int, end: int) -> tuple[str, int, int] | None:
    """The characters of the document that ids [start, end) of its decon-space ids come from, between
    up to CONTEXT_CHARS of context on each side, as decon reports: (the text shown, the highlighted
    span's [first, last) character in it), or None where the ids are out of range."""
    text, cleaned, origin, kept = m.text, m.cleaned, m.origin, m.kept
    if not 0 <= start < end <= len(kept):
        return None
    lo = max(0, kept[start] - 1)
    while lo < len(cleaned) - 1 and cleaned[lo] == " ":
        lo += 1
    hi = kept[end] - 1 if end < len(kept) else len(cleaned)
    a, b = origin[min(lo, len(origin) - 1)], origin[max(lo, min(hi, len(origin)) - 1)] + 1
    b = min(b, a + MAX_SPAN_CHARS)
    before = ("…" if a > CONTEXT_CHARS else "") + text[max(0, a - CONTEXT_CHARS) : a]
    after = text[b : b + CONTEXT_CHARS] + ("…" if b + CONTEXT_CHARS < len(text) else "")
    return before + text[a:b] + after, len(before), len(before) + b - a
