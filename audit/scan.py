"""One streaming pass over every shard of every audited manifest, feeding checks 1, 6 and 7.

Held-out shards (of every manifest) are read before training shards (of every manifest):
contamination needs every held-out digest first, so a held-out document in one manifest is
checked against the training documents of all of them (the AI2 layout keeps its validation sets
in a manifest of their own). Integrity and statistics are checked per manifest and combined
(`checks.combine`). Memory: one record chunk, one partial document, per-split token counts, the
held-out digest set and the n-gram sample — never the training data.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence

import numpy as np

from contract import HELDOUT, SPLITS, TOKENS, TRAIN, DocumentSplitter, Manifest, PackingProblems, parse_records, source_format

from . import contamination, integrity, statistics
from .checks import CheckResult, combine, mark_not_run
from .manifest import file_sha256, iter_record_chunks

TOKENS_PER_BYTE_SAMPLE_DOCS = 2000  # per split: documents decoded to measure tokens per byte


@dataclasses.dataclass
class ScanResults:
    integrity: CheckResult
    contamination: CheckResult
    statistics: CheckResult
    stats: list[dict[tuple[str, str], statistics.SplitStats]]  # per manifest, in audited order


def load_decoder(manifest: Manifest) -> tuple[Callable[[np.ndarray], bytes] | None, str | None]:
    """The manifest's tokenizer as a `tokens → bytes` function, or (None, why) if unavailable."""
    tok = manifest.tokenizer
    try:
        from pipelines import tokenizer as tk

        enc, ranks = tk.get_tokenizer(tok.name), tk.vocabulary(tok.name).ranks_sha256
    except Exception as e:  # noqa: BLE001 - the parts that need text are listed as not run, with this reason
        return None, f"tokenizer {tok.name!r} unavailable: {e}"
    if (enc.n_vocab, ranks) != (tok.vocab_size, tok.ranks_sha256):
        return None, (f"this audit's tokenizer {tok.name!r} (vocab {enc.n_vocab}, ranks {ranks[:12]}…) "
                      f"is not the manifest's (vocab {tok.vocab_size}, ranks {str(tok.ranks_sha256)[:12]}…)")
    return (lambda toks: enc.decode_bytes(toks.tolist())), None


@dataclasses.dataclass
class _ManifestScan:
    """What the pass gathers for one manifest (integrity and statistics inputs)."""

    manifest: Manifest
    label: str  # names the manifest in messages when several are audited ("" for one)
    stats: dict[tuple[str, str], statistics.SplitStats] = dataclasses.field(default_factory=dict)
    packing: dict[tuple[str, str], PackingProblems] = dataclasses.field(default_factory=dict)
    reports: list[integrity.ShardReport] = dataclasses.field(default_factory=list)
    remainder_cut: dict[tuple[str, str], int] = dataclasses.field(default_factory=dict)


def scan(manifests: Manifest | Sequence[Manifest], cfg: contamination.ContaminationConfig,
         labels: Sequence[str] | None = None) -> ScanResults:
    """manifests: one, or the run's list in `data` order; labels: how messages name each (its
    path as given; unused for a single manifest, whose messages stay as they were)."""
    manifests = [manifests] if isinstance(manifests, Manifest) else list(manifests)
    several = len(manifests) > 1
    labels = list(labels) if labels is not None else [m.path for m in manifests]
    first = manifests[0]
    decode_bytes, no_decoder = load_decoder(first)
    if several and any(m.tokenizer != first.tokenizer for m in manifests[1:]):
        decode_bytes, no_decoder = None, "the manifests disagree on the tokenizer"
    decode_text = (lambda toks: decode_bytes(toks).decode("utf-8", "replace")) if decode_bytes else None
    counts = {s: sum(int(m.source(n)["counts"][s]) for m in manifests for n in m.source_names) for s in SPLITS}
    scanner = contamination.ContaminationScanner(cfg, counts[HELDOUT], counts[TRAIN], decode_text)
    scans = [_ManifestScan(m, label if several else "") for m, label in zip(manifests, labels)]
    for split in (HELDOUT, TRAIN):  # held-out first: the scanner checks training documents against it
        for ms in scans:
            _scan_split(ms, split, scanner, decode_bytes)
    token_decode = (lambda t: decode_bytes(np.asarray([t], np.uint32))) if decode_bytes else None
    contaminated = scanner.check()
    listed = {os.path.normpath(s.abspath) for m in manifests for sp in SPLITS for s in m.shards(sp)}
    integ = combine([integrity.check_integrity(ms.manifest, ms.reports, ms.packing,
                                               integrity.unlisted_shards(ms.manifest, listed), ms.remainder_cut)
                     for ms in scans], labels, sums=("records_checked",))
    stats_result = combine([statistics.check_statistics(ms.manifest, ms.stats, token_decode) for ms in scans], labels)
    if no_decoder:  # the parts that need text: listed as not run, never silently dropped
        mark_not_run(contaminated, "ngram_overlap", no_decoder)
        mark_not_run(stats_result, "tokens_per_byte", no_decoder)
    return ScanResults(integrity=integ, contamination=contaminated, statistics=stats_result,
                       stats=[ms.stats for ms in scans])


