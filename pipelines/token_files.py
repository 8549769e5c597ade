"""`format: tokens` sources: OLMo-core / dolma token files → one shard each (no re-tokenization).

A token file (named `*.npy`, but with no numpy header) is a flat little-endian array of token
ids (`dtype` uint32 for dolma2/dolma3, uint16 accepted); every document is followed by EOS,
there is no BOS. Record j of the file's shard is OLMo-core's fixed-length instance j of the
file (`NumpyFSLDataset` with sequence length L): `tokens[j·L : (j+1)·L]` for j < n // L. No
PAD, no repacking. The remainder (n mod L tokens) is not trained on by OLMo-core either: it
is counted (`tokens dropped`, `documents cut` = documents whose EOS is not in the kept instances:
it is in the remainder, or the file ends without one), not hidden. A held-out file keeps the
remainder's whole documents (its ids up to the last EOS) in one more record, PAD-filled as a
packed shard's last record is: OLMo-core's evaluator reads every document of its validation
files (`dataloader.heldout`), those too; only ids after the file's last EOS are dropped.

Documents are counted by EOS (plus one for a trailing run of tokens without EOS, which a
well-formed file does not have). A file is rejected whole, as one counted entry with its
reason, when its size is not a multiple of the dtype, it starts with a numpy `.npy` header
(`np.save` output: its header would be read as ids), it holds an id ≥ vocab_size or the PAD id
(PAD marks no document: the loader would mask it and the audit refuses it inside one), it cannot
be read, or a sibling `*.csv.gz` (written by `dolma tokens`: one row per document) disagrees
with the EOS count; it then counts as one document (an unreadable file has no document count).
A `dtype` too narrow for the tokenizer's ids (uint16 for dolma2, whose EOS is 100257) is refused
with the mixture, before the job (`pipelines.mixture`). Its shard is then empty, which shifts OLMo-core's instance numbering of
every later file: the olmo-core loader order refuses such a manifest (dataloader.olmo_order).

`TokenFileConverter` is the pure, streaming part (chunks of ids in, records out; memory is one
chunk whatever the file size); `convert_file` is the thin I/O around it, `ConvertTokenFile` the job's DoFn.
"""

from __future__ import annotations

import dataclasses
import gzip
import os
import stat
import zlib
from collections.abc import Iterator, Mapping
from typing import Any, BinaryIO

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from contract import HELDOUT, SPLITS, TOKEN_DTYPE, TOKEN_FILE_DTYPES, TRAIN
from contract.errors import Refused
from pipelines import beam_metrics as metrics
from pipelines.read import REJECTS_TAG, TALLY_TAG, Reject
from pipelines.shards import DEFAULT_SHARD_COMPRESSION, quiet_write_failures, shard_name, write_array_record

# the contract's token-file dtypes, as little-endian numpy dtypes
TOKEN_DTYPES = {name: np.dtype(name).newbyteorder("<") for name in TOKEN_FILE_DTYPES}
# ids per read (4 MiB of uint32): memory flat in file size. Measured (bench/RESULTS.md, token-file
# conversion): 4 MiB blocks, which the checks and slicing pass over while cache-warm, convert ~5% faster
# than 16 MiB ones, with the same bytes and about half the peak memory; larger blocks are no faster.
READ_TOKENS = 1 << 20
CSV_CHUNK = 1 << 22  # bytes per read of a .csv.gz
# numpy's .npy magic, major version 1-3, minor 0 (numpy.lib.format): what np.save writes first
NUMPY_MAGIC = b"\x93NUMPY"


class TokenFileError(Refused, ValueError):
    """A token file breaks the format: `reason` is one of contract.TOKEN_FILE_REASONS."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason, self.detail = reason, detail


def token_dtype(name: str) -> np.dtype:
    try:
        return TOKEN_DTYPES[name]
    except KeyError:
        raise ValueError(f"dtype must be one of {sorted(TOKEN_DTYPES)}, got {name!r}") from None


def dtype_holds(name: str, vocab_size: int) -> bool:
    """Can token-file dtype `name` hold every id of a vocabulary of `vocab_size` (ids < vocab_size)?"""
    return int(np.iinfo(token_dtype(name)).max) >= vocab_size - 1


def check_dtypes_hold(dtypes: Mapping[str, str], vocab_size: int) -> None:
    """Raise ValueError naming the sources whose token-file dtype ({source: dtype}) cannot hold
    ids < vocab_size: the mixture refuses these; a graph built otherwise must not convert garbage."""
    narrow = sorted(name for name, dt in dtypes.items() if not dtype_holds(dt, vocab_size))
    if narrow:
        raise ValueError(f"sources {narrow}: their dtype cannot hold ids < vocab_size {vocab_size}")


def is_numpy_header(head: bytes) -> bool:
    """Do a file's first bytes start a numpy .npy file (magic, version 1-3.0)?"""
    return len(head) >= 8 and head.startswith(NUMPY_MAGIC) and head[6] in (1, 2, 3) and head[7] == 0


