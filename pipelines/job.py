"""The tokenize-and-pack job graph (DoFns and `build`); the CLI is `pipelines.tokenize`.

Graph (one element per input file; no step depends on element or bundle order):
  files ─(dedup only) DocKeys: (text digest → source, id, file, line) ─GroupByKey─► PickKept:
        every copy but the smallest (source, id) → (file, line) to skip (side input) + duplicates/
  files ─TokenizeFile─► per file: read, validate, split by text digest, encode, pack and write
        its train and held-out shard (shard k of n = file k of the source's n files); rejects
  ─► Finalize: check accounting, write manifest.json last (after rejects/ and duplicates/).

Each input file is one packing unit per split and streams straight into its shard, so a worker
holds one document and one example at a time and the token ids never pass through a shuffle:
the job's memory does not grow with its input (the dedup pass shuffles small keys only).
"""
from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterable
from typing import NamedTuple

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import contract
from pipelines import manifest as mf
from pipelines import metrics
from pipelines.mixture import Mixture
from pipelines.read import REASONS, REJECTS_TAG, TALLY_TAG, Reject, UnreadableFile, read_file
from pipelines.shards import ShardWriter, remove_leftover_temps, remove_stale_shards, shard_name, write_bytes, write_jsonl
from pipelines.tokenizer import get_tokenizer, ordinary_ids
from pipelines.split import HELDOUT, SPLITS, TRAIN, choose_kept, heldout_threshold, is_heldout

DUPS_TAG = "duplicates"
REJECTS_DIR, DUPLICATES_DIR = "rejects", "duplicates"


class FileTask(NamedTuple):
    """One input file: file `index` of the `count` files of `source` (its shard number)."""

    source: str
    path: str
    index: int
    count: int


class Copy(NamedTuple):
    """Where one copy of a text is: what dedup compares (see `split.dedup_order`)."""

    source: str
    id: str
    file: str
    line: int


class DocKeys(beam.DoFn):
    """FileTask → (text digest, Copy) for every valid line (dedup pass; rejects are counted by
    TokenizeFile, which reads the same lines with the same `read_file`)."""

    def process(self, element: tuple):
        source, path, _index, _count = element
        keys = []  # one file's keys (~100 bytes a document), emitted only once the file has been read whole
        try:
            for doc in read_file(source, path):
                if not isinstance(doc, Reject):
                    keys.append((doc.digest, (source, doc.id, path, doc.line)))
        except UnreadableFile:
            return  # TokenizeFile rejects the whole file: none of its copies may be kept
        yield from keys


class PickKept(beam.DoFn):
    """(digest, copies of one text) → (file, line) of each copy to skip; duplicate rows + tallies."""

    def process(self, element: tuple[bytes, Iterable[tuple]]):
        _, copies = element
        kept, dups = choose_kept(Copy(*c) for c in copies)
        for d in dups:
            metrics.inc(d.source, "duplicates")
            yield d.file, d.line
            row = {"id": d.id, "file": d.file, "line": d.line, "kept": {"source": kept.source, "id": kept.id}}
            yield beam.pvalue.TaggedOutput(DUPS_TAG, (d.source, row))
            yield beam.pvalue.TaggedOutput(TALLY_TAG, ((d.source, "duplicates"), 1))


