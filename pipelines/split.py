"""Held-out split and dedup: pure functions of a document's text digest and location.

The digest is sha256 of the document's UTF-8 text. Its first 8 bytes choose the split, so exact
duplicates always land in the same split, whichever source or file they come from.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Protocol, TypeVar

from contract import HELDOUT, TRAIN

_U64 = 1 << 64


def text_digest(text: str) -> bytes:
    """sha256 of the UTF-8 text (raises UnicodeEncodeError on lone surrogates)."""
    return hashlib.sha256(text.encode("utf-8")).digest()


def heldout_threshold(fraction: float) -> int:
    if not 0 <= fraction < 1:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {fraction}")
    return math.floor(fraction * _U64)


def is_heldout(digest: bytes, threshold: int) -> bool:
    """The held-out rule, with `heldout_threshold(fraction)` computed once by the caller."""
    return int.from_bytes(digest[:8], "big") < threshold


def split_of(digest: bytes, fraction: float) -> str:
    """ "heldout" for about `fraction` of digests (uniform first 8 bytes), else "train"."""
    return HELDOUT if is_heldout(digest, heldout_threshold(fraction)) else TRAIN


class _Keyed(Protocol):
    """What dedup reads of a copy (read-only: a NamedTuple's fields qualify)."""

    @property
    def source(self) -> str: ...
    @property
    def id(self) -> str: ...
    @property
    def file(self) -> str: ...
    @property
    def line(self) -> int: ...


K = TypeVar("K", bound=_Keyed)  # a copy, whatever its type: choose_kept returns what it was given


def dedup_order(doc: _Keyed) -> tuple[str, str, str, int]:
    """Among identical texts the copy with the smallest (source name, id) is kept; file and line
    only break ties between copies that are identical in source, id and text."""
    return (doc.source, doc.id, doc.file, doc.line)


def choose_kept(copies: Iterable[K], heldout_sources: frozenset[str] = frozenset()) -> tuple[K, list[K]]:
    """(kept, [duplicates]) for the copies of one text. A copy in a held-out-only source
    (`split: heldout`) is kept first, so that the text's other copies never reach training."""
    ordered = sorted(copies, key=lambda d: (d.source not in heldout_sources, dedup_order(d)))
    if not ordered:
        raise ValueError("no copies")
    return ordered[0], ordered[1:]
