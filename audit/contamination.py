"""Check 6 — held-out contamination.

Shards hold tokens only, so documents are recovered by decoding the packing (drop PAD, cut at
EOS, as `contract` DocumentSplitter does; shardscan.py does it with numpy) and hashed as token
sequences: with one tokenizer, equal texts give equal token sequences and
`decode` inverts `encode_ordinary`, so token-sequence equality *is* text equality.

* Exact overlap (must be 0): every held-out document's digest is kept in a set (held-out is the
  small split); every training document is looked up in it while streaming. Empty documents
  (two EOS in a row, as token files may hold) carry no text to leak and are only counted.
* 13-gram overlap (a rate, reported): as the decontamination tools of language-model evaluation
  do (GPT-3 paper, lm-evaluation-harness), texts are lower-cased and split into words, and a
  held-out document counts as contaminated when any of its word 13-grams occurs in training.
  Held-out and training documents are sampled by their digest (deterministic), so memory is
  bounded by the sample sizes, not the dataset.

The shard pass (scan.py) gathers what `Found` holds; `check` turns it into the verdict.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import xxhash

from .checks import CheckResult, FailureList, result

NAME, TITLE = "contamination", "6. Held-out contamination"
NGRAM = 13
DIGEST_BYTES = 16  # 128-bit digests: collisions are negligible at 10^12 documents
DIGEST = "xxh3_128"  # the document digest (audit.json's inputs name it: a reused audit must have used the same)
_WORD = re.compile(r"\w+")


def doc_digest(doc: np.ndarray) -> bytes:
    """doc: 1-D uint32 token ids (without EOS) → its 16-byte XXH3-128 digest (the xxhash library:
    a non-cryptographic 128-bit hash, ~5x cheaper per document here than blake2b, which was the
    shard pass's largest per-record cost; the digest only has to tell documents apart, and equal
    documents always get equal digests, so a copy can never be missed)."""
    return xxhash.xxh3_128_digest(doc.astype("<u4", copy=False).tobytes())


def sampled(digest: bytes, rate: float) -> bool:
    """Deterministic Bernoulli(rate) selection keyed by the document's digest."""
    return int.from_bytes(digest[:8], "little") < rate * 2.0**64


_P = 0x100000001B3  # odd: the word hash's polynomial base, invertible modulo 2^64
_P_INV = pow(_P, -1, 2**64)
_MIX = np.uint64(0x9E3779B97F4A7C15)  # odd multiplier (2^64 / golden ratio)
_M = 0xC2B2AE3D27D4EB4F  # odd: the n-gram's polynomial base over word hashes
_M_INV = pow(_M, -1, 2**64)


_POWERS: dict[int, np.ndarray] = {}


def _powers(base: int, n: int) -> np.ndarray:
    """base^0 … base^(n-1) modulo 2^64 (cached, grown by doubling: most texts are short)."""
    have = _POWERS.get(base)
    if have is None or have.size < n:
        size = max(n, 2 * (0 if have is None else have.size), 4096)
        have = np.full(size, base, np.uint64)
        have[0] = 1
        have = _POWERS[base] = np.cumprod(have, dtype=np.uint64)
    return have[:n]


def _windows(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, base: int, base_inv: int) -> np.ndarray:
    """Σ values[j]·base^(j-start) over each [start, end), modulo 2^64: prefix sums of
    values[j]·base^j, each window's difference scaled back by base^-start."""
    with np.errstate(over="ignore"):
        prefix = np.zeros(values.size + 1, np.uint64)
        np.cumsum(values * _powers(base, values.size), out=prefix[1:])
        return (prefix[ends] - prefix[starts]) * _powers(base_inv, values.size + 1)[starts]


def word_hashes(words: list[str]) -> np.ndarray:
    """A 64-bit hash of each word, for all words at once: the polynomial hash of its UTF-8 bytes,
    then mixed. numpy, not a hash call per word: the 13-gram sample hashes millions of words."""
    buf = np.frombuffer("\0".join(words).encode(), np.uint8)  # \w+ words hold no NUL
    ends = np.append(np.flatnonzero(buf == 0), buf.size)
    starts = np.empty_like(ends)
    starts[0], starts[1:] = 0, ends[:-1] + 1
    h = _windows(buf.astype(np.uint64) + np.uint64(1), starts, ends, _P, _P_INV)
    with np.errstate(over="ignore"):
        h ^= h >> np.uint64(29)
        h *= _MIX
        h ^= h >> np.uint64(32)
    return h


