"""One pass over every shard of every audited manifest, feeding checks 1, 6 and 7.

The pass is a Beam pipeline (engine.py), one shard per element; its results are replayed in the
reading order of one streaming process (merge.py): held-out shards (of every manifest) before
training shards (of every manifest), since contamination needs every held-out digest first, so a
held-out document in one manifest is checked against the training documents of all of them (the
AI2 layout keeps its validation sets in a manifest of their own). Integrity and statistics are
checked per manifest and combined (`checks.combine`). A worker's memory: one record chunk, one
partial document, the shard's token counts, the held-out digest set and the n-gram sample —
never the training data.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import numpy as np

from contract import HELDOUT, SPLITS, TOKENS, TRAIN, Manifest, PackingProblems, source_format
from pipelines import dolma2_tokenizer as tk
from pipelines.leakage import Detector

from . import contamination, engine, eval_leakage, integrity, statistics
from .checks import CheckResult, combine, mark_not_run
from .merge import SPLIT_ORDER, Replay
from .shardscan import ShardTask
from .statistics import SplitStats  # by name: the field `statistics` below hides the module in the class

TOKENS_PER_BYTE_SAMPLE_DOCS = 2000  # per split: documents decoded to measure tokens per byte


@dataclasses.dataclass
class ScanResults:
    integrity: CheckResult
    contamination: CheckResult
    statistics: CheckResult
    stats: list[dict[tuple[str, str], SplitStats]]  # per manifest, in audited order
    task_contamination: CheckResult | None = None  # check 8 (None: no eval tasks given)


def load_decoder(manifest: Manifest) -> tuple[Callable[[np.ndarray], bytes] | None, str | None]:
    """The manifest's tokenizer as a `tokens → bytes` function, or (None, why) if unavailable."""
    tok = manifest.tokenizer
    try:
        enc, ranks = tk.get_tokenizer(tok.name), tk.vocabulary(tok.name).ranks_sha256
    except Exception as e:  # noqa: BLE001 - the parts that need text are listed as not run, with this reason
        return None, f"tokenizer {tok.name!r} unavailable: {e}"
    if (enc.n_vocab, ranks) != (tok.vocab_size, tok.ranks_sha256):
        return None, (
            f"this audit's tokenizer {tok.name!r} (vocab {enc.n_vocab}, ranks {ranks[:12]}…) "
            f"is not the manifest's (vocab {tok.vocab_size}, ranks {str(tok.ranks_sha256)[:12]}…)"
        )
    return (lambda toks: enc.decode_bytes(toks.tolist())), None


def tasks_of(
    manifests: Sequence[Manifest], tokenizer: str | None, cfg: contamination.ContaminationConfig
) -> list[ShardTask]:
    """One task per listed shard, with its place in the reading order and its sampling rates
    (held-out and training documents are sampled at the rates that give the configured counts)."""
    counts = {s: sum(int(m.source(n)["counts"][s]) for m in manifests for n in m.source_names) for s in SPLITS}
    heldout_rate = min(1.0, cfg.heldout_sample_docs / max(1, counts[HELDOUT]))
    train_rate = min(1.0, cfg.train_sample_docs / max(1, counts[TRAIN]))
    tasks = []
    for mi, m in enumerate(manifests):
        for si, name in enumerate(m.source_names):
            for split in (HELDOUT, TRAIN):
                tpb_rate = min(1.0, TOKENS_PER_BYTE_SAMPLE_DOCS / max(1, int(m.source(name)["counts"][split])))
                for k, ref in enumerate(m.shards(split, name)):
                    tasks.append(
                        ShardTask(
                            (SPLIT_ORDER[split], mi, si, k),
                            mi,
                            name,
                            split,
                            ref.path,
                            ref.abspath,
                            m.seq_len,
                            m.vocab_size,
                            m.eos_id,
                            m.pad_id,
                            tokenizer,
                            heldout_rate,
                            train_rate,
                            tpb_rate,
                            ref.records,
                            ref.sha256,
                        )
                    )
    return tasks


