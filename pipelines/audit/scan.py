"""One streaming pass over every shard of a manifest, feeding checks 1, 6 and 7.

Held-out shards are read before training shards (contamination needs the held-out digests
first). Memory: one record chunk, one partial document, per-split token counts, the held-out
digest set and the n-gram sample — never the training data.
"""
from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import numpy as np

from pipelines.contract import HELDOUT, SPLITS, TOKENS, TRAIN, DocumentSplitter, Manifest, PackingProblems, parse_records, source_format

from . import contamination, integrity, statistics
from .checks import CheckResult, mark_not_run
from .manifest import file_sha256, iter_record_chunks

TOKENS_PER_BYTE_SAMPLE_DOCS = 2000  # per split: documents decoded to measure tokens per byte


@dataclasses.dataclass
class ScanResults:
    integrity: CheckResult
    contamination: CheckResult
    statistics: CheckResult
    stats: dict[tuple[str, str], statistics.SplitStats]


def load_decoder(manifest: Manifest) -> tuple[Callable[[np.ndarray], bytes] | None, str | None]:
    """The manifest's tokenizer as a `tokens → bytes` function, or (None, why) if unavailable."""
    tok = manifest.tokenizer
    try:
        from pipelines import tokenizer as tk

        enc = tk.get_tokenizer(tok.name)
    except Exception as e:  # noqa: BLE001 - the parts that need text are listed as not run, with this reason
        return None, f"tokenizer {tok.name!r} unavailable: {e}"
    if (enc.n_vocab, tk.CL100K_RANKS_SHA256) != (tok.vocab_size, tok.ranks_sha256):
        return None, (f"this audit's tokenizer {tok.name!r} (vocab {enc.n_vocab}, ranks {tk.CL100K_RANKS_SHA256[:12]}…) "
                      f"is not the manifest's (vocab {tok.vocab_size}, ranks {str(tok.ranks_sha256)[:12]}…)")
    return (lambda toks: enc.decode_bytes(toks.tolist())), None


def scan(manifest: Manifest, cfg: contamination.ContaminationConfig) -> ScanResults:
    decode_bytes, no_decoder = load_decoder(manifest)
    decode_text = (lambda toks: decode_bytes(toks).decode("utf-8", "replace")) if decode_bytes else None
    counts = {s: sum(int(manifest.source(n)["counts"][s]) for n in manifest.source_names)
              for s in SPLITS}
    scanner = contamination.ContaminationScanner(cfg, counts[HELDOUT], counts[TRAIN], decode_text)
    stats: dict[tuple[str, str], statistics.SplitStats] = {}
    packing: dict[tuple[str, str], PackingProblems] = {}
    reports: list[integrity.ShardReport] = []
    # Token-file sources: each shard is one file's whole instances, its own token stream; a shard
    # that ends inside a document (the rest of it is in the dropped remainder) is not a packing
    # error but is counted, and integrity compares the count with the manifest's remainder.
    token_sources = {m["name"] for m in manifest.mixture_sources() if source_format(m) == TOKENS}
    remainder_cut: dict[tuple[str, str], int] = {}
    for split in (HELDOUT, TRAIN):  # held-out first: the scanner checks training documents against it
        for name in manifest.source_names:
            shards = manifest.shards(split, name)
            if not shards:
                continue
            st = stats[(name, split)] = statistics.SplitStats(manifest.vocab_size)
            tpb_rate = min(1.0, TOKENS_PER_BYTE_SAMPLE_DOCS / max(1, int(manifest.source(name)["counts"][split])))
            splitter = DocumentSplitter(manifest.eos_id, manifest.pad_id)
            packing[(name, split)] = splitter.problems
            ordinal = 0
            for ref in shards:
                rep = integrity.ShardReport(name, split, ref.path, ref.records, ref.sha256)
                reports.append(rep)
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
                            where = f"document {ordinal} of {name}/{split} (ends in {ref.path})"
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
                    remainder_cut[(name, split)] = remainder_cut.get((name, split), 0) + 1
            splitter.finish()
    token_decode = (lambda t: decode_bytes(np.asarray([t], np.uint32))) if decode_bytes else None
    contaminated = scanner.check()
    stats_result = statistics.check_statistics(manifest, stats, token_decode)
    if no_decoder:  # the parts that need text: listed as not run, never silently dropped
        mark_not_run(contaminated, "ngram_overlap", no_decoder)
        mark_not_run(stats_result, "tokens_per_byte", no_decoder)
    return ScanResults(
        integrity=integrity.check_integrity(manifest, reports, packing, integrity.unlisted_shards(manifest),
                                            remainder_cut),
        contamination=contaminated,
        statistics=stats_result,
        stats=stats,
    )