class TokenizeFile(beam.DoFn):
    """FileTask → this file's train and held-out shards, committed, and their descriptions.

    Every non-blank line is counted once: rejected (tagged output, with its reason), skipped as a
    duplicate (its line is in `skip`, from PickKept), or encoded as `encode_ordinary` does
    (special-token text stays text) and packed, in file order, into the shard of its split. A file
    that cannot be read to its end (corrupt or truncated compressed data) is rejected whole.
    """

    def __init__(self, tokenizer: str, heldout_fraction: float, output: str, seq_len: int, eos_id: int, pad_id: int):
        self._name, self._threshold = tokenizer, heldout_threshold(heldout_fraction)
        self._output, self._seq_len, self._eos, self._pad = output, seq_len, eos_id, pad_id

    def setup(self):
        self._encode = ordinary_ids(get_tokenizer(self._name))

    def _writers(self) -> dict[str, ShardWriter]:
        return {split: ShardWriter(self._seq_len, self._eos, self._pad) for split in SPLITS}

    def _pack(self, source: str, path: str, skip_lines: frozenset, writers: dict) -> tuple[Counter, list[Reject]]:
        """Read, validate, encode and pack one file into `writers`: (tally, rejects)."""
        tally: Counter[str] = Counter()
        rejects: list[Reject] = []
        encode, threshold = self._encode, self._threshold
        train, heldout = writers[TRAIN], writers[HELDOUT]
        skipped = 0
        for doc in read_file(source, path):  # UnreadableFile goes to process()
            tally["documents"] += 1
            if isinstance(doc, Reject):
                tally[f"rejected/{doc.reason}"] += 1
                rejects.append(doc)
            elif doc.line in skip_lines:
                skipped += 1  # counted as a duplicate by PickKept
            else:
                (heldout if is_heldout(doc.digest, threshold) else train).add(encode(doc.text))
        if skipped != len(skip_lines):
            raise RuntimeError(f"{path}: dedup chose {len(skip_lines)} lines to skip, {skipped} found")
        return tally, rejects

    def process(self, element: tuple, skip=None):
        source, path, index, count = element
        skip_lines = frozenset(skip[path]) if skip is not None else frozenset()  # multimap: [] if absent
        writers = self._writers()
        try:
            try:
                tally, rejects = self._pack(source, path, skip_lines, writers)
            except UnreadableFile as e:
                # Data read before a broken checksum may already be garbled, so the whole file is
                # rejected: one counted, written-down entry; its shards stay empty (numbering holds).
                logging.warning("%s: %s (at line %d): the whole file is rejected", path, e, e.line)
                for writer in writers.values():
                    writer.discard()
                writers = self._writers()
                tally = Counter({"documents": 1, "rejected/unreadable_file": 1})
                rejects = [Reject(source, path, e.line, "unreadable_file", None,
                                  f"{e}; the whole file is rejected ({e.line - 1} lines before it are not used)")]
            for split, writer in writers.items():
                name = shard_name(split, index, count)
                info = writer.commit(FileSystems.join(self._output, source, name))
                metrics.inc(source, f"tokens/{split}", info["tokens"])
                metrics.inc(source, f"examples/{split}", info["records"])
                yield {"source": source, "split": split, "index": index, "count": count,
                       "path": f"{source}/{name}", **info}
        finally:
            for writer in writers.values():
                writer.discard()
        for r in rejects:
            yield beam.pvalue.TaggedOutput(REJECTS_TAG, (source, r))
        for key, n in sorted(tally.items()):
            metrics.inc(source, key, n)
            yield beam.pvalue.TaggedOutput(TALLY_TAG, ((source, key), n))


def _write_side_file(element, output: str, subdir: str, sort_key) -> str:
    source, rows = element
    rows = sorted((r for r in rows if r is not None), key=sort_key)
    write_jsonl(rows, FileSystems.join(output, subdir, f"{source}.jsonl"))
    return f"{subdir}/{source}.jsonl"


def _finalize(_, mixture: dict, tokenizer: dict, tallies, shards, side_files, output: str) -> str:
    """Runs once after everything else: checks the accounting, writes manifest.json last."""
    del side_files  # a side input only so that this step waits for the side files
    manifest = mf.build_manifest(mixture, tokenizer, tallies, shards, reasons=REASONS)  # validated
    names = [s["name"] for s in mixture["sources"]]
    remove_leftover_temps(output, [*names, REJECTS_DIR, DUPLICATES_DIR])
    listed = [sh["path"] for e in manifest["sources"].values() for sp in e["splits"].values() for sh in sp["shards"]]
    remove_stale_shards(output, names, listed)
    write_bytes(contract.dumps(manifest), FileSystems.join(output, contract.MANIFEST_NAME))
    return manifest["fingerprint"]