def scan(
    manifests: Manifest | Sequence[Manifest],
    cfg: contamination.ContaminationConfig,
    labels: Sequence[str] | None = None,
    beam_args: Sequence[str] = (),
    leak: tuple[Any, Any] | None = None,
) -> ScanResults:
    """manifests: one, or the run's list in `data` order; labels: how messages name each (its
    path as given; unused for a single manifest, whose messages stay as they were); beam_args:
    Beam options of the pass (default: DirectRunner, one worker; engine.run); leak: (the
    eval_leakage.EvalLeakageConfig, its LeakIndex) to score every training document against."""
    manifests = [manifests] if isinstance(manifests, Manifest) else list(manifests)
    several = len(manifests) > 1
    labels = list(labels) if labels is not None else [m.path for m in manifests]
    first = manifests[0]
    decode_bytes, no_decoder = load_decoder(first)
    if several and any(m.tokenizer != first.tokenizer for m in manifests[1:]):
        decode_bytes, no_decoder = None, "the manifests disagree on the tokenizer"
    tokenizer = None if decode_bytes is None else first.tokenizer.name
    tasks = tasks_of(manifests, tokenizer, cfg)
    names = [label if several else "" for label in labels]
    token_sources = [{x["name"] for x in m.mixture_sources() if source_format(x) == TOKENS} for m in manifests]
    work = (leak[1], leak[0].detector) if leak is not None else None
    (held, held_counts), (train, train_counts) = engine.run(tasks, names, token_sources, tokenizer, beam_args, work)
    unreadable = sorted((s.order, s.io_error) for s in held + train if s.io_error)
    if unreadable:  # as reading it in one process would: the first in reading order, exit 2
        raise OSError(unreadable[0][1])
    detector = None
    if work is not None:
        detector = Detector.shared(*work)
    replay = Replay(tasks, names, token_sources, decode_bytes, detector)
    index = replay.heldout({s.order: s for s in held}, held_counts)
    replay.train({s.order: s for s in train}, index, train_counts)
    contaminated = contamination.check(
        cfg,
        contamination.Found(
            index.documents,
            replay.train_docs,
            replay.exact,
            replay.empty,
            replay.heldout_source,
            replay.contaminated,
            replay.short,
            replay.sampled_train,
        ),
    )
    token_decode = (lambda t: decode_bytes(np.asarray([t], np.uint32))) if decode_bytes else None
    listed = {os.path.normpath(s.abspath) for m in manifests for sp in SPLITS for s in m.shards(sp)}
    per = [_of(replay, mi) for mi in range(len(manifests))]
    integ = combine(
        [
            integrity.check_integrity(m, reports, packing, integrity.unlisted_shards(m, listed), cut)
            for m, (stats, packing, reports, cut) in zip(manifests, per)
        ],
        labels,
        sums=("records_checked",),
    )
    stats_result = combine(
        [statistics.check_statistics(m, stats, token_decode) for m, (stats, *_) in zip(manifests, per)], labels
    )
    if no_decoder:  # the parts that need text: listed as not run, never silently dropped
        mark_not_run(contaminated, "ngram_overlap", no_decoder)
        mark_not_run(stats_result, "tokens_per_byte", no_decoder)
    leaked = None
    if detector is not None and leak is not None:
        recorded = [m.raw.get("mixture", {}).get("decontaminate") for m in manifests]
        leaked = eval_leakage.check(leak[0], detector, replay.leaks, recorded)
    return ScanResults(
        integrity=integ,
        contamination=contaminated,
        statistics=stats_result,
        stats=[stats for stats, *_ in per],
        task_contamination=leaked,
    )


V = TypeVar("V")


def _of(
    replay: Replay, mi: int
) -> tuple[
    dict[tuple[str, str], SplitStats],
    dict[tuple[str, str], PackingProblems],
    list[integrity.ShardReport],
    dict[tuple[str, str], int],
]:
    """Manifest mi's (stats, packing, shard reports, remainder cuts), keyed (source, split)."""

    def mine(d: dict[tuple[int, str, str], V]) -> dict[tuple[str, str], V]:
        return {(name, split): v for (m, name, split), v in d.items() if m == mi}

    return mine(replay.stats), mine(replay.packing), replay.reports.get(mi, []), mine(replay.remainder_cut)