def check_size(size_bytes: int, dtype: np.dtype) -> int:
    """File size → number of ids; TokenFileError when it is not a whole number of ids."""
    if size_bytes % dtype.itemsize:
        raise TokenFileError(
            "bad_token_file_size", f"{size_bytes} bytes is not a multiple of {dtype.itemsize} ({dtype.name})"
        )
    return size_bytes // dtype.itemsize


def instances(tokens: np.ndarray, seq_len: int) -> np.ndarray:
    """A whole file's ids [n] → OLMo-core's instances uint32 [n // L, L] (remainder dropped)."""
    k = len(tokens) // seq_len
    return np.asarray(tokens[: k * seq_len], dtype=TOKEN_DTYPE).reshape(k, seq_len)


@dataclasses.dataclass
class TokenFileStats:
    """One converted file. tokens = n; records = n // L; kept = L · records; dropped = n − kept;
    documents = EOS count (+1 for a trailing run without EOS); documents_cut = documents whose
    EOS is not among the kept ids: its EOS is in the dropped remainder, or the file ends without
    one (a document cut by the file's end, even at an instance boundary: its shard ends inside it)."""

    tokens: int = 0
    records: int = 0
    kept: int = 0
    dropped: int = 0
    documents: int = 0
    documents_cut: int = 0
    padding: int = 0  # PAD ids of the kept remainder's record (keep_remainder only)


class TokenFileConverter:
    """Streams one file's ids (in chunks, in order) into records of exactly seq_len ids.

    feed(ids [k]) → uint32 [r, L] (the records completed so far); finish() → TokenFileStats,
    the ids left over (< L) being the dropped remainder. Raises TokenFileError on an id ≥
    vocab_size. keep_remainder (held-out files, needs pad_id): finish() also sets `tail`, the
    remainder's ids up to its last EOS PAD-filled to one record (None when it has no EOS), and
    only the ids after that EOS are dropped.
    """

    def __init__(
        self, seq_len: int, eos_id: int, vocab_size: int, pad_id: int | None = None, *, keep_remainder: bool = False
    ):
        if seq_len <= 0 or not 0 <= eos_id < vocab_size or not (pad_id is None or 0 <= pad_id < vocab_size):
            raise ValueError(
                f"need seq_len > 0 and 0 ≤ eos_id, pad_id < vocab_size ({seq_len}, {eos_id}, {pad_id}, {vocab_size})"
            )
        if keep_remainder and pad_id is None:
            raise ValueError("keep_remainder needs pad_id")
        self.seq_len, self.eos_id, self.vocab_size, self.pad_id = seq_len, eos_id, vocab_size, pad_id
        self.keep_remainder = keep_remainder
        self.tail: np.ndarray | None = None
        self.stats = TokenFileStats()
        self._carry = np.zeros(0, TOKEN_DTYPE)
        self._last: int | None = None  # the last id seen (is the file's end an EOS?)

    def feed(self, ids: np.ndarray) -> np.ndarray:
        if not len(ids):
            return np.zeros((0, self.seq_len), TOKEN_DTYPE)
        top = int(ids.max())
        if top >= self.vocab_size:
            at = self.stats.tokens + int(np.argmax(ids >= self.vocab_size))
            raise TokenFileError(
                "token_id_out_of_range", f"id {top} ≥ vocab_size {self.vocab_size} (first bad id at token {at})"
            )
        if self.pad_id is not None and top >= self.pad_id and (pad := ids == self.pad_id).any():
            at = self.stats.tokens + int(np.argmax(pad))
            raise TokenFileError(
                "pad_id_in_document",
                f"the PAD id {self.pad_id} at token {at}: PAD marks no "
                "document (training masks it out and the audit refuses it inside one)",
            )
        self.stats.tokens += len(ids)
        self.stats.documents += int(np.count_nonzero(ids == self.eos_id))
        self._last = int(ids[-1])
        flat = np.concatenate([self._carry, ids.astype(TOKEN_DTYPE, copy=False)]) if len(self._carry) else ids
        k = len(flat) // self.seq_len
        out = np.asarray(flat[: k * self.seq_len], dtype=TOKEN_DTYPE).reshape(k, self.seq_len)
        self._carry = np.array(flat[k * self.seq_len :], dtype=TOKEN_DTYPE)
        self.stats.records += k
        return out

    def finish(self) -> TokenFileStats:
        s, rest = self.stats, self._carry
        unterminated = self._last is not None and self._last != self.eos_id
        s.documents += int(unterminated)
        eos = np.flatnonzero(rest == self.eos_id) if self.keep_remainder else np.empty(0, np.int64)
        if len(eos):  # the remainder's whole documents: one more record, PAD-filled
            cut = int(eos[-1]) + 1
            self.tail = np.full(self.seq_len, self.pad_id, TOKEN_DTYPE)
            self.tail[:cut] = rest[:cut]
            s.records, s.padding, rest = s.records + 1, self.seq_len - cut, rest[cut:]
        s.kept = s.records * self.seq_len - s.padding
        s.dropped = len(rest)
        # Documents without their EOS in the kept ids: those whose EOS is in the remainder, and the
        # file's unterminated last one (in the remainder or not): what the shards hold is then
        # EOS count = documents − documents_cut, which the audit checks.
        s.documents_cut = int(np.count_nonzero(rest == self.eos_id)) + int(unterminated)
        self._carry = np.zeros(0, TOKEN_DTYPE)
        return s


