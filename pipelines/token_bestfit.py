"""Best-fit packing of token files (`format: tokens` with `packing: {method: best_fit, group: G}`).

OLMo 3's stage 3 (AI2's `OLMo-3-1025-7B-long-context.py`) reads its token files through
OLMo-core's `NumpyPackedFSLDataset` (`generate_doc_lengths=True`, `source_group_size=8`, default
`long_doc_strategy=truncate`). This module writes the same instances as olmax records:

* the packing unit is a *group* of G consecutive files of a source (OLMo-core's
  `source_group_size`; its `source_permutation_seed` is applied by `from-olmo-mix`, which lists
  the files already permuted): the group's files are one token stream, file after file;
* documents are the EOS-terminated runs of the stream (OLMo-core's `iter_document_indices` on a
  local array; ids after a file's last EOS belong to no document and are dropped);
* a document longer than seq_len keeps its first seq_len ids (`LongDocStrategy.truncate`; the rest,
  its EOS included, is dropped and counted: `documents_cut`, `dropped_tokens`);
* the documents are sorted by length, longest first, and placed by best-fit decreasing
  (`pipelines.bestfit.best_fit_decreasing`, which equals
  OLMo-core's `InstancePacker` and, given lengths already in decreasing order, keeps that order);
* record j of the group's shard is instance j of the group (bins in opening order, each its
  documents in placement order, then PAD to seq_len), so shard g, record j is OLMo-core's instance
  offset_g + j and `data_order: olmo-core` gives AI2's batches.

Equal lengths (`packing.ties`): OLMo-core sorts with `np.argsort(-length)`, an unstable sort whose
order among equal lengths depends on the CPU numpy dispatches to (measured: numpy 2.4 with its
AVX-512 kernels disabled orders 5,000 lengths differently), so two workers on other CPUs would
write other shards. `stable` (the default) keeps equal lengths in stream order: the same shards on
every machine (invariant 2), OLMo-core's instances wherever no two documents tie in a way that
matters. `numpy` makes OLMo-core's own call: its instances exactly, on a machine like the one that
packs them (the manifest records the numpy version and its CPU features).

The loader's document mask needs nothing new: a record holds whole EOS-terminated documents then
PAD, or one truncated document alone (exactly seq_len ids, no EOS). Memory: one group's ids
(4 bytes each) — G files at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from contract import SPLITS, TOKEN_DTYPE, TRAIN
from pipelines import beam_metrics as metrics
from pipelines import token_files as tf
from pipelines.bestfit import best_fit_decreasing
from pipelines.read import REJECTS_TAG, TALLY_TAG, Reject
from pipelines.shards import DEFAULT_SHARD_COMPRESSION, quiet_write_failures, shard_name, write_array_record

TRUNCATE = "truncate"  # OLMo-core's LongDocStrategy.truncate: the only one for token files here


@dataclasses.dataclass
class GroupStats:
    """One packed group, as `token_files.TokenFileStats` counts a file: tokens = ids read;
    kept = non-PAD ids in the records; padding = PAD ids; dropped = tokens − kept (the truncated
    tails and ids after a file's last EOS); documents = EOS count (+1 per file ending without
    one); documents_cut = documents whose EOS is not kept (truncated, or unterminated)."""

    tokens: int = 0
    records: int = 0
    kept: int = 0
    dropped: int = 0
    documents: int = 0
    documents_cut: int = 0
    padding: int = 0


def document_spans(ids: np.ndarray, eos_id: int, offset: int = 0) -> np.ndarray:
    """A file's ids → int64 [D, 2] (start, end) of its EOS-terminated documents, shifted by `offset`."""
    ends = np.flatnonzero(ids == eos_id).astype(np.int64) + 1
    starts = np.concatenate([np.zeros(min(1, len(ends)), np.int64), ends[:-1]])
    return np.stack([starts, ends], axis=1) + offset


