"""Reading: one input file → validated documents or written-down rejects.

Files are opened through Beam's FileSystems (local, gs://, …) with the compression chosen by
extension as Beam chooses it (.gz, .zst/.zstd, .bz2, .xz/.lzma, .deflate, else plain) and streamed
line by line, so no worker ever holds a whole file.
Each non-blank line becomes a `Doc` or a `Reject` with a reason; blank lines are not documents.
"""

from __future__ import annotations

import bz2
import json
import lzma
import os
import stat
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, NamedTuple, Protocol

import orjson
import zstandard
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from contract import JSONL_REASONS
from contract.errors import Refused
from pipelines.split import text_digest

REJECTS_TAG = "rejects"
TALLY_TAG = "tally"
READ_CHUNK = 1 << 20  # bytes per read of an input file
EXCERPT_CHARS = 200  # how much of a rejected line is kept in DIR/rejects for debugging
# Longest line read, in bytes (without its newline). Dolma's longest documents (whole books) are
# tens of MB; a line is held once as bytes, once as text (up to 4 bytes a character) and once as
# token ids, so 256 MiB keeps a worker under ~2 GiB where an unbounded line (a file with no
# newline at all) would end the job with a MemoryError. Longer lines are read past, not held.
MAX_LINE_BYTES = 1 << 28
_BOM = "\ufeff"

# Every reason a line can be rejected for, in the order the checks run: the contract's list.
REASONS = JSONL_REASONS


class LongLine(bytes):
    """What `open_lines` yields for a line over the limit: its first bytes only."""


class Doc(NamedTuple):
    """A valid document. A NamedTuple so `tuple(doc)` crosses Beam shuffles with Beam's fast
    primitive coder instead of pickle."""

    source: str
    id: str
    text: str
    file: str
    line: int  # 1-based
    digest: bytes  # sha256 of the UTF-8 text: held-out split, dedup and shard assignment


@dataclass(frozen=True)
class Reject:
    source: str
    file: str
    line: int
    reason: str
    id: str | None
    excerpt: str

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "reason": self.reason, "id": self.id, "excerpt": self.excerpt}


def parse_line(source: str, file: str, line_no: int, raw: bytes) -> Doc | Reject | None:
    """Validate one JSONL line. None for a blank line (not a document).

    Fast path: orjson accepts only strict, valid-UTF-8 JSON (no lone surrogates), a subset of
    what the standard library accepts with the same result, so a line it parses into an object
    with a string id and a non-empty string text is a valid document. Anything else takes the
    standard-library path, which names the exact reason (or accepts, e.g. a line-1 BOM).
    """
    if type(raw) is LongLine:
        return Reject(source, file, line_no, "line_too_long", None, _excerpt(raw))
    if not raw or raw.isspace():
        return None
    try:
        obj = orjson.loads(raw)
    except orjson.JSONDecodeError:
        pass
    else:
        if type(obj) is dict:
            doc_id, text = obj.get("id"), obj.get("text")
            if type(doc_id) is str and type(text) is str and text:
                return Doc(source, doc_id, text, file, line_no, text_digest(text))
    return _parse_strictly(source, file, line_no, raw)


def _excerpt(raw: bytes) -> str:
    return raw[: EXCERPT_CHARS * 4].decode("utf-8", "replace")[:EXCERPT_CHARS]


def _parse_strictly(source: str, file: str, line_no: int, raw: bytes) -> Doc | Reject:
    def reject(reason: str, doc_id: str | None = None) -> Reject:
        return Reject(source, file, line_no, reason, doc_id, _excerpt(raw))

    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return reject("invalid_utf8")
    if line_no == 1 and line.startswith(_BOM):
        line = line[1:]
    try:
        obj = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than Python's stack
        return reject("invalid_json")
    if not isinstance(obj, dict):
        return reject("not_an_object")
    if "id" not in obj:
        return reject("missing_id")
    doc_id = obj["id"]
    if not isinstance(doc_id, str):
        return reject("id_not_string")
    if not _utf8_encodable(doc_id):  # every string the job writes is checked (text: by its digest)
        return reject("id_invalid_unicode")
    if "text" not in obj:
        return reject("missing_text", doc_id)
    text = obj["text"]
    if not isinstance(text, str):
        return reject("text_not_string", doc_id)
    if not text:
        return reject("empty_text", doc_id)
    try:
        digest = text_digest(text)
    except UnicodeEncodeError:
        return reject("invalid_unicode", doc_id)
    return Doc(source, doc_id, text, file, line_no, digest)


def _utf8_encodable(s: str) -> bool:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


class UnreadableFile(Refused, ValueError):
    """An input file cannot be read to its end: corrupt or truncated compressed data, or (local
    files) not a regular file or not readable when the worker opens it."""

    line: int = 0  # the first line that could not be read (set by read_file)


