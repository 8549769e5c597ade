"""Replays the shards' `ShardScan`s in reading order, giving exactly what one process streaming
every shard gives (scan.py's order: held-out shards of every manifest, then training shards;
within a split, each manifest's sources in order, each source's shards in order).

What only the order can decide is decided here: the documents that cross a shard boundary
(completed from the previous shards' carry and processed like any other), document and record
ordinals (offsets of the earlier shards), the first place a held-out digest occurs, the first
25 exact copies, and which sampled held-out document is the k-th.
"""

from __future__ import annotations

import numpy as np

from contract import HELDOUT, TOKEN_DTYPE, TRAIN, PackingProblems

from . import eval_leakage, integrity, statistics
from .checks import FailureList
from .shardscan import Decoder, DocWork, HeldoutIndex, ShardScan, ShardTask

SPLIT_ORDER = {HELDOUT: 0, TRAIN: 1}


class Replay:
    """tasks: every shard's task (any order); labels: how messages name each manifest ("" for
    one); token_sources: per manifest, the sources whose shards are token files (a shard that
    ends inside a document is cut there, not carried on)."""

    def __init__(
        self,
        tasks: list[ShardTask],
        labels: list[str],
        token_sources: list[set[str]],
        decode_bytes: Decoder | None,
        leak: eval_leakage.Detector | None = None,
    ) -> None:
        self.tasks = sorted(tasks, key=lambda t: t.order)
        self.labels, self.token_sources, self.decode_bytes = labels, token_sources, decode_bytes
        self.leak = leak  # the eval-leakage Detector (documents that cross shards are scored here)
        self.leaks = eval_leakage.Found()
        self.index: HeldoutIndex | None = None  # set by `train`
        self.stats: dict[tuple[int, str, str], statistics.SplitStats] = {}
        self.packing: dict[tuple[int, str, str], PackingProblems] = {}
        self.reports: dict[int, list[integrity.ShardReport]] = {}
        self.remainder_cut: dict[tuple[int, str, str], int] = {}
        # every non-empty held-out document in reading order: digest, ordinal, place (→ places)
        self.digests: list[bytes] = []
        self.ordinals: list[np.ndarray] = []
        self.place: list[np.ndarray] = []
        self.places: list[str] = []
        self.grams: list[np.ndarray] = []  # 13-gram hashes of the k-th sampled held-out document
        self.heldout_source: list[str] = []  # and its source
        self.short = 0
        self.empty = {"heldout": 0, "train": 0}
        self.train_docs = 0
        self.exact = FailureList()
        self.sampled_train = 0
        self.contaminated: set[int] = set()  # k of the sampled held-out documents found in training

    def heldout(self, scans: dict[tuple, ShardScan], token_counts: dict | None = None) -> HeldoutIndex:
        self._split(HELDOUT, scans, token_counts or {}, None)
        ordinals = np.concatenate(self.ordinals) if self.ordinals else np.zeros(0, np.int64)
        digests = np.frombuffer(b"".join(self.digests), "S16") if self.ordinals else np.zeros(0, "S16")
        place = np.concatenate(self.place) if self.place else np.zeros(0, np.int64)
        return HeldoutIndex.build(digests, ordinals.astype(np.int64), place, self.places, self.grams)

    def train(self, scans: dict[tuple, ShardScan], index: HeldoutIndex, token_counts: dict | None = None) -> None:
        self.index = index  # names the held-out document of each exact copy (the scans hold its position)
        self._split(TRAIN, scans, token_counts or {}, index)

    def _split(self, split: str, scans: dict[tuple, ShardScan], token_counts: dict, index: HeldoutIndex | None) -> None:
        streams: dict[tuple[int, str], list[ShardTask]] = {}
        for t in self.tasks:
            if t.split == split:
                streams.setdefault((t.manifest, t.source), []).append(t)
        for (mi, name), tasks in streams.items():  # tasks are sorted: manifests, sources, shards in order
            key = (mi, name, split)
            st = self.stats[key] = statistics.SplitStats(tasks[0].vocab_size)
            if key in token_counts:
                st.token_counts += token_counts[key]
            packing = self.packing[key] = PackingProblems()
            carry = np.zeros(0, TOKEN_DTYPE)
            ordinal = 0
            label = self.labels[mi]
            of = f" of {label}" if label else ""
            for t in tasks:
                sc = scans[t.order]
                rep = integrity.ShardReport(name, split, t.path, t.expected_records, t.expected_sha256)
                self.reports.setdefault(mi, []).append(rep)
                if not sc.exists:
                    rep.exists = False
                    continue
                rep.sha256, rep.read_error = sc.sha256, sc.read_error
                rep.records = None if sc.read_error else sc.records
                rep.bad_records, rep.bad_record_count = list(sc.bad_records), sc.bad_record_count
                assert sc.stats is not None  # an existing shard's scan has its statistics
                self._add_stats(st, sc.stats, token_counts_merged=key in token_counts)
                for f in ("misplaced_pad", "cut_without_eos", "all_pad_records"):
                    setattr(packing, f, getattr(packing, f) + getattr(sc.packing, f))
                where = f"{name}/{split} (ends in {t.path}{of})"
                if sc.has_eos:
                    doc = np.concatenate([carry, sc.head]) if carry.size else sc.head
                    first = ShardScan(t.order)
                    data = doc.astype(TOKEN_DTYPE, copy=False).tobytes()
                    work = DocWork(t, self.decode_bytes, index, self.leak if split == TRAIN else None)
                    work.run(first, st, data, np.array([0]), np.array([doc.size]), 0)
                    self._docs(split, name, t, first, ordinal, where, 1)
                    self._docs(split, name, t, sc, ordinal, where, sc.inner_docs)
                    ordinal += 1 + sc.inner_docs
                    carry = sc.tail
                elif sc.head.size:
                    carry = np.concatenate([carry, sc.head])
                if name in self.token_sources[mi] and carry.size:  # ends inside a document
                    carry = carry[:0]
                    self.remainder_cut[key] = self.remainder_cut.get(key, 0) + 1
            if carry.size:  # the split ends inside a document
                packing.cut_without_eos += 1
            if split == TRAIN:
                self.leaks.train[f"{label}:{name}" if label else name] = (st.documents, st.doc_tokens)

    @staticmethod
    def _add_stats(st: statistics.SplitStats, part: statistics.SplitStats, token_counts_merged: bool) -> None:
        for i, pads in part.padded.items():
            st.padded[st.records + i] = pads
        for f in (
            "records",
            "tokens",
            "pad",
            "eos",
            "documents",
            "doc_tokens",
            "sampled_tokens",
            "sampled_bytes",
            "sampled_docs",
        ):
            setattr(st, f, getattr(st, f) + getattr(part, f))
        st.length_hist += part.length_hist
        if not token_counts_merged and part.token_counts is not None:
            st.token_counts += part.token_counts

    def _docs(self, split: str, source: str, t: ShardTask, sc: ShardScan, base: int, where: str, n: int) -> None:
        """Folds the documents of `sc` (local ordinals 0 or 1..n) in, in order; base: the global
        ordinal of local ordinal 0."""
        self.empty[split] += sc.empty
        if split == HELDOUT:
            if not self.places or self.places[-1] != where:
                self.places.append(where)
            for ords, blob in zip(sc.digest_ordinals, sc.digests):
                self.ordinals.append(base + ords)
                self.digests.append(blob)
                self.place.append(np.full(ords.size, len(self.places) - 1, np.int64))
            for _, grams in sc.grams:  # the k-th in reading order
                self.grams.append(grams)
                self.heldout_source.append(source)
            self.short += sc.short
            return
        self.train_docs += n
        for local, hit in sc.exact:
            assert self.index is not None  # training scans are replayed by `train`, which sets it
            self.exact.add(
                f"training document {base + local} of {where} is an exact copy of held-out {self.index.where(hit)}"
            )
        self.exact.count += sc.exact_count - len(sc.exact)
        self.sampled_train += sc.sampled_train
        self.contaminated.update(sc.contaminated)
        shown = f"{self.labels[t.manifest]}:{source}" if self.labels[t.manifest] else source
        self.leaks.add(shown, where, sc.leak, base)