def build(p: beam.Pipeline, mixture: Mixture, output: str) -> None:
    """Add the whole job to pipeline `p`. `mixture` must be resolved (globs expanded)."""
    if not mixture.files:
        raise ValueError("build() needs a resolved mixture (see pipelines.mixture.resolve)")
    tok = mf.tokenizer_info(mixture.tokenizer)
    names = [s.name for s in mixture.sources]
    tasks = [tuple(FileTask(s.name, f, k, len(files)))
             for s, files in zip(mixture.sources, mixture.files) for k, f in enumerate(files)]
    files = p | "Files" >> beam.Create(tasks) | "SpreadFiles" >> beam.Reshuffle()

    tally_parts, dup_rows, side = [], [], {}
    if mixture.dedup:
        picked = (
            files
            | "DocKeys" >> beam.ParDo(DocKeys())
            | "GroupCopies" >> beam.GroupByKey()
            | "Dedup" >> beam.ParDo(PickKept()).with_outputs(DUPS_TAG, TALLY_TAG, main="skip")
        )
        tally_parts.append(picked[TALLY_TAG])
        dup_rows.append(picked[DUPS_TAG])
        side["skip"] = beam.pvalue.AsMultiMap(picked.skip)
    written = files | "TokenizeFiles" >> beam.ParDo(
        TokenizeFile(mixture.tokenizer, mixture.heldout_fraction, output, mixture.seq_len, tok["eos_id"], tok["pad_id"]),
        **side,
    ).with_outputs(REJECTS_TAG, TALLY_TAG, main="shards")
    tally_parts.append(written[TALLY_TAG])

    def side_files(label: str, rows, subdir: str, sort_key):
        seeds = p | f"{label}Sources" >> beam.Create([(n, None) for n in names])
        return (
            (*rows, seeds)
            | f"{label}Flatten" >> beam.Flatten()
            | f"{label}Group" >> beam.GroupByKey()
            | f"{label}Write" >> beam.Map(_write_side_file, output, subdir, sort_key)
        )

    rejects_rows = written[REJECTS_TAG] | "RejectRows" >> beam.MapTuple(lambda s, r: (s, r.to_json()))
    side_written = (
        side_files("Rejects", [rejects_rows], REJECTS_DIR, lambda r: (r["file"], r["line"])),
        side_files("Duplicates", dup_rows, DUPLICATES_DIR, lambda r: (r["file"], r["line"], r["id"])),
    ) | "SideFiles" >> beam.Flatten()
    tallies = tuple(tally_parts) | "Tallies" >> beam.Flatten() | "SumTallies" >> beam.CombinePerKey(sum)

    _ = (
        p
        | "Once" >> beam.Create([None])
        | "Finalize" >> beam.Map(
            _finalize, mixture.to_dict(), tok, tallies=beam.pvalue.AsList(tallies),
            shards=beam.pvalue.AsList(written.shards), side_files=beam.pvalue.AsList(side_written), output=output,
        )
    )


def local_runner(options: PipelineOptions):
    """Beam's batch engine behind DirectRunner (FnApiRunner), set up as DirectRunner does.

    DirectRunner first tries the Prism runner, which downloads a binary; this job must run
    offline, so local runs go straight to FnApiRunner, which honours --direct_num_workers and
    --direct_running_mode (in_memory / multi_threading / multi_processing).
    """
    from apache_beam.portability.api import beam_provision_api_pb2
    from apache_beam.runners.portability.fn_api_runner import fn_runner
    from apache_beam.runners.portability.portable_runner import JobServiceHandle

    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    info = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    return fn_runner.FnApiRunner(provision_info=info)


# The DoFns above unpack FileTask and Copy tuples by position: keep the field orders fixed.
assert FileTask._fields == ("source", "path", "index", "count"), FileTask._fields
assert Copy._fields == ("source", "id", "file", "line"), Copy._fields
