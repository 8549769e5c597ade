"""Check 7 — statistics per source and split: document-length histogram, tokens per byte,
padding fraction, EOS count vs document count, most frequent tokens decoded.

The accumulator is fed by the streaming scan; memory is O(vocabulary) per source/split.
It fails when the shards disagree with the manifest's counts (EOS per document, tokens,
padding): such a mismatch means the manifest does not describe the bytes the loader reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from contract import REMAINDER_KEY, SPLITS, Manifest

from .checks import CheckResult, FailureList, result

NAME, TITLE = "statistics", "7. Statistics"
LENGTH_BINS = 24  # log2 bins of document length in tokens: [2^k, 2^(k+1)), the last is open
TOP_TOKENS = 20
FLUSH_EVERY = 8192  # document lengths buffered before folding into the histogram


@dataclasses.dataclass
class SplitStats:
    vocab_size: int
    records: int = 0
    tokens: int = 0  # all token slots, PAD included
    pad: int = 0
    eos: int = 0
    documents: int = 0
    doc_tokens: int = 0  # document tokens, EOS excluded
    sampled_tokens: int = 0
    sampled_bytes: int = 0
    sampled_docs: int = 0
    length_hist: np.ndarray = None  # type: ignore[assignment]
    token_counts: np.ndarray = None  # type: ignore[assignment]
    padded: dict[int, int] = dataclasses.field(default_factory=dict)  # record ordinal → PAD tokens
    _lengths: list[int] = dataclasses.field(default_factory=list)

    def __post_init__(self) -> None:
        self.length_hist = np.zeros(LENGTH_BINS, np.int64)
        self.token_counts = np.zeros(self.vocab_size, np.int64)

    def add_records(self, records: np.ndarray, eos_id: int, pad_id: int) -> np.ndarray:
        """records: `[n, seq_len]` uint32 (already validated < vocab_size). Returns the PAD tokens
        of each record."""
        counts = np.bincount(records.ravel(), minlength=self.vocab_size)
        if counts[pad_id]:
            pads = np.count_nonzero(records == pad_id, axis=1)
        else:  # PAD ends a packing unit, so most chunks have none: their total says so, no pass per record
            pads = np.zeros(records.shape[0], np.int64)
        for i in np.flatnonzero(pads).tolist():  # only the last record of a packing unit
            self.padded[self.records + i] = int(pads[i])
        self.records += records.shape[0]
        self.tokens += records.size
        self.pad += int(counts[pad_id])
        self.eos += int(counts[eos_id])
        self.token_counts += counts
        return pads

    def non_pad_tokens(self, records: np.ndarray, seq_len: int) -> int:
        """Exact non-PAD tokens of the given record ordinals (int64 [k])."""
        return int(records.size) * seq_len - sum(self.padded.get(r, 0) for r in records.tolist())

    def add_document(self, n_tokens: int) -> None:
        self.documents += 1
        self.doc_tokens += n_tokens
        self._lengths.append(n_tokens)
        if len(self._lengths) >= FLUSH_EVERY:
            self.flush()

    def flush(self) -> None:
        if self._lengths:
            lengths = np.maximum(np.asarray(self._lengths, np.int64), 1)
            bins = np.minimum(np.floor(np.log2(lengths)).astype(np.int64), LENGTH_BINS - 1)
            self.length_hist += np.bincount(bins, minlength=LENGTH_BINS)
            self._lengths.clear()


def check_statistics(
    manifest: Manifest, stats: dict[tuple[str, str], SplitStats], decode: Callable[[int], bytes] | None
) -> CheckResult:
    f = FailureList()
    rows = []
    for name in manifest.source_names:
        entry = manifest.source(name)
        counts, tokens = entry["counts"], entry.get("tokens", {})
        pad_total = 0
        for split in SPLITS:
            s = stats.get((name, split))
            if s is None:
                continue
            s.flush()
            pad_total += s.pad
            where = f"source {name}/{split}"
            # token-file sources: documents with ids in the dropped remainder have their EOS there
            cut = int(entry.get(REMAINDER_KEY, {}).get("documents", 0)) if int(counts[split]) else 0
            if s.eos != int(counts[split]) - cut:
                f.add(
                    f"{where}: shards hold {s.eos} EOS tokens but the manifest counts {counts[split]} "
                    f"documents{f' ({cut} of them cut by the remainder)' if cut else ''}"
                )
            real = s.tokens - s.pad
            if split in tokens and int(tokens[split]) != real:
                f.add(f"{where}: shards hold {real} non-PAD tokens but the manifest says {tokens[split]}")
            masked = s.token_counts.copy()
            masked[[manifest.eos_id, manifest.pad_id]] = 0
            top = np.argsort(-masked, kind="stable")[:TOP_TOKENS]
            rows.append(
                {
                    "source": name,
                    "split": split,
                    "records": s.records,
                    "documents": s.documents,
                    "eos": s.eos,
                    "manifest_documents": int(counts[split]),
                    "tokens": s.tokens,
                    "padding": s.pad,
                    "padding_fraction": s.pad / s.tokens if s.tokens else 0.0,
                    "mean_document_tokens": s.doc_tokens / s.documents if s.documents else 0.0,
                    "tokens_per_byte": s.sampled_tokens / s.sampled_bytes if s.sampled_bytes else None,
                    "tokens_per_byte_sample_docs": s.sampled_docs,
                    "length_hist_log2": s.length_hist.tolist(),
                    "top_tokens": [
                        {
                            "id": int(t),
                            "count": int(masked[t]),
                            "text": repr(decode(int(t)).decode("utf-8", "replace")) if decode else None,
                        }
                        for t in top
                        if masked[t] > 0
                    ],
                }
            )
        if "padding" in tokens and int(tokens["padding"]) != pad_total:
            f.add(f"source {name}: shards hold {pad_total} PAD tokens but the manifest says {tokens['padding']}")
    ok = "EOS count equals the document count and token/padding totals match the manifest for every split"
    return result(NAME, TITLE, f, ok, {"splits": rows})