def csv_sibling(path: str) -> str:
    """`dolma tokens`' per-document metadata next to a token file: x.npy → x.csv.gz."""
    stem = path[:-4] if path.endswith(".npy") else path
    return stem + ".csv.gz"


def count_csv_rows(stream: BinaryIO) -> int:
    """Documents listed in a gzip'd metadata CSV (one row each: start, end, id, src, loc), read from
    a binary stream of the .csv.gz in chunks (memory flat in its size)."""
    rows, last = 0, b"\n"
    with gzip.GzipFile(fileobj=stream, mode="rb") as f:
        while chunk := f.read(CSV_CHUNK):
            rows += chunk.count(b"\n")
            last = chunk[-1:]
    return rows + (last != b"\n")  # a last row without a newline


def check_documents(stats: TokenFileStats, csv_rows: int | None) -> None:
    if csv_rows is not None and csv_rows != stats.documents:
        raise TokenFileError(
            "document_count_mismatch",
            f"the .csv.gz lists {csv_rows} documents, the file holds {stats.documents} (counted by EOS)",
        )


def read_ids(stream: BinaryIO, dtype: np.dtype, chunk: int | None = None) -> Iterator[np.ndarray]:
    """A binary stream of little-endian ids → arrays of ≤ `chunk` ids (uint16 or uint32; default READ_TOKENS)."""
    want = (chunk or READ_TOKENS) * dtype.itemsize
    pending = b""
    first = True
    while True:
        data = stream.read(max(want, 8) if first else want)
        if first and is_numpy_header(data[:8]):
            raise TokenFileError(
                "numpy_header",
                f"the file starts with a numpy .npy header (v{data[6]}.0, as "
                "np.save writes): token files are headerless ids (write them with "
                "ndarray.tofile, or strip the header)",
            )
        first = False
        if not data:
            break
        if pending:
            data, pending = pending + data, b""
        cut = len(data) - len(data) % dtype.itemsize
        if cut < len(data):
            pending = data[cut:]
        if cut:
            yield np.frombuffer(data[:cut], dtype=dtype)
    if pending:
        raise TokenFileError("bad_token_file_size", f"the file ends with {len(pending)} stray bytes")


# -- thin I/O: one file → one committed shard ---------------------------------------------------


def file_size(path: str) -> int:
    [res] = FileSystems.match([path])
    if not res.metadata_list:
        raise FileNotFoundError(path)
    return int(res.metadata_list[0].size_in_bytes)


def read_csv_rows(path: str) -> int | None:
    """Rows of `path`'s sibling .csv.gz, or None when there is none."""
    sibling = csv_sibling(path)
    if sibling == path or not FileSystems.exists(sibling):
        return None
    with FileSystems.open(sibling, compression_type=CompressionTypes.UNCOMPRESSED) as f:
        return count_csv_rows(f)


# What reading a file or its .csv.gz may raise besides TokenFileError: the file is then unreadable.
READ_ERRORS = (OSError, EOFError, UnicodeDecodeError, zlib.error)


