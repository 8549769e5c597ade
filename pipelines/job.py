"""The tokenize-and-pack job graph (DoFns and `build`); the CLI is `pipelines.tokenize`.

Graph (one element per input file; no step depends on element or bundle order):
  files ─(dedup only) DocKeys: (text digest → source, id, file, line) ─GroupByKey─► PickKept:
        every copy but the smallest (source, id) → (file, line) to skip (side input) + duplicates/
        (a copy in a `split: heldout` source is kept first)
  files ─TokenizeFile─► per file: read, validate, split by text digest (or by the source's
        `split`), encode, pack and write its train and held-out shard (shard k of n = file k of
        the source's n files); rejects
  token files (`format: tokens`) ─ConvertTokenFile─► per file: its instances as one shard of the
        source's split, the other split's shard empty (pipelines.token_files); no text, so no dedup;
        with best-fit packing ─PackTokenFiles─► per group of files one shard (pipelines.token_bestfit)
  ─► Finalize: check accounting, write manifest.json last (after rejects/ and duplicates/).

Each input file is one packing unit per split and streams straight into its shard, so a worker
holds one batch of documents (`ENCODE_BATCH_CHARS` of text, or one larger document) and one
example at a time and the token ids never pass through a shuffle: the job's memory does not grow
with its input (the dedup pass shuffles small keys only).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple, NoReturn

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import GoogleCloudOptions, TestOptions

import contract
from contract import HELDOUT, SPLITS, TRAIN
from contract.manifest import JSONL, TOKENS
from pipelines import beam_metrics as metrics
from pipelines import decontaminate as decon
from pipelines import dolma2_tokenizer as tk
from pipelines import manifest_assembly as mf
from pipelines import token_job
from pipelines.leakage import Detector, DetectorConfig, LeakIndex, fetch, ship
from pipelines.mixture import Mixture
from pipelines.outdir import DUPLICATES_DIR, MARKER_NAME, REJECTS_DIR, dropped_sources, marker_bytes, prune
from pipelines.progress import Meter
from pipelines.read import EXCERPT_CHARS, REASONS, REJECTS_TAG, TALLY_TAG, Doc, Reject, UnreadableFile, read_file
from pipelines.shards import (
    DEFAULT_SHARD_COMPRESSION,
    ShardWriter,
    quiet_write_failures,
    shard_name,
    write_bytes,
    write_jsonl,
)
from pipelines.split import choose_kept, heldout_threshold, is_heldout

DUPS_TAG = "duplicates"
CROSSCHECKED = "crosschecked"  # the tally of documents also encoded with tiktoken (manifest `build`)
ALL_HELDOUT = 1 << 64  # is_heldout(digest, ALL_HELDOUT) for every 8-byte digest prefix
# Characters of text per engine call: amortises the call over many documents; memory stays
# bounded by this plus the largest document.
ENCODE_BATCH_CHARS = 1 << 20


class FileTask(NamedTuple):
    """One input file: file `index` of the `count` files of `source` (its shard number)."""

    source: str
    path: str
    index: int  # type: ignore[assignment]  # shadows tuple.index (no caller uses the method)
    count: int  # type: ignore[assignment]  # shadows tuple.count (no caller uses the method)


class Copy(NamedTuple):
    """Where one copy of a text is: what dedup compares (see `split.dedup_order`)."""

    source: str
    id: str
    file: str
    line: int


class DocKeys(beam.DoFn):
    """FileTask → (text digest, Copy) for every valid line (dedup pass; rejects are counted by
    TokenizeFile, which reads the same lines with the same `read_file`)."""

    def __init__(self, meter: Meter | None = None):
        self._meter = meter or Meter(None)  # documents read, for the progress line

    # Any: Beam reads the annotations as its PCollections' types (and picks their coders by them)
    def process(self, element: tuple) -> Iterator[Any]:
        source, path, _index, _count = element
        keys = []  # one file's keys (~100 bytes a document), emitted only once the file has been read whole
        n = 0
        try:
            for doc in read_file(source, path):
                n += 1
                if n % 1024 == 0:  # the meter's dictionary update, not once a document
                    self._meter.add(keyed=1024)
                if not isinstance(doc, Reject):
                    keys.append((doc.digest, (source, doc.id, path, doc.line)))
        except UnreadableFile:
            keys = []  # TokenizeFile rejects the whole file: none of its copies may be kept
        self._meter.add(keyed=n % 1024)
        yield from keys

    def finish_bundle(self) -> None:
        self._meter.flush()


class PickKept(beam.DoFn):
    """(digest, copies of one text) → (file, line) of each copy to skip; duplicate rows + tallies."""

    def __init__(self, heldout_sources: frozenset[str] = frozenset()):
        self._heldout = frozenset(heldout_sources)

    # Any: Beam reads the annotations as its PCollections' types (and picks their coders by them)
    def process(self, element: tuple[bytes, Iterable[tuple]]) -> Iterator[Any]:
        _, copies = element
        kept, dups = choose_kept((Copy(*c) for c in copies), self._heldout)
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
    Documents are encoded in batches (`ENCODE_BATCH_CHARS`) by the `engine`, checked at set-up
    (`tokenizer.check_engine`); a content-hash sample (`crosscheck`: a share or "all") is also
    encoded with tiktoken, and any difference fails the job (TokenizerMismatch), never a reject.
    """

    def __init__(
        self,
        tokenizer: str,
        heldout_fraction: float,
        output: str,
        seq_len: int,
        eos_id: int,
        pad_id: int,
        source_splits: dict[str, str] | None = None,
        engine: str = tk.DEFAULT_ENGINE,
        crosscheck: float | str = tk.DEFAULT_CROSSCHECK,
        engine_version: str | None = None,
        leak: tuple[LeakIndex | str, DetectorConfig] | None = None,
        meter: Meter | None = None,
        best_fit_window: int | None = None,
        compression: str = DEFAULT_SHARD_COMPRESSION,
    ) -> None:
        self._name, self._threshold = tokenizer, heldout_threshold(heldout_fraction)
        # `split: train|heldout` sources: every digest is below 2**64 (all held out) or 0 (none)
        self._thresholds = {s: (ALL_HELDOUT if split == HELDOUT else 0) for s, split in (source_splits or {}).items()}
        self._output, self._seq_len, self._eos, self._pad = output, seq_len, eos_id, pad_id
        self._engine_name, self._engine_version = engine, engine_version
        # checking an engine against itself proves nothing: tiktoken is never cross-checked
        self._check = 0 if engine == tk.REFERENCE_ENGINE else tk.crosscheck_threshold(crosscheck)
        self._leak = leak  # (LeakIndex, DetectorConfig): reject contaminated training documents
        self._detector: Any = None  # pipelines.leakage.Detector, built in setup
        self._meter = meter or Meter(None)  # documents and files done, for the progress line
        self._best_fit = best_fit_window  # None: concat-and-chunk; else best-fit over this window
        self._compression = compression  # the shards' (pipelines.shards.SHARD_COMPRESSIONS)

    def setup(self) -> None:
        quiet_write_failures()  # a full disk: one line from the launcher, no traceback per worker
        self._num_ranks = tk.vocabulary(
            self._name
        ).num_ranks  # the vocabulary the ids belong to (raises for unknown names)
        self._engine = tk.get_engine(self._engine_name, self._name)  # refuses a wrong vocabulary (VocabularyError)
        if self._engine_version is not None and self._engine.version != self._engine_version:
            # the manifest records the launcher's version: a worker with another one would make it lie
            raise tk.VocabularyError(
                f"engine {self._engine_name} is version {self._engine.version} on this "
                f"worker, {self._engine_version} where the job was launched"
            )
        self._reference = tk.ordinary_ids(tk.get_tokenizer(self._name))
        if self._leak is not None:  # built once per worker from the index the launcher built (or its file)
            self._detector = Detector.shared(fetch(self._leak[0]), self._leak[1])

    def finish_bundle(self) -> None:
        self._meter.flush()

    def _writers(self) -> dict[str, ShardWriter]:
        return {
            split: ShardWriter(self._seq_len, self._eos, self._pad, self._best_fit, self._compression)
            for split in SPLITS
        }

    def _pack(self, source: str, path: str, skip_lines: frozenset, writers: dict) -> tuple[Counter, list[Reject]]:
        """Read, validate, encode and pack one file into `writers`: (tally, rejects)."""
        tally: Counter[str] = Counter()
        rejects: list[Reject] = []
        threshold = self._thresholds.get(source, self._threshold)
        pending: dict[str, list] = {split: [] for split in SPLITS}  # documents not yet encoded, in file order
        train, heldout = pending[TRAIN], pending[HELDOUT]
        skipped = chars = checked = 0
        for doc in read_file(source, path):  # UnreadableFile goes to process()
            tally["documents"] += 1
            if isinstance(doc, Reject):
                tally[f"rejected/{doc.reason}"] += 1
                rejects.append(doc)
            elif doc.line in skip_lines:
                skipped += 1  # counted as a duplicate by PickKept
            else:
                (heldout if is_heldout(doc.digest, threshold) else train).append(doc)
                chars += len(doc.text)
                if chars >= ENCODE_BATCH_CHARS:
                    checked += self._encode_into(pending, writers, tally, rejects)
                    chars = 0
        checked += self._encode_into(pending, writers, tally, rejects)
        if self._engine_name != tk.REFERENCE_ENGINE:  # exactness evidence for the manifest: not accounting
            tally[CROSSCHECKED] = checked
        if skipped != len(skip_lines):
            raise RuntimeError(f"{path}: dedup chose {len(skip_lines)} lines to skip, {skipped} found")
        return tally, rejects

    def _encode_into(
        self, pending: dict[str, list], writers: dict[str, ShardWriter], tally: Counter[str], rejects: list[Reject]
    ) -> int:
        """Encode each split's pending documents in one engine call, check them, pack them (with
        `decontaminate`, training documents holding a task instance are rejected instead); empty
        the lists. Returns how many were cross-checked against tiktoken."""
        checked = 0
        for split, docs in pending.items():
            if not docs:
                continue
            ids, offsets = self._engine.encode_batch([d.text for d in docs])
            if ids.size and int(ids.max()) >= self._num_ranks:  # a special id from text: never valid
                bad = int(np.flatnonzero(ids >= self._num_ranks)[0])
                d = int(np.searchsorted(offsets, bad, side="right")) - 1
                self._fail(docs[d], ids[offsets[d] : offsets[d + 1]])
            for k, doc in enumerate(docs):
                if tk.is_crosschecked(doc.digest, self._check):
                    checked += 1
                    got = ids[offsets[k] : offsets[k + 1]]
                    if tk.first_difference(got, np.frombuffer(self._reference(doc.text), np.uint32)) is not None:
                        self._fail(doc, got)
            if self._detector is not None and split == TRAIN:
                ids, offsets, found = decon.split_contaminated(self._detector, ids, offsets)
                for k, reason in sorted(found.items()):
                    d = docs[k]
                    tally[f"rejected/{reason}"] += 1
                    rejects.append(Reject(d.source, d.file, d.line, reason, d.id, d.text[:EXCERPT_CHARS]))
            writers[split].add_batch(ids, offsets)
            self._meter.add(documents=len(docs))
            docs.clear()
        return checked

    def _fail(self, doc: Doc, got: np.ndarray) -> NoReturn:
        """Stop the job: this document's ids (`got`) are not tiktoken's."""
        want = np.frombuffer(self._reference(doc.text), np.uint32)
        at = tk.first_difference(got, want)
        at = 0 if at is None else at  # not reached: tiktoken never gives a special id for text
        raise tk.TokenizerMismatch(
            tk.mismatch_message(self._engine_name, doc.file, doc.line, doc.id, doc.text, got, want, at, self._name)
        )

    # Any: Beam reads the annotations as its PCollections' types (and picks their coders by them)
    def process(self, element: tuple, skip: Any = None) -> Iterator[Any]:
        # skip: PickKept's side input, {path: the lines to skip} (a multimap); None: no dedup pass
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
                rejects = [
                    Reject(
                        source,
                        path,
                        e.line,
                        "unreadable_file",
                        None,
                        f"{e}; the whole file is rejected ({e.line - 1} lines before it are not used)",
                    )
                ]
            for split, writer in writers.items():
                name = shard_name(split, index, count)
                info = writer.commit(FileSystems.join(self._output, source, name))
                metrics.inc(source, f"tokens/{split}", info["tokens"])
                metrics.inc(source, f"examples/{split}", info["records"])
                yield {
                    "source": source,
                    "split": split,
                    "index": index,
                    "count": count,
                    "path": f"{source}/{name}",
                    **info,
                }
        finally:
            for writer in writers.values():
                writer.discard()
        self._meter.add(files=1)
        for r in rejects:
            yield beam.pvalue.TaggedOutput(REJECTS_TAG, (source, r))
        for key, n in sorted(tally.items()):
            metrics.inc(source, key, n)
            yield beam.pvalue.TaggedOutput(TALLY_TAG, ((source, key), n))


