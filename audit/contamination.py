"""Check 6 — held-out contamination.

Shards hold tokens only, so documents are recovered by decoding the packing (`contract` DocumentSplitter) and
hashed as token sequences: with one tokenizer, equal texts give equal token sequences and
`decode` inverts `encode_ordinary`, so token-sequence equality *is* text equality.

* Exact overlap (must be 0): every held-out document's digest is kept in a set (held-out is the
  small split); every training document is looked up in it while streaming. Empty documents
  (two EOS in a row, as token files may hold) carry no text to leak and are only counted.
* 13-gram overlap (a rate, reported): as the decontamination tools of language-model evaluation
  do (GPT-3 paper, lm-evaluation-harness), texts are lower-cased and split into words, and a
  held-out document counts as contaminated when any of its word 13-grams occurs in training.
  Held-out and training documents are sampled by their digest (deterministic), so memory is
  bounded by the sample sizes, not the dataset.
"""
from __future__ import annotations

import dataclasses
import hashlib
import re
from collections.abc import Callable

import numpy as np

from .checks import CheckResult, FailureList, result

NAME, TITLE = "contamination", "6. Held-out contamination"
NGRAM = 13
DIGEST_BYTES = 16  # 128-bit digests: collisions are negligible at 10^12 documents
_WORD = re.compile(r"\w+")


def doc_digest(doc: np.ndarray) -> bytes:
    """doc: 1-D uint32 token ids (without EOS) → 16-byte blake2b digest."""
    return hashlib.blake2b(doc.astype("<u4", copy=False).tobytes(), digest_size=DIGEST_BYTES).digest()


def sampled(digest: bytes, rate: float) -> bool:
    """Deterministic Bernoulli(rate) selection keyed by the document's digest."""
    return int.from_bytes(digest[:8], "little") < rate * 2.0**64


def word_ngrams(text: str, n: int = NGRAM) -> set[int]:
    words = _WORD.findall(text.lower())
    return {hash(tuple(words[i:i + n])) for i in range(len(words) - n + 1)}


@dataclasses.dataclass(frozen=True)
class ContaminationConfig:
    heldout_sample_docs: int = 2000  # held-out documents whose 13-grams are indexed
    train_sample_docs: int = 20000  # training documents scanned for those 13-grams
    max_ngram_rate: float | None = None  # fail above this contaminated-document rate; None: report only

    def __post_init__(self):
        if self.max_ngram_rate is not None and not 0 <= self.max_ngram_rate <= 1:
            # NaN passes every comparison (the gate off), a negative rate fails every audit
            raise ValueError(f"max_ngram_rate must be a finite share in [0, 1] or None, got {self.max_ngram_rate!r}")
        if self.heldout_sample_docs < 0 or self.train_sample_docs < 0:
            raise ValueError("sample sizes must be >= 0")


class ContaminationScanner:
    """Feed every held-out document first (`add_heldout`), then every training one (`add_train`)."""

    def __init__(self, cfg: ContaminationConfig, heldout_total: int, train_total: int,
                 decode: Callable[[np.ndarray], str] | None):
        self.cfg = cfg
        self.decode = decode
        self.heldout_rate = min(1.0, cfg.heldout_sample_docs / max(1, heldout_total))
        self.train_rate = min(1.0, cfg.train_sample_docs / max(1, train_total))
        self.heldout: dict[bytes, str] = {}
        self.ngram_owner: dict[int, list[int]] = {}
        self.sampled_heldout = 0
        self.heldout_source: list[str] = []  # source of each sampled held-out document
        self.short_heldout = 0
        self.contaminated: set[int] = set()
        self.sampled_train = 0
        self.train_docs = 0
        self.exact = FailureList()
        self.empty = {"heldout": 0, "train": 0}  # empty documents: counted, never compared

    def add_heldout(self, doc: np.ndarray, d: bytes, where: str, source: str = "") -> None:
        """doc: 1-D uint32 tokens without EOS; d: its `doc_digest`."""
        if not doc.size:
            self.empty["heldout"] += 1
            return
        self.heldout.setdefault(d, where)
        if self.decode is not None and sampled(d, self.heldout_rate):
            grams = word_ngrams(self.decode(doc))
            if not grams:
                self.short_heldout += 1
                return
            k = self.sampled_heldout
            self.sampled_heldout += 1
            self.heldout_source.append(source)
            for g in grams:
                self.ngram_owner.setdefault(g, []).append(k)

    def add_train(self, doc: np.ndarray, d: bytes, where: str) -> None:
        self.train_docs += 1
        if not doc.size:
            self.empty["train"] += 1
            return
        hit = self.heldout.get(d)
        if hit is not None:
            self.exact.add(f"training {where} is an exact copy of held-out {hit}")
        if self.decode is not None and self.ngram_owner and sampled(d, self.train_rate):
            self.sampled_train += 1
            for g in word_ngrams(self.decode(doc)):
                owners = self.ngram_owner.get(g)
                if owners:
                    self.contaminated.update(owners)

    def check(self) -> CheckResult:
        rate = len(self.contaminated) / self.sampled_heldout if self.sampled_heldout else None
        by_source: dict[str, list[int]] = {}
        for k, src in enumerate(self.heldout_source):
            row = by_source.setdefault(src, [0, 0])
            row[0] += 1
            row[1] += k in self.contaminated
        figures = {
            "ngram_by_source": [{"source": s_, "heldout_sampled": a, "contaminated": b,
                                 "rate": b / a if a else None} for s_, (a, b) in by_source.items()],
            "heldout_documents": len(self.heldout), "train_documents": self.train_docs,
            "exact_overlap": self.exact.count, "empty_documents_not_compared": dict(self.empty),
            "ngram": NGRAM, "ngram_heldout_sampled": self.sampled_heldout,
            "ngram_heldout_too_short": self.short_heldout,
            "ngram_train_sampled": self.sampled_train,
            "ngram_contaminated_heldout": len(self.contaminated),
            "ngram_contaminated_rate": rate, "max_ngram_rate": self.cfg.max_ngram_rate,
        }
        f = self.exact
        if self.exact:
            summary = (f"{self.exact.count} training documents are exact copies of held-out documents; "
                       f"first: {self.exact.items[0]}")
            return result(NAME, TITLE, f, "", figures, fail_summary=summary)
        if self.cfg.max_ngram_rate is not None and rate is not None and rate > self.cfg.max_ngram_rate:
            f.add(f"{rate:.2%} of sampled held-out documents share a {NGRAM}-gram with training "
                  f"(limit {self.cfg.max_ngram_rate:.2%})")
        rate_txt = "n/a (no tokenizer)" if rate is None else f"{rate:.2%}"
        ok = (f"0 of {self.train_docs} training documents equal one of {len(self.heldout)} held-out "
              f"documents; {NGRAM}-gram overlap {rate_txt} of {self.sampled_heldout} sampled held-out "
              f"documents vs {self.sampled_train} sampled training documents")
        return result(NAME, TITLE, f, ok, figures)
