"""The tokenize-and-pack job graph (DoFns and `build`); the CLI is `pipelines.tokenize`.

Graph (every step keyed by content, so no step depends on element or bundle order):
  files ─ReadDocuments─► docs ─(dedup: GroupByKey text digest, keep min (source, id))─►
  TokenizeDocs (split by text digest) ─► per-(source, split) doc/token totals (side input) →
  shard k = digest mod n ─GroupByKey (source, split, k, n)─► sort by digest, pack, WriteShard ─►
  Finalize: check accounting, write manifest.json last (after rejects/ and duplicates/).
Shard count per (source, split) = ceil(tokens / shard_tokens), capped by the document count.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions

from pipelines import manifest as mf
from pipelines import metrics
from pipelines.mixture import Mixture
from pipelines.pack import TOKEN_DTYPE, pack_examples, tokens_to_bytes
from pipelines.read import REASONS, REJECTS_TAG, TALLY_TAG, Doc, ReadDocuments
from pipelines.shards import remove_leftover_temps, remove_stale_shards, shard_name, write_array_record, write_bytes, write_jsonl
from pipelines.split import choose_kept, num_shards, pack_order, shard_of, split_of

DUPS_TAG = "duplicates"
REJECTS_DIR, DUPLICATES_DIR = "rejects", "duplicates"


class Tokenized(NamedTuple):
    """A tokenized document. Crosses shuffles as a plain tuple of str/bytes, which Beam's
    primitive coder writes natively (pickling numpy arrays cost more than packing itself)."""

    source: str
    split: str
    id: str
    digest: bytes
    tokens: bytes  # [n_tokens] uint32-le, without EOS

    @property
    def n_tokens(self) -> int:
        return len(self.tokens) // TOKEN_DTYPE.itemsize


class PickKept(beam.DoFn):
    """(digest, copies of one text) → the kept copy; the others as duplicate records + tallies."""

    def process(self, element: tuple[bytes, Iterable[tuple]]):
        _, copies = element
        kept, dups = choose_kept(Doc(*c) for c in copies)
        yield tuple(kept)
        for d in dups:
            metrics.inc(d.source, "duplicates")
            row = {"id": d.id, "file": d.file, "line": d.line, "kept": {"source": kept.source, "id": kept.id}}
            yield beam.pvalue.TaggedOutput(DUPS_TAG, (d.source, row))
            yield beam.pvalue.TaggedOutput(TALLY_TAG, ((d.source, "duplicates"), 1))


class TokenizeDocs(beam.DoFn):
    """Doc → Tokenized: `encode_ordinary` (special-token text stays text) and the held-out split."""

    def __init__(self, tokenizer: str, heldout_fraction: float):
        self._name = tokenizer
        self._fraction = heldout_fraction

    def setup(self):
        from pipelines.tokenizer import get_tokenizer

        self._enc = get_tokenizer(self._name)

    def process(self, element: tuple):
        source, doc_id, text, _file, _line, digest = element  # Doc's fields, without building one
        tokens = tokens_to_bytes(self._enc.encode_ordinary(text))
        yield (source, split_of(digest, self._fraction), doc_id, digest, tokens)


def _sum_pairs(values: Iterable[tuple[int, int]]) -> tuple[int, int]:
    docs = toks = 0
    for d, t in values:
        docs += d
        toks += t
    return docs, toks


def _shard_keys(kv: tuple[tuple[str, str], tuple[int, int]], shard_tokens: int):
    (source, split), (docs, toks) = kv
    n = num_shards(docs, toks, shard_tokens)
    return [((source, split, k, n), None) for k in range(n)]


def _size(element: tuple):
    source, split, _id, _digest, tokens = element  # Tokenized's fields
    return (source, split), (1, len(tokens) // TOKEN_DTYPE.itemsize)


def _assign(element: tuple, totals: dict, shard_tokens: int):
    source, split, _id, digest, _tokens = element  # Tokenized's fields
    docs, toks = totals[(source, split)]
    n = num_shards(docs, toks, shard_tokens)
    return (source, split, shard_of(digest, n), n), element


class WriteShard(beam.DoFn):
    """((source, split, k, n), docs) → one committed ArrayRecord shard and its description."""

    def __init__(self, output: str, seq_len: int, eos_id: int, pad_id: int):
        self._output, self._seq_len, self._eos, self._pad = output, seq_len, eos_id, pad_id

    def process(self, element):
        (source, split, k, n), items = element
        docs = sorted((Tokenized(*d) for d in items if d is not None), key=lambda d: pack_order(d.digest, d.id))
        name = shard_name(split, k, n)
        arrays = (np.frombuffer(d.tokens, dtype=TOKEN_DTYPE) for d in docs)
        examples = pack_examples(arrays, self._seq_len, self._eos, self._pad)
        records, sha = write_array_record((ex.tobytes() for ex in examples), FileSystems.join(self._output, source, name))
        tokens = sum(d.n_tokens + 1 for d in docs)
        padding = records * self._seq_len - tokens
        metrics.inc(source, f"tokens/{split}", tokens)
        metrics.inc(source, f"examples/{split}", records)
        yield {
            "source": source, "split": split, "index": k, "count": n, "path": f"{source}/{name}",
            "records": records, "sha256": sha, "documents": len(docs), "tokens": tokens, "padding": padding,
        }


def _write_side_file(element, output: str, subdir: str, sort_key) -> str:
    source, rows = element
    rows = sorted((r for r in rows if r is not None), key=sort_key)
    write_jsonl(rows, FileSystems.join(output, subdir, f"{source}.jsonl"))
    return f"{subdir}/{source}.jsonl"


def _finalize(_, mixture: dict, tokenizer: dict, tallies, shards, side_files, output: str) -> str:
    """Runs once after everything else: checks the accounting, writes manifest.json last."""
    del side_files  # a side input only so that this step waits for the side files
    manifest = mf.build_manifest(mixture, tokenizer, tallies, shards, reasons=REASONS)
    names = [s["name"] for s in mixture["sources"]]
    remove_leftover_temps(output, [*names, REJECTS_DIR, DUPLICATES_DIR])
    listed = [sh["path"] for e in manifest["sources"].values() for sp in e["splits"].values() for sh in sp["shards"]]
    remove_stale_shards(output, names, listed)
    write_bytes(mf.dumps(manifest), FileSystems.join(output, mf.MANIFEST_NAME))
    return manifest["fingerprint"]


def build(p: beam.Pipeline, mixture: Mixture, output: str) -> None:
    """Add the whole job to pipeline `p`. `mixture` must be resolved (globs expanded)."""
    if not mixture.files:
        raise ValueError("build() needs a resolved mixture (see pipelines.mixture.resolve)")
    tok = mf.tokenizer_info(mixture.tokenizer)
    names = [s.name for s in mixture.sources]
    inputs = [(s.name, f) for s, files in zip(mixture.sources, mixture.files) for f in files]

    read = (
        p
        | "Files" >> beam.Create(inputs)
        | "SpreadFiles" >> beam.Reshuffle()
        | "Read" >> beam.ParDo(ReadDocuments()).with_outputs(REJECTS_TAG, TALLY_TAG, main="docs")
    )
    docs, tally_parts, dup_rows = read.docs, [read[TALLY_TAG]], []
    if mixture.dedup:
        picked = (
            docs
            | "ByText" >> beam.Map(lambda d: (Doc(*d).digest, d))
            | "GroupCopies" >> beam.GroupByKey()
            | "Dedup" >> beam.ParDo(PickKept()).with_outputs(DUPS_TAG, TALLY_TAG, main="kept")
        )
        docs = picked.kept
        tally_parts.append(picked[TALLY_TAG])
        dup_rows.append(picked[DUPS_TAG])

    tokenized = docs | "Tokenize" >> beam.ParDo(TokenizeDocs(mixture.tokenizer, mixture.heldout_fraction))
    totals = (
        tokenized
        | "SizeOf" >> beam.Map(_size)
        | "SplitTotals" >> beam.CombinePerKey(_sum_pairs)
    )
    every_shard = totals | "AllShardKeys" >> beam.FlatMap(_shard_keys, mixture.shard_tokens)
    assigned = tokenized | "AssignShard" >> beam.Map(
        _assign, totals=beam.pvalue.AsDict(totals), shard_tokens=mixture.shard_tokens
    )
    shard_infos = (
        (assigned, every_shard)
        | "WithEmptyShards" >> beam.Flatten()
        | "GroupShards" >> beam.GroupByKey()
        | "PackAndWrite" >> beam.ParDo(WriteShard(output, mixture.seq_len, tok["eos_id"], tok["pad_id"]))
    )

    def side_files(label: str, rows, subdir: str, sort_key):
        seeds = p | f"{label}Sources" >> beam.Create([(n, None) for n in names])
        return (
            (*rows, seeds)
            | f"{label}Flatten" >> beam.Flatten()
            | f"{label}Group" >> beam.GroupByKey()
            | f"{label}Write" >> beam.Map(_write_side_file, output, subdir, sort_key)
        )

    rejects_rows = read[REJECTS_TAG] | "RejectRows" >> beam.MapTuple(lambda s, r: (s, r.to_json()))
    written = (
        side_files("Rejects", [rejects_rows], REJECTS_DIR, lambda r: (r["file"], r["line"])),
        side_files("Duplicates", dup_rows, DUPLICATES_DIR, lambda r: (r["file"], r["line"], r["id"])),
    ) | "SideFiles" >> beam.Flatten()
    tallies = tuple(tally_parts) | "Tallies" >> beam.Flatten() | "SumTallies" >> beam.CombinePerKey(sum)

    _ = (
        p
        | "Once" >> beam.Create([None])
        | "Finalize" >> beam.Map(
            _finalize, mixture.to_dict(), tok, tallies=beam.pvalue.AsList(tallies),
            shards=beam.pvalue.AsList(shard_infos), side_files=beam.pvalue.AsList(written), output=output,
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




# The hot paths above unpack Doc and Tokenized tuples by position: keep the field orders fixed.
assert Doc._fields == ("source", "id", "text", "file", "line", "digest"), Doc._fields
assert Tokenized._fields == ("source", "split", "id", "digest", "tokens"), Tokenized._fields