class _Decompressor(Protocol):
    """What `_decompressed` reads of zlib's, bz2's, lzma's and zstandard's decompressor objects."""

    @property
    def eof(self) -> bool: ...
    @property
    def unused_data(self) -> bytes: ...
    def decompress(self, data: bytes, /) -> bytes: ...


def _decompressor(kind: str) -> _Decompressor:
    """A fresh decompressor for one member/frame/stream of `kind`, in the format Beam's
    CompressedFile reads for that extension."""
    if kind == CompressionTypes.GZIP:
        return zlib.decompressobj(wbits=31)  # gzip framing, with its CRC and length checks
    if kind == CompressionTypes.DEFLATE:
        return zlib.decompressobj()  # zlib framing (Beam's .deflate), with its Adler-32 check
    if kind == CompressionTypes.BZIP2:
        return bz2.BZ2Decompressor()  # per-block and stream CRCs
    if kind == CompressionTypes.LZMA:
        return lzma.LZMADecompressor()  # .xz (checked: CRC64 by default) or legacy .lzma
    return zstandard.ZstdDecompressor().decompressobj()


# Every compression Beam detects by extension is read by `_decompressed` (none by Beam's reader).
OUR_COMPRESSIONS = (
    CompressionTypes.GZIP,
    CompressionTypes.ZSTD,
    CompressionTypes.BZIP2,
    CompressionTypes.LZMA,
    CompressionTypes.DEFLATE,
)
# What the decompressors raise on data that is not theirs or is damaged (bz2: OSError).
_CORRUPT = (zlib.error, zstandard.ZstdError, lzma.LZMAError, OSError, EOFError)


# NUL bytes the reference tool accepts after a member/stream ends (zstd(1), legacy .lzma and zlib
# framing: none). xz: Stream Padding, a multiple of 4 bytes, between or after .xz streams (xz -t
# checks both); gzip(1) and bzip2(1): trailing zeros at the end of the file (data after them is
# "trailing garbage", which they ignore with a warning and we reject: it may be a member they drop).
_PADDING = {CompressionTypes.GZIP: "end", CompressionTypes.BZIP2: "end"}
_XZ_MAGIC = b"\xfd7zXZ\x00"  # an .xz stream's header (the LZMA kind also reads legacy .lzma)
_XZ_PADDING_UNIT = 4  # bytes: the .xz format's Stream Padding granularity


def _padding_error(kind: str, head: bytes, pad: int, at_end: bool) -> UnreadableFile | None:
    """Why `pad` NUL bytes after a complete member/stream make the file unreadable (None: they
    are valid padding); `head`: the file's first bytes; `at_end`: nothing follows them."""
    rule = "between" if kind == CompressionTypes.LZMA and head.startswith(_XZ_MAGIC) else _PADDING.get(kind)
    if pad and rule is None:
        return UnreadableFile(f"corrupt {kind} data: {pad} NUL byte(s) after a complete frame/stream")
    if rule == "between" and pad % _XZ_PADDING_UNIT:
        return UnreadableFile(
            f"corrupt {kind} data: stream padding of {pad} NUL byte(s) is not a multiple of {_XZ_PADDING_UNIT}"
        )
    if rule == "end" and pad and not at_end:
        return UnreadableFile(f"corrupt {kind} data: data after the {pad} trailing NUL byte(s) that follow a member")
    return None


def _decompressed(f: BinaryIO, kind: str, chunk_bytes: int) -> Iterator[bytes]:
    """Decompress a gzip/zstd/bzip2/xz/deflate stream chunk by chunk, across concatenated
    members/frames/streams, and the NUL padding its reference tool accepts after one (`_PADDING`).

    By hand (with the standard library's zlib/bz2/lzma and zstandard) because Beam's
    compressed-file reader ends a truncated file silently, as if it were shorter (and lets a
    decompressor's error escape as a crash): here a stream that stops inside a member or frame,
    or corrupt data, raises UnreadableFile. (Corruption inside a zstd frame is detectable only
    when the frame has a checksum, as the zstd command line writes by default; otherwise
    garbled lines come out and are rejected line by line.)
    """
    d, inside, ended, pad = _decompressor(kind), False, False, 0  # ended: a member/stream is complete
    head = b""
    while raw := f.read(chunk_bytes):  # read errors are not caught here: see open_lines
        head += raw[: len(_XZ_MAGIC) - len(head)]
        while raw:
            if ended and not inside:  # between members: NUL padding, or the next member
                rest = raw.lstrip(b"\0")
                pad += len(raw) - len(rest)
                if not rest:
                    break
                if error := _padding_error(kind, head, pad, at_end=False):
                    raise error
                raw, pad = rest, 0
            inside = True
            try:
                out = d.decompress(raw)
            except _CORRUPT as e:
                raise UnreadableFile(f"corrupt {kind} data: {e}") from e
            if out:
                yield out
            if not d.eof:
                break
            raw, d, inside, ended = d.unused_data, _decompressor(kind), False, True  # next member / frame
    if inside:
        raise UnreadableFile(f"{kind} stream ends inside a member/frame: the file is truncated")
    if error := _padding_error(kind, head, pad, at_end=True):
        raise error


