"""Held-out evaluation sets: each held-out source on its own, as packed or padded instances.

A set is one source's held-out split (a `split: heldout` source — e.g. one of AI2's validation
files — or a mixture source's held-out share). Instance i of a set, in a fixed order (the same
examples every evaluation):

packed  record i of the split: documents packed into seq_len tokens as they were trained on
        (a record may start inside a document); PAD only fills a shard's last record.
padded  document i of the split, as OLMo-core's LM evaluator builds it (`LMEvaluatorCallbackConfig`
        requires a `NumpyPaddedFSLDataset`; OLMo 3's recipes build it with
        `NumpyPaddedFSLDatasetConfig.from_data_mix(DataMix.v3_small_ppl_validation, ...)`):
        documents are the spans of a file that end at an EOS (`iter_document_indices`; ids after
        a file's last EOS belong to no document), in file order, each cut to its first seq_len
        ids (`segment_documents_into_instances`: no BOS handling), then PAD-filled to seq_len;
        its `label_mask` is True on the document's ids, False on the fill, so that every id of
        the document but the first is a target (OLMo-core's labels are the ids shifted by one,
        masked where label_mask is False) and no fill position is. Here: one shard = one file
        (token files) or one packing unit (jsonl), so a document never crosses a shard. Tested
        instance for instance against OLMo-core itself (tests/dataloader/test_heldout.py).

What OLMo-core does besides, and olmax does not: its evaluation loader (`NumpyFSLDataLoader`,
seed 0, epoch 1) shuffles the instances of *all* sets together and drops the last
len % instances-per-batch of them, so each of AI2's evaluations skips fewer than one eval batch
of instances, spread over the sets; olmax evaluates every instance of each set (or the first
`eval_batches` batches of each), in order.

Batch b of a set holds instances [b·G, (b+1)·G); host h reads its contiguous slice
(`dataloader.hosts`); positions past the set's end are all-PAD rows (loss_mask 0). Pure logic
here (`document_spans`, `padded_fields`); `open_sets` and the set classes are the thin I/O.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Protocol

import numpy as np

from contract import HELDOUT, TOKEN_DTYPE, Manifest
from dataloader import hosts
from dataloader.loader import batch_fields, special_tokens
from dataloader.plan import sources_from_manifests
from dataloader.source import DEFAULT_MAX_OPEN_SHARDS, SplitSource, reader_bytes

PACKED, PADDED = "packed", "padded"
INSTANCES = (PACKED, PADDED)
SCAN_RECORDS = 1024  # records read per step of the padded sets' document scan


def document_spans(
    tokens: np.ndarray, eos_id: int, offset: int, first_start: int, max_len: int
) -> tuple[np.ndarray, np.ndarray, int]:
    """The documents ending in one chunk of a shard's token stream (pure).

    tokens [n]: ids at flat positions offset..offset+n-1 of the source's records (record r,
    column c is position r·L + c); first_start: where the current document began (the shard's
    first position, or one past the previous EOS). Returns (starts int64 [d], lengths int64 [d],
    the next document's start): a document is [start, EOS position + 1), its length cut to
    max_len (the instance keeps its first max_len ids, as OLMo-core's truncation does).
    """
    ends = np.flatnonzero(np.asarray(tokens) == eos_id).astype(np.int64) + offset + 1
    if not len(ends):
        return np.zeros(0, np.int64), np.zeros(0, np.int64), first_start
    starts = np.concatenate([[first_start], ends[:-1]]).astype(np.int64)
    return starts, np.minimum(ends - starts, max_len), int(ends[-1])


def padded_fields(tokens: np.ndarray, lengths: np.ndarray, pad_id: int) -> dict[str, np.ndarray]:
    """OLMo-core's padded instances as the model's batch fields (pure).

    tokens [k, L]: each row's document in its first lengths[k] columns (the rest anything);
    lengths int [k] (0 = an all-PAD row). Returns int32 [k, L] tokens (PAD past the length),
    loss_mask (1 on the document: OLMo-core's label_mask), segment_ids (1 on the document, 0 on
    the fill) and positions (0..length-1, 0 on the fill)."""
    k, L = tokens.shape
    col = np.arange(L, dtype=np.int32)[None, :]
    real = col < np.asarray(lengths, np.int64)[:, None]
    return {
        "tokens": np.where(real, tokens, pad_id).astype(np.int32),
        "segment_ids": real.astype(np.int32),
        "positions": np.where(real, col, 0).astype(np.int32),
        "loss_mask": real.astype(np.int32),
    }


class EvalSet(Protocol):
    label: str
    source: SplitSource  # the open shard reader (close_sets closes it)

    def size(self, limit: int | None = None) -> int:
        """Instances in the set (at most `limit`, when given: a capped set need not count them all)."""

    def instances(self, index: np.ndarray) -> dict[str, np.ndarray]:
        """Batch fields int32 [k, L] of instances index int64 [k] (≥ size(): all-PAD rows)."""


def num_batches(eval_set: EvalSet, global_batch_size: int, max_batches: int | None) -> int:
    """Batches of `global_batch_size` instances one evaluation of the set reads (≥ 1)."""
    limit = None if max_batches is None else max_batches * global_batch_size
    return max(1, -(-eval_set.size(limit) // global_batch_size))


def host_batch(
    eval_set: EvalSet, batch: int, global_batch_size: int, process_index: int, process_count: int
) -> dict[str, np.ndarray]:
    """Host h's rows of the set's batch `batch` (int32 [G/H, L] fields)."""
    return eval_set.instances(hosts.host_positions(batch, global_batch_size, process_index, process_count))


def _check_vocab(raw: np.ndarray, tokenizer: Mapping, label: str) -> None:
    """Ids ≥ vocab_size are refused as the training loader refuses them (raw: uint32 records)."""
    at, ids = special_tokens(raw, int(tokenizer["vocab_size"]))
    if len(at):
        raise ValueError(f"held-out set {label!r}: token id {int(ids.max())} ≥ vocab_size {tokenizer['vocab_size']}")


@dataclasses.dataclass
class PackedSet:
    """Instance i = record i of the source's held-out split."""

    label: str
    source: SplitSource
    tokenizer: Mapping

    def size(self, limit: int | None = None) -> int:
        n = self.source.num_records
        return n if limit is None else min(n, limit)

    def instances(self, index: np.ndarray) -> dict[str, np.ndarray]:
        index = np.asarray(index, np.int64)
        valid = (index >= 0) & (index < self.source.num_records)
        raw = np.full((len(index), self.source.seq_len), int(self.tokenizer["pad_id"]), TOKEN_DTYPE)
        self.source.read_into(index[valid], raw, np.flatnonzero(valid))
        _check_vocab(raw, self.tokenizer, self.label)
        tokens = raw.astype(np.int32)
        return {"tokens": tokens, **batch_fields(tokens, int(self.tokenizer["eos_id"]), int(self.tokenizer["pad_id"]))}


class PaddedSet:
    """Instance i = document i of the source's held-out split, OLMo-core's padded instance.

    The documents' spans are found by scanning the records for EOS, lazily: only as far as a
    capped evaluation needs (`size(limit)`), once (kept in memory: 16 bytes per document)."""

    def __init__(self, label: str, source: SplitSource, shard_records: Sequence[int], tokenizer: Mapping):
        self.label, self.source, self.tokenizer = label, source, tokenizer
        self.seq_len = source.seq_len
        self._eos, self._pad = int(tokenizer["eos_id"]), int(tokenizer["pad_id"])
        bounds = np.cumsum([0, *map(int, shard_records)])
        self._shards = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
        self._starts: list[np.ndarray] = []
        self._lengths: list[np.ndarray] = []
        self._count = 0
        self._shard, self._record = 0, self._shards[0][0] if self._shards else 0
        self._doc_start = self._record * self.seq_len
        self._done = not self._shards

    def _scan(self) -> None:
        """Reads the next chunk of records (within one shard) and records its documents."""
        first, stop = self._shards[self._shard]
        hi = min(stop, self._record + SCAN_RECORDS)
        raw = self.source.read(np.arange(self._record, hi, dtype=np.int64))
        _check_vocab(raw, self.tokenizer, self.label)
        starts, lengths, self._doc_start = document_spans(
            raw.reshape(-1), self._eos, self._record * self.seq_len, self._doc_start, self.seq_len
        )
        self._starts.append(starts)
        self._lengths.append(lengths)
        self._count += len(starts)
        self._record = hi
        if hi == stop:  # a shard's ids after its last EOS belong to no document
            self._shard += 1
            if self._shard == len(self._shards):
                self._done = True
            else:
                self._record = self._shards[self._shard][0]
                self._doc_start = self._record * self.seq_len

    def size(self, limit: int | None = None) -> int:
        while not self._done and (limit is None or self._count < limit):
            self._scan()
        if len(self._starts) > 1:
            self._starts, self._lengths = [np.concatenate(self._starts)], [np.concatenate(self._lengths)]
        return self._count if limit is None else min(self._count, limit)

    def spans(self) -> tuple[np.ndarray, np.ndarray]:
        """(starts, lengths) int64 [D] of every document (scans the whole set)."""
        self.size()
        return (self._starts[0], self._lengths[0]) if self._starts else (np.zeros(0, np.int64),) * 2

    def instances(self, index: np.ndarray) -> dict[str, np.ndarray]:
        index = np.asarray(index, np.int64)
        n = self.size(int(index.max()) + 1 if len(index) else 0)
        L = self.seq_len
        valid = (index >= 0) & (index < n)
        starts = np.zeros(len(index), np.int64)
        lengths = np.zeros(len(index), np.int64)
        if n:
            starts[valid], lengths[valid] = self._starts[0][index[valid]], self._lengths[0][index[valid]]
        # A document of ≤ L ids lies in at most two consecutive records: read both where needed.
        first, col = np.divmod(starts, L)
        block = np.full((len(index), 2 * L), self._pad, TOKEN_DTYPE)
        rows = np.flatnonzero(valid)
        self.source.read_into(first[rows], block[:, :L], rows)
        second = rows[col[rows] + lengths[rows] > L]
        self.source.read_into(first[second] + 1, block[:, L:], second)
        tokens = np.take_along_axis(block, col[:, None] + np.arange(L)[None, :], axis=1)
        return padded_fields(tokens, lengths, self._pad)


def heldout_sources(manifests: Sequence[Manifest]) -> list[str]:
    """Names of the sources with held-out examples, in `data` order (the sets one may evaluate)."""
    return [s.name for s in sources_from_manifests(manifests, HELDOUT) if s.records > 0]


def choose_sets(manifests: Sequence[Manifest], sets: Sequence[str] | None) -> list[str]:
    """The sets to evaluate: `sets` (checked: each a source with held-out examples) or all of them.
    ValueError naming the unknown ones and the choices."""
    available = heldout_sources(manifests)
    if sets is None:
        return available
    unknown = [s for s in sets if s not in available]
    if unknown:
        raise ValueError(
            f"eval.sets names {unknown}, which hold no held-out examples in the data; the held-out sets are {available}"
        )
    return list(sets)


def open_sets(manifests: Sequence[Manifest], labels: Sequence[str], instances: str) -> list[EvalSet]:
    """The sets `labels` (see `choose_sets`) as `instances` ("packed" | "padded"), their shards opened
    and checked against the manifests (SplitSource)."""
    if instances not in INSTANCES:
        raise ValueError(f"instances must be one of {INSTANCES}, got {instances!r}")
    specs = {s.name: s for s in sources_from_manifests(manifests, HELDOUT)}
    by_name = {name: m for m in manifests for name in m["sources"]}
    out: list[EvalSet] = []
    for label in labels:
        m = by_name[label]
        source = SplitSource(m, specs[label], HELDOUT, max_open_shards=DEFAULT_MAX_OPEN_SHARDS)
        if instances == PACKED:
            out.append(PackedSet(label, source, m["tokenizer"]))
        else:
            shards = [int(s["records"]) for s in m.source(label)["splits"][HELDOUT]["shards"]]
            out.append(PaddedSet(label, source, shards, m["tokenizer"]))
    return out


def sets_reader_bytes(manifests: Sequence[Manifest], labels: Sequence[str]) -> int:
    """The most host memory the sets' open shard readers can hold (`source.reader_bytes`)."""
    by_name = {name: m for m in manifests for name in m["sources"]}
    return sum(reader_bytes(by_name[label], label, HELDOUT, DEFAULT_MAX_OPEN_SHARDS) for label in labels)


def close_sets(sets: Sequence[EvalSet]) -> None:
    for s in sets:
        s.source.close()
