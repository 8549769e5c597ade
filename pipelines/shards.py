"""Shard and side-file writing with commit-by-rename, on any Beam filesystem.

ArrayRecord's writer (and its Beam sink) only writes local files, so every shard is written to
a local temporary file first, then streamed through Beam's FileSystems to
`<final>.tmp-<uuid>` next to its final name (hashing it on the way) and renamed into place.
A shard therefore appears under its final name only when complete; a retried bundle rewrites
the same deterministic name with the same bytes; a failed attempt leaves at most a `.tmp-*`
file, which the job's last step deletes (`pipelines.outdir.prune`). A write that fails (a full
disk, locally or in --output) raises OutputWriteError naming the path and the OS error, after
removing its own temporary files.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import tempfile
import uuid
from collections.abc import Iterable

import numpy as np
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems
from array_record.python.array_record_module import ArrayRecordWriter

from contract import WRITER_OPTIONS
from contract.errors import Stopped
from pipelines.bestfit import BestFitPacker
from pipelines.pack import Packer

# The contract's group_size:1 = one record per chunk, so Grain reads any record directly. zstd:1 instead
# of ArrayRecord's default zstd:3: measured on token records, ~3.5x faster to write for ~3% more bytes.
DEFAULT_SHARD_COMPRESSION = "zstd:1"
# A mixture's `shard_compression`: how every shard's chunks are compressed. A format choice (the
# shards' bytes, so the manifest's fingerprint; readers need nothing: each chunk names its own).
# Measured on the bench's token records (one worker, 2026-12-07, pipelines/README.md): per 32 MiB of
# text, zstd:1 0.21 CPU-s for 0.335 of the raw bytes, snappy 0.11 for 0.50, uncompressed 0.03 for 1.0.
SHARD_COMPRESSIONS = (DEFAULT_SHARD_COMPRESSION, "snappy", "uncompressed")


def writer_options(compression: str = DEFAULT_SHARD_COMPRESSION) -> str:
    """ArrayRecord writer options for shards compressed with `compression` (one of SHARD_COMPRESSIONS)."""
    if compression not in SHARD_COMPRESSIONS:
        raise ValueError(f"shard compression must be one of {list(SHARD_COMPRESSIONS)}, got {compression!r}")
    return f"{WRITER_OPTIONS},{compression}"


TMP_MARK = ".tmp-"
COPY_CHUNK = 1 << 22


class OutputWriteError(Stopped):
    """A file of the job could not be written: "no space left on device writing PATH" (or
    another OS error's words). Its first argument is the message alone, so that Beam, which
    re-raises a DoFn's exception with "[while running '…']" appended or as text from a remote
    worker, keeps it findable (`write_failure`)."""


# ArrayRecord's writer reports OS errors as RuntimeError text ("write() failed: No space left on device; …")
_STRERRORS = {
    os.strerror(code).lower(): code for code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO, errno.EROFS)
}
_WRITE_FAILED = re.compile(r"OutputWriteError: (.+? writing \S+?)(?: \[while running|['\"]?$|['\"]?\n)")


def write_error(path: str, error: BaseException) -> OutputWriteError:
    """The one-line error for a failed write of `path`, from an OSError or ArrayRecord's text."""
    if isinstance(error, OSError) and error.errno:
        words = os.strerror(error.errno).lower()
    else:
        text = str(error).lower()
        words = next((w for w in _STRERRORS if w in text), f"{type(error).__name__}: {str(error)[:200]}")
    return OutputWriteError(f"{words} writing {path}")


def write_failure(error: BaseException | None) -> str | None:
    """The OutputWriteError message in `error` (or one it was raised from, or its text when a
    runner passed it on as text), None when it is no failed write."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OutputWriteError):
            return str(seen).split(" [while running")[0]
        found = _WRITE_FAILED.search(str(seen))
        if found:
            return found.group(1)
        seen = seen.__cause__ or seen.__context__
    return None


class _NoWriteFailureTracebacks(logging.Filter):
    """Beam logs a DoFn's exception with its traceback before re-raising it, in the worker and
    again where the runner receives it; a failed write is reported once, as one line, by the
    launcher (pipelines.tokenize.main)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return write_failure(record.exc_info[1] if record.exc_info else Exception(record.getMessage())) is None


BEAM_LOGGERS = (
    "apache_beam.runners.common",
    "apache_beam.runners.worker.sdk_worker",
    "apache_beam.runners.worker.bundle_processor",
    "apache_beam.runners.portability.local_job_service",
    "apache_beam.runners.portability.fn_api_runner.fn_runner",
)


def quiet_write_failures() -> None:
    """Install the filter on Beam's loggers of this process (the launcher; each worker's DoFn setup)."""
    for name in BEAM_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoWriteFailureTracebacks) for f in logger.filters):
            logger.addFilter(_NoWriteFailureTracebacks())


def _is_write_error(error: BaseException) -> bool:
    return isinstance(error, OSError) or any(w in str(error).lower() for w in _STRERRORS)


def shard_name(split: str, index: int, count: int) -> str:
    return f"{split}-{index:05d}-of-{count:05d}.arrayrecord"


def _commit(local_path: str, dest: str) -> str:
    """Copy a finished local file to `dest` through FileSystems via a temp name; return its sha256."""
    h = hashlib.sha256()
    tmp = f"{dest}{TMP_MARK}{uuid.uuid4().hex}"
    try:
        with (
            open(local_path, "rb") as src,
            FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as out,
        ):
            while chunk := src.read(COPY_CHUNK):
                h.update(chunk)
                out.write(chunk)
        FileSystems.rename([tmp], [dest])
    except Exception as e:
        _remove(tmp)  # the job's own temporary, never left filling the disk
        if _is_write_error(e):
            raise write_error(dest, e) from e
        raise
    return h.hexdigest()