def read_file(source: str, path: str) -> Iterator[Doc | Reject]:
    """Each non-blank line of a file, in order, as a `Doc` or a `Reject` (each knows its line).
    Raises UnreadableFile with `.line` = the first line that could not be read."""
    line_no = 0
    try:
        for line_no, raw in enumerate(open_lines(path), start=1):
            item = parse_line(source, path, line_no, raw)
            if item is not None:
                yield item
    except UnreadableFile as e:
        e.line = line_no + 1
        raise


def open_lines(path: str, chunk_bytes: int = READ_CHUNK, max_line_bytes: int | None = None) -> Iterator[bytes]:
    """Stream a file's lines through FileSystems, decompressing by extension (see OUR_COMPRESSIONS).

    Lines are split on b"\\n" only and keep it (the last line may lack it). Reads go in
    `chunk_bytes` blocks split in C: Beam's compressed-file `readline` runs a Python loop per line.
    A line longer than `max_line_bytes` (default MAX_LINE_BYTES) comes out as a `LongLine` of its
    first bytes; the rest of it is read and dropped, so memory stays bounded whatever the input.
    Raises UnreadableFile where the data stops being readable (lines before it may have come out,
    and are not to be trusted: a checksum is checked only at the end of a member/frame).
    """
    kind = CompressionTypes.detect_compression_type(path)
    ours = kind in OUR_COMPRESSIONS
    limit = MAX_LINE_BYTES if max_line_bytes is None else max_line_bytes
    if "://" not in path:  # local: `resolve` checked it, but it may have changed since
        try:
            yield from _lines(path, kind, ours, chunk_bytes, limit)
        except OSError as e:  # permission denied, a directory, an I/O error while reading
            raise UnreadableFile(f"cannot read the file: {e.strerror or e}") from e
    else:  # remote errors are the runner's to retry, or a clear failure
        yield from _lines(path, kind, ours, chunk_bytes, limit)


def _head(parts: list[bytes]) -> LongLine:
    """The first bytes of the line in `parts` (enough for an excerpt), without joining it all."""
    want, out = EXCERPT_CHARS * 4, bytearray()
    for p in parts:
        out += p[: want - len(out)]
        if len(out) >= want:
            break
    return LongLine(out)


def _split_long(block: bytes, limit: int) -> Iterator[bytes]:
    """Complete lines of a `block` longer than `limit` (lines joined by b"\\n", the last one's
    newline cut off): the over-long ones as their `_head`."""
    for line in block.split(b"\n"):
        yield line + b"\n" if len(line) <= limit else _head([line])


def _lines(path: str, kind: str, ours: bool, chunk_bytes: int, limit: int) -> Iterator[bytes]:
    if "://" not in path and not stat.S_ISREG(os.stat(path).st_mode):
        # checked before opening: opening a FIFO would block until someone writes to it
        raise UnreadableFile("not a regular file (a directory, FIFO, socket or device)")
    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED if ours else kind) as f:
        chunks = _decompressed(f, kind, chunk_bytes) if ours else iter(lambda: f.read(chunk_bytes), b"")
        parts: list[bytes] = []  # the unfinished line (a list: a huge line is joined only once)
        pending = 0  # its length
        skipping: LongLine | None = None  # the head of an over-long line being read past
        for chunk in chunks:
            end = chunk.rfind(b"\n")
            if end < 0:
                if skipping is None:
                    parts.append(chunk)
                    pending += len(chunk)
                    if pending > limit:
                        skipping, parts, pending = _head(parts), [], 0
                continue
            if skipping is not None:  # the over-long line ends in this chunk
                first = chunk.find(b"\n")
                yield skipping
                skipping = None
                block = chunk[first + 1 : end] if first < end else None
            else:
                parts.append(chunk[:end])
                block = b"".join(parts)
            if block is None:
                pass
            elif len(block) <= limit:  # the common case, kept as lean as before: no line can be too long
                for line in block.split(b"\n"):
                    yield line + b"\n"
            else:
                yield from _split_long(block, limit)
            parts = [chunk[end + 1 :]]
            pending = len(parts[0])
        if skipping is not None:
            yield skipping
        elif pending > limit:
            yield _head(parts)
        elif tail := b"".join(parts):
            yield tail
