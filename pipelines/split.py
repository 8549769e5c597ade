"""Held-out split, dedup and shard assignment: pure functions of a document's text digest.

The digest is sha256 of the document's UTF-8 text. Its first 8 bytes choose the split (so exact
duplicates always land in the same split, whichever source they come from), the next 8 bytes
choose the shard inside a (source, split), and sorting by it gives a content-defined order that
no runner, worker count or bundle boundary can change.
"""
from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable
from typing import Protocol

TRAIN, HELDOUT = "train", "heldout"
SPLITS = (TRAIN, HELDOUT)
_U64 = 1 << 64


def text_digest(text: str) -> bytes:
    """sha256 of the UTF-8 text (raises UnicodeEncodeError on lone surrogates)."""
    return hashlib.sha256(text.encode("utf-8")).digest()


def heldout_threshold(fraction: float) -> int:
    if not 0 <= fraction < 1:
        raise ValueError(f"heldout_fraction must be in [0, 1), got {fraction}")
    return math.floor(fraction * _U64)


def split_of(digest: bytes, fraction: float) -> str:
    """"heldout" for about `fraction` of digests (uniform first 8 bytes), else "train"."""
    return HELDOUT if int.from_bytes(digest[:8], "big") < heldout_threshold(fraction) else TRAIN


def num_shards(documents: int, tokens: int, shard_tokens: int) -> int:
    """Shards for a (source, split): ceil(tokens / shard_tokens), at least 1, at most one per document."""
    if documents == 0:
        return 0
    return max(1, min(documents, -(-tokens // shard_tokens)))


def shard_of(digest: bytes, shards: int) -> int:
    return int.from_bytes(digest[8:16], "big") % shards


class _Keyed(Protocol):
    source: str
    id: str
    file: str
    line: int


def dedup_order(doc: _Keyed) -> tuple[str, str, str, int]:
    """Among identical texts the copy with the smallest (source name, id) is kept; file and line
    only break ties between copies that are identical in source, id and text."""
    return (doc.source, doc.id, doc.file, doc.line)


def choose_kept(copies: Iterable[_Keyed]):
    """(kept, [duplicates]) for the copies of one text."""
    ordered = sorted(copies, key=dedup_order)
    if not ordered:
        raise ValueError("no copies")
    return ordered[0], ordered[1:]


def pack_order(digest: bytes, doc_id: str) -> tuple[bytes, str]:
    """Order of documents inside a packing unit: by text digest, then id. Documents equal in both
    are byte-identical in tokens, so the packed output does not depend on their relative order."""
    return (digest, doc_id)