def _remove(path: str) -> None:
    try:
        if "://" in path:
            FileSystems.delete([re.sub(r"([*?\[])", r"[\1]", path)])  # literal (outdir.glob_escape)
        elif os.path.lexists(path):
            os.remove(path)
    except Exception:  # noqa: BLE001 — best effort: the job's end (prune) or a rerun deletes it
        pass


def _local_write_error(local: str, dest: str, error: BaseException) -> BaseException:
    """A failed write of the local temporary file of `dest` (ArrayRecord or plain)."""
    if _is_write_error(error):
        return write_error(f"{local} (the local temporary file of {dest})", error)
    return error


def write_array_record(
    records: Iterable[bytes], dest: str, compression: str = DEFAULT_SHARD_COMPRESSION
) -> tuple[int, str]:
    """Write records as an ArrayRecord file at `dest` (any filesystem). Returns (records, sha256)."""
    options = writer_options(compression)
    fd, local = tempfile.mkstemp(suffix=".arrayrecord")
    os.close(fd)
    try:
        writer = ArrayRecordWriter(local, options)
        n = 0
        try:
            try:
                for rec in records:
                    writer.write(rec)
                    n += 1
            finally:
                writer.close()
        except RuntimeError as e:
            raise _local_write_error(local, dest, e) from e
        return n, _commit(local, dest)
    finally:
        os.unlink(local)


class ShardWriter:
    """One packing unit streamed into one shard: `add` documents, then `commit` or `discard`.

    Examples go to a local ArrayRecord file as the packer completes them, so memory holds one
    example plus one document whatever the shard's size; `commit(dest)` adds the PAD-filled last
    example and commits the file to `dest` (any filesystem) by copy-then-rename.
    """

    def __init__(
        self,
        seq_len: int,
        eos_id: int,
        pad_id: int,
        best_fit_window: int | None = None,
        compression: str = DEFAULT_SHARD_COMPRESSION,
    ):
        """best_fit_window: None packs by concat-and-chunk (`Packer`), a window (in sequences)
        by best-fit decreasing (`pipelines.bestfit.BestFitPacker`); compression: SHARD_COMPRESSIONS."""
        options = writer_options(compression)
        fd, self._local = tempfile.mkstemp(suffix=".arrayrecord")
        os.close(fd)
        self._writer = ArrayRecordWriter(self._local, options)
        self.packer: Packer | BestFitPacker = (
            Packer(seq_len, eos_id, pad_id)
            if best_fit_window is None
            else BestFitPacker(seq_len, eos_id, pad_id, best_fit_window)
        )
        self.records = 0

    def add(self, tokens: memoryview | np.ndarray | Iterable[int]) -> None:
        """tokens: one document's ids without EOS (anything `Packer.add` takes)."""
        for example in self.packer.add(tokens):
            self._write(example)

    def add_batch(self, ids: np.ndarray, offsets: np.ndarray) -> None:
        """Several documents: ids uint32 [N] and offsets [D+1] (see `Packer.add_batch`)."""
        for example in self.packer.add_batch(ids, offsets):
            self._write(example)

    def _write(self, example: bytes) -> None:
        try:
            self._writer.write(example)
        except RuntimeError as e:  # ArrayRecord's writer: its local file could not be written
            raise _local_write_error(self._local, "a shard", e) from e
        self.records += 1

    def commit(self, dest: str) -> dict:
        """Finish the shard and commit it at `dest`: its records, documents, tokens (with EOS),
        padding and sha256."""
        last = self.packer.finish()
        try:
            for example in [last] if isinstance(last, bytes) else (last or []):
                self._writer.write(example)
                self.records += 1
            self._writer.close()
        except RuntimeError as e:
            raise _local_write_error(self._local, dest, e) from e
        self._writer = None
        sha = _commit(self._local, dest)
        tokens = self.packer.tokens
        return {
            "records": self.records,
            "sha256": sha,
            "documents": self.packer.documents,
            "tokens": tokens,
            "padding": self.records * self.packer.seq_len - tokens,
        }

    def discard(self) -> None:
        """Drop the local file (after commit, or when the bundle fails)."""
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        if os.path.exists(self._local):
            os.unlink(self._local)


# Line breaks that json.dumps(ensure_ascii=False) leaves raw (it escapes only U+0000–U+001F) but
# that str.splitlines and other line readers split on: escaped, so one row is always one line.
_LINE_BREAKS = str.maketrans({"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"})


def jsonl_line(row: dict) -> bytes:
    """One JSON line: sorted keys, UTF-8, no character any line reader splits on, then b"\\n"."""
    return json.dumps(row, sort_keys=True, ensure_ascii=False).translate(_LINE_BREAKS).encode("utf-8") + b"\n"


def write_jsonl(rows: Iterable[dict], dest: str) -> tuple[int, str]:
    """Write JSON lines (`jsonl_line`) at `dest` with commit-by-rename. Returns (rows, sha256)."""
    fd, local = tempfile.mkstemp(suffix=".jsonl")
    n = 0
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                for row in rows:
                    f.write(jsonl_line(row))
                    n += 1
        except OSError as e:
            raise _local_write_error(local, dest, e) from e
        return n, _commit(local, dest)
    finally:
        os.unlink(local)


def write_bytes(data: bytes, dest: str) -> str:
    fd, local = tempfile.mkstemp()
    try:
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
        except OSError as e:
            raise _local_write_error(local, dest, e) from e
        return _commit(local, dest)
    finally:
        os.unlink(local)
