"""Reading: one input file → validated documents or written-down rejects.

Files are opened through Beam's FileSystems (local, gs://, …) with the compression chosen by
extension (.gz, .zst, plain) and streamed line by line, so no worker ever holds a whole file.
Each non-blank line becomes a `Doc` or a `Reject` with a reason; blank lines are not documents.
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

import apache_beam as beam
from apache_beam.io.filesystem import CompressionTypes
from apache_beam.io.filesystems import FileSystems

from pipelines import metrics
from pipelines.split import text_digest

REJECTS_TAG = "rejects"
TALLY_TAG = "tally"
EXCERPT_CHARS = 200  # how much of a rejected line is kept in DIR/rejects for debugging
_BOM = "\ufeff"

# Every reason a line can be rejected for, in the order the checks run.
REASONS = (
    "invalid_utf8",  # the line's bytes are not UTF-8
    "invalid_json",  # not parseable as JSON
    "not_an_object",  # JSON, but not an object
    "missing_id",
    "id_not_string",
    "missing_text",
    "text_not_string",
    "empty_text",
    "invalid_unicode",  # text has lone surrogates (\ud800 escapes): not encodable as UTF-8
)


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
    """Validate one JSONL line. None for a blank line (not a document)."""
    if not raw.strip():
        return None

    def reject(reason: str, doc_id: str | None = None) -> Reject:
        excerpt = raw[: EXCERPT_CHARS * 4].decode("utf-8", "replace")[:EXCERPT_CHARS]
        return Reject(source, file, line_no, reason, doc_id, excerpt)

    try:
        line = raw.decode("utf-8")
    except UnicodeDecodeError:
        return reject("invalid_utf8")
    if line_no == 1 and line.startswith(_BOM):
        line = line[1:]
    try:
        obj = json.loads(line)
    except ValueError:
        return reject("invalid_json")
    if not isinstance(obj, dict):
        return reject("not_an_object")
    if "id" not in obj:
        return reject("missing_id")
    doc_id = obj["id"]
    if not isinstance(doc_id, str):
        return reject("id_not_string")
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


def open_lines(path: str) -> Iterator[bytes]:
    """Stream a file's lines (split on b"\\n" only) through FileSystems, decompressing by extension."""
    compression = CompressionTypes.detect_compression_type(path)
    with FileSystems.open(path, compression_type=compression) as f:
        while True:
            line = f.readline()
            if not line:
                return
            yield line


class ReadDocuments(beam.DoFn):
    """(source, path) → Doc tuples on the main output; Reject and per-file tallies on tagged outputs.

    Tallies are ((source, counter), n) pairs: counter "documents" (every non-blank line) and
    "rejected/<reason>". Summed over the job they give the manifest's input-side counts.
    """

    def process(self, element: tuple[str, str]):
        source, path = element
        tally: Counter[str] = Counter()
        line_no = 0
        for line_no, raw in enumerate(open_lines(path), start=1):
            item = parse_line(source, path, line_no, raw)
            if item is None:
                continue
            tally["documents"] += 1
            if isinstance(item, Reject):
                tally[f"rejected/{item.reason}"] += 1
                yield beam.pvalue.TaggedOutput(REJECTS_TAG, (source, item))
            else:
                yield tuple(item)  # a plain tuple: Beam encodes it natively (Doc(*t) rebuilds it)
        for key, n in sorted(tally.items()):
            metrics.inc(source, key, n)
            yield beam.pvalue.TaggedOutput(TALLY_TAG, ((source, key), n))