# Any (here and in _finalize): Beam checks its inputs against the annotations of a function it maps
def _write_side_file(element: Any, output: str, subdir: str, sort_key: Any) -> str:
    """(source, its rows: None the seed that makes an empty file) → DIR/subdir/source.jsonl, the rows
    sorted by `sort_key`; its path in DIR."""
    source, rows = element
    rows = sorted((r for r in rows if r is not None), key=sort_key)
    write_jsonl(rows, FileSystems.join(output, subdir, f"{source}.jsonl"))
    return f"{subdir}/{source}.jsonl"


def _finalize(
    _: Any,
    mixture: dict,
    tokenizer: dict,
    tallies: Any,
    shards: Any,
    side_files: Any,
    output: str,
    previous: Any = (),
    build: dict | None = None,
) -> str:
    """Runs once after everything else: checks the accounting, deletes what earlier runs left
    (only the job's own names: `outdir.prune`; `previous`: the sources an earlier run wrote
    there), writes manifest.json last."""
    del side_files  # a side input only so that this step waits for the side files
    if build is not None and build.get("crosscheck") is not None:  # how many documents were, per source
        checked = {s["name"]: 0 for s in mixture["sources"] if s.get("format") != TOKENS}
        checked.update((source, n) for (source, key), n in tallies if key == CROSSCHECKED)
        build = {**build, "crosscheck": {**build["crosscheck"], "documents": checked}}
    tallies = [t for t in tallies if t[0][1] != CROSSCHECKED]
    contaminated = decon.reasons(mixture.get("decontaminate"))
    reasons = {
        s["name"]: contract.TOKEN_FILE_REASONS if s.get("format") == TOKENS else REASONS + contaminated
        for s in mixture["sources"]
    }
    manifest = mf.build_manifest(mixture, tokenizer, tallies, shards, reasons=reasons)  # validated
    if build is not None:
        manifest["build"] = build  # how the ids were computed: outside the fingerprint
    names = [s["name"] for s in mixture["sources"]]
    listed = [sh["path"] for e in manifest["sources"].values() for sp in e["splits"].values() for sh in sp["shards"]]
    prune(output, names, listed, dropped_sources(previous, names, output))  # after the side files
    write_bytes(marker_bytes(names), FileSystems.join(output, MARKER_NAME))
    write_bytes(contract.dumps(manifest), FileSystems.join(output, contract.MANIFEST_NAME))
    return manifest["fingerprint"]