def ngram_hashes(text: str, n: int = NGRAM) -> np.ndarray:
    """The word n-grams of `text` as uint64 hashes (a repeated n-gram repeats). Stable across
    processes (Python's `hash` of strings is salted per process, and Beam workers are separate
    processes): an n-gram is a polynomial combination of its words' hashes, for every window at
    once."""
    words = _WORD.findall(text.lower())
    if len(words) < n:
        return np.zeros(0, np.uint64)
    starts = np.arange(len(words) - n + 1)
    return _windows(word_hashes(words), starts, starts + n, _M, _M_INV)


def word_ngrams(text: str, n: int = NGRAM) -> set[int]:
    return set(ngram_hashes(text, n).tolist())


@dataclasses.dataclass(frozen=True)
class ContaminationConfig:
    heldout_sample_docs: int = 2000  # held-out documents whose 13-grams are indexed
    train_sample_docs: int = 20000  # training documents scanned for those 13-grams
    max_ngram_rate: float | None = None  # fail above this contaminated-document rate; None: report only

    def __post_init__(self) -> None:
        if self.max_ngram_rate is not None and not 0 <= self.max_ngram_rate <= 1:
            # NaN passes every comparison (the gate off), a negative rate fails every audit
            raise ValueError(f"max_ngram_rate must be a finite share in [0, 1] or None, got {self.max_ngram_rate!r}")
        if self.heldout_sample_docs < 0 or self.train_sample_docs < 0:
            raise ValueError("sample sizes must be >= 0")


@dataclasses.dataclass
class Found:
    """What the shard pass found, in reading order (merge.Replay fills it)."""

    heldout_documents: int  # distinct non-empty held-out documents
    train_documents: int
    exact: FailureList  # training documents equal to a held-out one
    empty: dict[str, int]  # empty documents per split: counted, never compared
    heldout_source: list[str]  # source of each sampled held-out document (k-th)
    contaminated: set[int]  # k of the sampled held-out documents sharing a 13-gram with training
    short_heldout: int  # sampled held-out documents with no 13-gram
    sampled_train: int


def check(cfg: ContaminationConfig, found: Found) -> CheckResult:
    sampled_heldout = len(found.heldout_source)
    rate = len(found.contaminated) / sampled_heldout if sampled_heldout else None
    by_source: dict[str, list[int]] = {}
    for k, src in enumerate(found.heldout_source):
        row = by_source.setdefault(src, [0, 0])
        row[0] += 1
        row[1] += k in found.contaminated
    figures = {
        "ngram_by_source": [
            {"source": s_, "heldout_sampled": a, "contaminated": b, "rate": b / a if a else None}
            for s_, (a, b) in by_source.items()
        ],
        "heldout_documents": found.heldout_documents,
        "train_documents": found.train_documents,
        "exact_overlap": found.exact.count,
        "empty_documents_not_compared": dict(found.empty),
        "ngram": NGRAM,
        "ngram_heldout_sampled": sampled_heldout,
        "ngram_heldout_too_short": found.short_heldout,
        "ngram_train_sampled": found.sampled_train,
        "ngram_contaminated_heldout": len(found.contaminated),
        "ngram_contaminated_rate": rate,
        "max_ngram_rate": cfg.max_ngram_rate,
    }
    f = found.exact
    if f:
        summary = f"{f.count} training documents are exact copies of held-out documents; first: {f.items[0]}"
        return result(NAME, TITLE, f, "", figures, fail_summary=summary)
    if cfg.max_ngram_rate is not None and rate is not None and rate > cfg.max_ngram_rate:
        f.add(
            f"{rate:.2%} of sampled held-out documents share a {NGRAM}-gram with training "
            f"(limit {cfg.max_ngram_rate:.2%})"
        )
    rate_txt = "n/a (no tokenizer)" if rate is None else f"{rate:.2%}"
    ok = (
        f"0 of {found.train_documents} training documents equal one of {found.heldout_documents} held-out "
        f"documents; {NGRAM}-gram overlap {rate_txt} of {sampled_heldout} sampled held-out "
        f"documents vs {found.sampled_train} sampled training documents"
    )
    return result(NAME, TITLE, f, ok, figures)