def _scan_split(ms: _ManifestScan, split: str, scanner: contamination.ContaminationScanner,
                decode_bytes: Callable[[np.ndarray], bytes] | None) -> None:
    """Streams one split of every source of one manifest into the scanner and the accumulators."""
    manifest = ms.manifest
    of = f" of {ms.label}" if ms.label else ""
    # Token-file sources: each shard is one file's whole instances, its own token stream; a shard
    # that ends inside a document (the rest of it is in the dropped remainder) is not a packing
    # error but is counted, and integrity compares the count with the manifest's remainder.
    token_sources = {m["name"] for m in manifest.mixture_sources() if source_format(m) == TOKENS}
    for name in manifest.source_names:
        shards = manifest.shards(split, name)
        if not shards:
            continue
        st = ms.stats[(name, split)] = statistics.SplitStats(manifest.vocab_size)
        tpb_rate = min(1.0, TOKENS_PER_BYTE_SAMPLE_DOCS / max(1, int(manifest.source(name)["counts"][split])))
        splitter = DocumentSplitter(manifest.eos_id, manifest.pad_id)
        ms.packing[(name, split)] = splitter.problems
        ordinal = 0
        for ref in shards:
            rep = integrity.ShardReport(name, split, ref.path, ref.records, ref.sha256)
            ms.reports.append(rep)
            if not os.path.exists(ref.abspath):
                rep.exists = False
                continue
            rep.sha256 = file_sha256(ref.abspath)
            n = 0
            try:
                for raw in iter_record_chunks(ref.abspath):
                    arr, problems = parse_records(raw, manifest.seq_len, manifest.vocab_size)
                    for i, reason in problems.bad:
                        rep.bad_record_count += 1
                        if len(rep.bad_records) < 5:
                            rep.bad_records.append((n + i, reason))
                    n += len(raw)
                    st.add_records(arr, manifest.eos_id, manifest.pad_id)
                    for doc in splitter.feed(arr):
                        st.add_document(int(doc.size))
                        where = f"document {ordinal} of {name}/{split} (ends in {ref.path}{of})"
                        ordinal += 1
                        digest = contamination.doc_digest(doc)
                        if split == HELDOUT:
                            scanner.add_heldout(doc, digest, where, name)
                        else:
                            scanner.add_train(doc, digest, where)
                        if decode_bytes is not None and contamination.sampled(digest, tpb_rate):
                            st.sampled_docs += 1
                            st.sampled_tokens += int(doc.size)
                            st.sampled_bytes += len(decode_bytes(doc))
                rep.records = n
            except Exception as e:  # noqa: BLE001 - a corrupt shard is a finding, not a crash
                rep.read_error = f"{type(e).__name__}: {e}"
            if name in token_sources and splitter.carry.size:  # ends inside a document
                splitter.carry = splitter.carry[:0]
                ms.remainder_cut[(name, split)] = ms.remainder_cut.get((name, split), 0) + 1
        splitter.finish()