class _Parts(NamedTuple):
    """The collections that meet at the end of the graph: the tallies, shard descriptions, rejects
    and duplicates rows of each branch (tokenize, token files, dedup)."""

    tallies: list[beam.PCollection]
    shards: list[beam.PCollection]
    rejects: list[beam.PCollection]
    duplicates: list[beam.PCollection]


def _tasks(mixture: Mixture, fmt: str) -> list[tuple]:
    """One FileTask (as a plain tuple) per input file of the sources of format `fmt`."""
    return [
        tuple(FileTask(s.name, f, k, len(files)))
        for s, files in zip(mixture.sources, mixture.files)
        if s.format == fmt
        for k, f in enumerate(files)
    ]


def _convert_token_files(
    p: beam.Pipeline, mixture: Mixture, output: str, tok: dict, heldout: frozenset[str], parts: _Parts
) -> None:
    """The token files (`format: tokens`, pipelines.token_job): no text, no dedup: one file → one
    shard, as it is, or best-fit per group of files."""
    converted = token_job.convert_token_files(p, mixture, output, tok, heldout)
    if converted is None:
        return
    parts.tallies.append(converted[TALLY_TAG])
    parts.shards.append(converted.shards)
    parts.rejects.append(converted[REJECTS_TAG])


def _dedup(files: beam.PCollection, heldout: frozenset[str], progress: str | None, parts: _Parts) -> dict[str, Any]:
    """The dedup pass: each document's text digest grouped, every copy but the kept one to skip →
    TokenizeFile's side input {"skip": …} (the duplicates rows into `parts`)."""
    picked = (
        files
        | "DocKeys" >> beam.ParDo(DocKeys(Meter(progress)))
        | "GroupCopies" >> beam.GroupByKey()
        | "Dedup" >> beam.ParDo(PickKept(heldout)).with_outputs(DUPS_TAG, TALLY_TAG, main="skip")
    )
    parts.tallies.append(picked[TALLY_TAG])
    parts.duplicates.append(picked[DUPS_TAG])
    return {"skip": beam.pvalue.AsMultiMap(picked.skip)}