def convert_file(
    path: str,
    dest: str,
    dtype: np.dtype,
    seq_len: int,
    eos_id: int,
    vocab_size: int,
    pad_id: int | None = None,
    *,
    keep_remainder: bool = False,
    compression: str = DEFAULT_SHARD_COMPRESSION,
) -> tuple[TokenFileStats, str]:
    """Converts token file `path` into the shard `dest` (committed only when the whole file is
    good). Returns (stats, sha256). Raises TokenFileError (with its reason) otherwise.
    keep_remainder / pad_id: see TokenFileConverter (held-out files); compression: the shard's
    (pipelines.shards.SHARD_COMPRESSIONS)."""

    try:
        if "://" not in path and not stat.S_ISREG(os.stat(path).st_mode):
            # `resolve` refused these before the job; a file replaced since then is checked before
            # opening it: opening a FIFO would block the worker until someone writes to it
            raise TokenFileError("unreadable_file", "not a regular file (a directory, FIFO, socket or device)")
        check_size(file_size(path), dtype)
        csv_rows = read_csv_rows(path)
    except TokenFileError:
        raise
    except READ_ERRORS as e:
        raise TokenFileError("unreadable_file", f"{type(e).__name__}: {e}") from None
    conv = TokenFileConverter(seq_len, eos_id, vocab_size, pad_id, keep_remainder=keep_remainder)
    result: list[TokenFileStats] = []

    def records() -> Iterator[bytes]:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as f:
            for ids in read_ids(f, dtype):
                for row in conv.feed(ids):
                    yield row.tobytes()
        stats = conv.finish()
        check_documents(stats, csv_rows)  # raises before the shard is committed
        result.append(stats)
        if conv.tail is not None:
            yield conv.tail.tobytes()

    try:
        n, sha = write_array_record(records(), dest, compression)
    except TokenFileError:
        raise
    except READ_ERRORS as e:
        raise TokenFileError("unreadable_file", f"{type(e).__name__}: {e}") from None
    if not result or n != result[0].records:
        raise RuntimeError(f"{path}: wrote {n} records, the converter counted {result[0].records if result else None}")
    return result[0], sha


class ConvertTokenFile(beam.DoFn):
    """FileTask of a tokens source → its two shards (the source's split gets the file's instances,
    the other split an empty shard, so numbering holds), the tallies and, for a bad file, one
    reject with its reason (its shards both empty)."""

    def __init__(
        self,
        output: str,
        seq_len: int,
        eos_id: int,
        vocab_size: int,
        dtypes: Mapping[str, str],
        heldout_sources: frozenset[str],
        pad_id: int | None = None,
        compression: str = DEFAULT_SHARD_COMPRESSION,
    ):
        check_dtypes_hold(dtypes, vocab_size)
        self._output, self._seq_len, self._eos, self._vocab = output, seq_len, eos_id, vocab_size
        self._dtypes, self._heldout, self._pad = dict(dtypes), frozenset(heldout_sources), pad_id
        self._compression = compression  # every shard's (pipelines.shards.SHARD_COMPRESSIONS)

    def setup(self) -> None:
        quiet_write_failures()  # a full disk: one line from the launcher, no traceback per worker

    # Any: Beam reads the annotations as its PCollections' types (and picks their coders by them)
    def process(self, element: tuple) -> Iterator[Any]:
        source, path, index, count = element
        target = HELDOUT if source in self._heldout else TRAIN
        dest = {split: FileSystems.join(self._output, source, shard_name(split, index, count)) for split in SPLITS}
        tally: dict[str, int] = {}
        rejects = []
        try:
            stats, sha = convert_file(
                path,
                dest[target],
                token_dtype(self._dtypes[source]),
                self._seq_len,
                self._eos,
                self._vocab,
                self._pad,
                keep_remainder=target == HELDOUT,
                compression=self._compression,
            )
            tally = {"documents": stats.documents}
        except TokenFileError as e:
            stats, sha = TokenFileStats(), None
            tally = {"documents": 1, f"rejected/{e.reason}": 1}
            rejects.append(Reject(source, path, 0, e.reason, None, f"{e.detail}; the whole file is rejected"))
        for split in SPLITS:
            if split == target and sha is not None:
                got, digest = stats, sha
            else:  # the other split, or a rejected file: an empty shard keeps the numbering
                got, digest = TokenFileStats(), write_array_record([], dest[split], self._compression)[1]
            info: dict[str, Any] = {
                "records": got.records,
                "sha256": digest,
                "documents": got.documents,
                "tokens": got.kept,
                "padding": got.padding,
                "dropped_tokens": got.dropped,
                "documents_cut": got.documents_cut,
            }
            metrics.inc(source, f"tokens/{split}", info["tokens"])
            metrics.inc(source, f"examples/{split}", info["records"])
            yield {
                "source": source,
                "split": split,
                "index": index,
                "count": count,
                "path": f"{source}/{shard_name(split, index, count)}",
                **info,
            }
        for r in rejects:
            yield beam.pvalue.TaggedOutput(REJECTS_TAG, (source, r))
        for key, n in sorted(tally.items()):
            metrics.inc(source, key, n)
            yield beam.pvalue.TaggedOutput(TALLY_TAG, ((source, key), n))