def truncate(spans: np.ndarray, seq_len: int) -> np.ndarray:
    """Documents longer than seq_len keep their first seq_len ids (LongDocStrategy.truncate)."""
    out = spans.copy()
    out[:, 1] = np.minimum(spans[:, 1], spans[:, 0] + seq_len)
    return out


TIES = ("stable", "numpy")  # packing.ties: equal lengths in stream order, or as OLMo-core's argsort


def pack_spans(spans: np.ndarray, seq_len: int, ties: str = "stable") -> tuple[np.ndarray, list[list[int]]]:
    """Documents (each ≤ seq_len) → (documents sorted longest first, bins of indices into it);
    equal lengths in stream order (`stable`) or as OLMo-core's unstable argsort leaves them (`numpy`)."""
    if ties not in TIES:
        raise ValueError(f"ties must be one of {TIES}, not {ties!r}")
    if not len(spans):
        return spans, []
    lengths = spans[:, 1] - spans[:, 0]
    keys = -1 * lengths.astype(np.int64)
    # numpy's default (unstable) kind is OLMo-core's InstancePacker call
    order = np.argsort(keys, kind="stable") if ties == "stable" else np.argsort(keys)
    ordered = np.take(spans, order, axis=0)
    return ordered, best_fit_decreasing((ordered[:, 1] - ordered[:, 0]).tolist(), seq_len)


def records(
    stream: np.ndarray, spans: np.ndarray, bins: Sequence[Sequence[int]], seq_len: int, pad_id: int
) -> Iterator[np.ndarray]:
    """Each bin's documents, concatenated and PAD-filled to seq_len (uint32 [seq_len])."""
    for items in bins:
        rec = np.full(seq_len, pad_id, TOKEN_DTYPE)
        at = 0
        for i in items:
            s, e = int(spans[i, 0]), int(spans[i, 1])
            rec[at : at + e - s] = stream[s:e]
            at += e - s
        yield rec


def read_file_checked(path: str, dtype: np.dtype, eos_id: int, vocab_size: int, pad_id: int) -> tuple[np.ndarray, int]:
    """A token file's ids, checked as `token_files.convert_file` checks them (size, numpy header,
    ids < vocab_size, no PAD, the .csv.gz's document count) → (ids uint32, documents)."""
    try:
        tf.check_size(tf.file_size(path), dtype)
        csv_rows = tf.read_csv_rows(path)
        conv = tf.TokenFileConverter(1, eos_id, vocab_size, pad_id)  # checks and counts (its records: views)
        chunks = []
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            for ids in tf.read_ids(f, dtype):
                conv.feed(ids)
                chunks.append(ids.astype(TOKEN_DTYPE, copy=False))
    except tf.TokenFileError:
        raise
    except tf.READ_ERRORS as e:
        raise tf.TokenFileError("unreadable_file", f"{type(e).__name__}: {e}") from None
    stats = conv.finish()
    tf.check_documents(stats, csv_rows)
    return (np.concatenate(chunks) if chunks else np.zeros(0, TOKEN_DTYPE)), stats.documents


def pack_group(
    paths: Sequence[str],
    dest: str,
    dtype: np.dtype,
    seq_len: int,
    eos_id: int,
    vocab_size: int,
    pad_id: int,
    ties: str = "stable",
    compression: str = DEFAULT_SHARD_COMPRESSION,
) -> tuple[GroupStats, str]:
    """Packs one group of token files into the shard `dest`. Returns (stats, sha256); raises
    TokenFileError (naming the file) when one of them breaks the format."""
    stats = GroupStats()
    streams, spans = [], []
    for path in paths:
        try:
            ids, docs = read_file_checked(path, dtype, eos_id, vocab_size, pad_id)
        except tf.TokenFileError as e:
            raise tf.TokenFileError(e.reason, f"{path}: {e.detail}") from None
        spans.append(document_spans(ids, eos_id, stats.tokens))
        streams.append(ids)
        stats.tokens += len(ids)
        stats.documents += docs
    stream = np.concatenate(streams) if streams else np.zeros(0, TOKEN_DTYPE)
    whole = np.concatenate(spans) if spans else np.zeros((0, 2), np.int64)
    kept_spans = truncate(whole, seq_len)
    ordered, bins = pack_spans(kept_spans, seq_len, ties)
    rows = (r.tobytes() for r in records(stream, ordered, bins, seq_len, pad_id))
    n, sha = write_array_record(rows, dest, compression)
    stats.records = n
    stats.kept = int((kept_spans[:, 1] - kept_spans[:, 0]).sum())
    stats.padding = n * seq_len - stats.kept
    stats.dropped = stats.tokens - stats.kept
    # documents whose EOS is not kept: the truncated ones and each file's unterminated tail
    stats.documents_cut = int(np.count_nonzero(whole[:, 1] - whole[:, 0] > seq_len)) + (stats.documents - len(whole))
    return stats, sha