def _side_files(
    p: beam.Pipeline, names: list[str], output: str, parts: _Parts, rejected: beam.PCollection
) -> beam.PCollection:
    """rejects/<source>.jsonl and duplicates/<source>.jsonl, one per source (empty ones too) → their
    paths (Finalize waits for them)."""

    def side_files(
        label: str, rows: Iterable[beam.PCollection], subdir: str, sort_key: Callable[[dict[str, Any]], Any]
    ) -> beam.PCollection:
        seeds = p | f"{label}Sources" >> beam.Create([(n, None) for n in names])
        return (
            (*rows, seeds)
            | f"{label}Flatten" >> beam.Flatten()
            | f"{label}Group" >> beam.GroupByKey()
            | f"{label}Write" >> beam.Map(_write_side_file, output, subdir, sort_key)
        )

    rejects_rows = rejected | "RejectRows" >> beam.MapTuple(lambda s, r: (s, r.to_json()))
    return (
        side_files("Rejects", [rejects_rows], REJECTS_DIR, lambda r: (r["file"], r["line"])),
        side_files("Duplicates", parts.duplicates, DUPLICATES_DIR, lambda r: (r["file"], r["line"], r["id"])),
    ) | "SideFiles" >> beam.Flatten()


def _leak_index(
    p: beam.Pipeline, mixture: Mixture
) -> tuple[tuple[LeakIndex | str, DetectorConfig] | None, dict[str, Any]]:
    """(what TokenizeFile carries of the eval-leakage index: the index, or with --temp_location its
    file shipped there; None without decontaminate), the mixture as the manifest records it (with
    the decontaminate record). The index is built once here (refused: exit 2)."""
    leak, record = decon.prepare(mixture)
    temp = p.options.view_as(GoogleCloudOptions).temp_location
    workers_leak: tuple[LeakIndex | str, DetectorConfig] | None = leak
    if leak is not None and temp:
        workers_leak = (ship(leak[0], temp, write=not p.options.view_as(TestOptions).dry_run), leak[1])
    mixture_dict = mixture.to_dict()
    if record is not None:
        mixture_dict["decontaminate"] = record
    return workers_leak, mixture_dict


def build(
    p: beam.Pipeline, mixture: Mixture, output: str, dropped: Iterable[str] = (), progress: str | None = None
) -> None:
    """Add the whole job to pipeline `p`. `mixture` must be resolved (globs expanded); `dropped`:
    sources an earlier run wrote into `output` that this mixture no longer has (their files go);
    `progress`: the folder the DoFns' meters write into (pipelines.progress; None: none). Named
    steps (module doc's graph): the leakage index (`_leak_index`), the token files
    (`_convert_token_files`), the dedup pass (`_dedup`), TokenizeFiles, the side files
    (`_side_files`), Finalize."""
    if not mixture.files:
        raise ValueError("build() needs a resolved mixture (see pipelines.mixture.resolve)")
    tok = mf.tokenizer_info(mixture.tokenizer)
    engine = mixture.tokenizer_engine or tk.default_engine(mixture.tokenizer)
    crosscheck = tk.DEFAULT_CROSSCHECK if mixture.tokenizer_crosscheck is None else mixture.tokenizer_crosscheck
    names = [s.name for s in mixture.sources]
    workers_leak, mixture_dict = _leak_index(p, mixture)
    splits = {s.name: s.split for s in mixture.sources if s.split is not None}
    heldout_sources = frozenset(n for n, sp in splits.items() if sp == HELDOUT)
    files = p | "Files" >> beam.Create(_tasks(mixture, JSONL)) | "SpreadFiles" >> beam.Reshuffle()

    parts = _Parts([], [], [], [])
    _convert_token_files(p, mixture, output, tok, heldout_sources, parts)
    side = _dedup(files, heldout_sources, progress, parts) if mixture.dedup else {}
    written = files | "TokenizeFiles" >> beam.ParDo(
        TokenizeFile(
            mixture.tokenizer,
            mixture.heldout_fraction,
            output,
            mixture.seq_len,
            tok["eos_id"],
            tok["pad_id"],
            splits,
            engine,
            crosscheck,
            tk.get_engine(engine, mixture.tokenizer).version,
            workers_leak,
            Meter(progress),
            None if mixture.packing is None else mixture.packing.window,
            mixture.shard_compression or DEFAULT_SHARD_COMPRESSION,
        ),
        **side,
    ).with_outputs(REJECTS_TAG, TALLY_TAG, main="shards")
    parts.tallies.append(written[TALLY_TAG])
    shards = (written.shards, *parts.shards) | "AllShards" >> beam.Flatten()
    rejected = (written[REJECTS_TAG], *parts.rejects) | "AllRejects" >> beam.Flatten()
    side_written = _side_files(p, names, output, parts, rejected)
    tallies = tuple(parts.tallies) | "Tallies" >> beam.Flatten() | "SumTallies" >> beam.CombinePerKey(sum)

    _ = (
        p
        | "Once" >> beam.Create([None])
        | "Finalize"
        >> beam.Map(
            _finalize,
            mixture_dict,
            tok,
            tallies=beam.pvalue.AsList(tallies),
            shards=beam.pvalue.AsList(shards),
            side_files=beam.pvalue.AsList(side_written),
            output=output,
            previous=sorted(set(dropped)),
            build=tk.build_info(engine, crosscheck, mixture.tokenizer),
        )
    )


# The DoFns above unpack FileTask and Copy tuples by position: keep the field orders fixed.
assert FileTask._fields == ("source", "path", "index", "count"), FileTask._fields
assert Copy._fields == ("source", "id", "file", "line"), Copy._fields