def groups(files: Sequence[str], size: int) -> list[tuple[str, ...]]:
    """A source's files in groups of `size` consecutive files (the last may hold fewer)."""
    return [tuple(files[i : i + size]) for i in range(0, len(files), size)]


class PackTokenFiles(beam.DoFn):
    """(source, group's paths, group index, groups) → its two shards (the source's split gets the
    group's packed instances, the other split an empty shard), the tallies and, for a group with a
    bad file, one reject per file (the group's shards both empty: OLMo-core would stop on it)."""

    def __init__(
        self,
        output: str,
        seq_len: int,
        eos_id: int,
        vocab_size: int,
        dtypes: Mapping[str, str],
        pad_id: int,
        ties: str = "stable",
        compression: str = DEFAULT_SHARD_COMPRESSION,
    ):
        tf.check_dtypes_hold(dtypes, vocab_size)
        self._output, self._seq_len, self._eos, self._vocab = output, seq_len, eos_id, vocab_size
        self._dtypes, self._pad, self._ties = dict(dtypes), pad_id, ties
        self._compression = compression  # every shard's (pipelines.shards.SHARD_COMPRESSIONS)

    def setup(self) -> None:
        quiet_write_failures()

    def process(self, element: tuple) -> Iterator[Any]:
        source, paths, index, count = element
        dest = {split: FileSystems.join(self._output, source, shard_name(split, index, count)) for split in SPLITS}
        try:
            stats, sha = pack_group(
                paths,
                dest[TRAIN],
                tf.token_dtype(self._dtypes[source]),
                self._seq_len,
                self._eos,
                self._vocab,
                self._pad,
                self._ties,
                self._compression,
            )
            tally = {"documents": stats.documents}
            rejects: list[Reject] = []
        except tf.TokenFileError as e:
            stats, sha = GroupStats(), None
            tally = {"documents": len(paths), f"rejected/{e.reason}": len(paths)}
            rejects = [
                Reject(source, p, 0, e.reason, None, f"{e.detail}; its packing group is rejected") for p in paths
            ]
        for split in SPLITS:
            got, digest = (stats, sha) if split == TRAIN and sha is not None else (GroupStats(), None)
            if digest is None:
                digest = write_array_record([], dest[split], self._compression)[1]
            metrics.inc(source, f"tokens/{split}", got.kept)
            metrics.inc(source, f"examples/{split}", got.records)
            yield {
                "source": source,
                "split": split,
                "index": index,
                "count": count,
                "path": f"{source}/{shard_name(split, index, count)}",
                "records": got.records,
                "sha256": digest,
                "documents": got.documents,
                "tokens": got.kept,
                "padding": got.padding,
                "dropped_tokens": got.dropped,
                "documents_cut": got.documents_cut,
            }
        for r in rejects:
            yield beam.pvalue.TaggedOutput(REJECTS_TAG, (source, r))
        for key, n in sorted(tally.items()):
            metrics.inc(source, key, n)
            yield beam.pvalue.TaggedOutput(TALLY_TAG, ((source, key), n))
