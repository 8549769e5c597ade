"""The data side's shard pass as an Apache Beam pipeline (the engine the tokenize job uses).

    held-out shards ─ScanHeldout─► CollectHeldout ─HeldoutIndex─┐ (side input)
    training shards ─ScanTrain (every document against the index)─► CollectTrain
    ─► WriteScans: both collections, pickled, to one file the driver reads back

Each shard is one element (`shardscan.scan_shard`: sha256, records, documents), so the pass
divides by the workers: DirectRunner by default (`--direct_num_workers=N
--direct_running_mode=multi_processing` for several local processes), `--runner=DataflowRunner`
with the tokenize job's options for a real dataset (the scans are then written under
`--temp_location`). The per-shard results are combined by a Beam CombineFn that sums the
vocabulary-sized token counts per source and split as it goes, so what comes back is small;
`merge.Replay` puts them in reading order. Counters: namespace `olmax.audit`.
"""

from __future__ import annotations

import copy
import os
import pickle
import tempfile
import uuid
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.metrics import Metrics
from apache_beam.options.pipeline_options import DirectOptions, GoogleCloudOptions, TypeOptions

from pipelines.beam_options import (
    dry_run_result,
    dry_run_text,
    is_dry_run,
    make_pipeline,
    pipeline_options,
    runner_name,
)
from pipelines.leakage import Detector, DetectorConfig, LeakIndex, fetch, ship
from pipelines.progress import Meter, Reporter, rate_line

from .merge import Replay
from .shardscan import Decoder, HeldoutIndex, ShardScan, ShardTask, decoder, scan_shard

NAMESPACE = "olmax.audit"
AUDIT_FLAGS = "the audit's own flags, see python -m audit --help"
# the pass's scans of one split and their token counts summed per stream (CollectScans)
Collected = tuple[list[ShardScan], dict[tuple[int, str, str], np.ndarray]]
# the eval-leakage index (or, shipped to --temp_location, its file) and the detector's settings
Leak = tuple[LeakIndex | str, DetectorConfig]


class DryRun(Exception):
    """The pipeline was built for a runner and not submitted (`--dry_run=True`)."""

    def __init__(self, result: object, text: str) -> None:
        super().__init__(text)  # beam_options.dry_run_text
        self.result = result


class ScanShard(beam.DoFn):
    """One shard → its ShardScan (the training pass takes the held-out index as a side input)."""

    def __init__(self, tokenizer: str | None, leak: Leak | None = None, meter: Meter | None = None) -> None:
        self.tokenizer = tokenizer
        self.leak = leak  # (LeakIndex, DetectorConfig) for training shards, or None
        self.meter = meter or Meter(None)  # records read, for the progress line (pipelines.progress)
        self.decode: Decoder | None = None
        self.detector: Any = None  # pipelines.leakage.Detector, built in setup

    def setup(self) -> None:
        self.decode = decoder(self.tokenizer)
        if self.leak is not None:  # built once per worker from the index it was given (or its file)
            self.detector = Detector.shared(fetch(self.leak[0]), self.leak[1])

    def process(self, task: ShardTask, index: HeldoutIndex | None = None) -> Iterator[ShardScan]:
        scan = scan_shard(task, self.decode, index, self.detector, self.meter)
        Metrics.counter(NAMESPACE, "shards").inc()
        Metrics.counter(NAMESPACE, "records").inc(scan.records)
        if scan.stats is not None:
            Metrics.counter(NAMESPACE, "documents").inc(scan.stats.documents)
        yield scan

    def finish_bundle(self) -> None:
        self.meter.flush()


class CollectScans(beam.CombineFn):
    """ShardScans → (list of them without their token counts, {(manifest, source, split): summed
    token counts}): memory O(shards + sources × vocabulary), not O(shards × vocabulary)."""

    def create_accumulator(self) -> Collected:
        return [], {}

    def add_input(self, acc: Collected, scan: ShardScan) -> Collected:
        scans, counts = acc
        if scan.stats is not None and scan.stats.token_counts is not None:
            stats = copy.copy(scan.stats)
            if scan.stream in counts:
                counts[scan.stream] = counts[scan.stream] + stats.token_counts
            else:
                counts[scan.stream] = stats.token_counts.copy()
            stats.token_counts = None  # type: ignore[assignment]  # released: counts[scan.stream] holds them
            scan = copy.copy(scan)
            scan.stats = stats
        scans.append(scan)
        return scans, counts

    def merge_accumulators(self, accs: Iterable[Collected]) -> Collected:
        scans: list[ShardScan] = []
        counts: dict = {}  # stream → summed token counts
        for s, c in accs:
            scans.extend(s)
            for k, v in c.items():
                counts[k] = counts[k] + v if k in counts else v
        return scans, counts

    def extract_output(self, acc: Collected) -> Collected:
        return acc


def heldout_index(
    collected: Collected,
    tasks: list[ShardTask],
    labels: list[str],
    token_sources: list[set[str]],
    tokenizer: str | None,
) -> HeldoutIndex:
    scans, counts = collected
    index = Replay(tasks, labels, token_sources, decoder(tokenizer)).heldout({s.order: s for s in scans}, counts)
    return index.for_lookups()  # copied to every worker: only what finds copies (the driver names them)


def write_scans(_: object, heldout: Collected, train: Collected, path: str) -> None:
    with FileSystems.create(path) as f:
        f.write(pickle.dumps((heldout, train), protocol=pickle.HIGHEST_PROTOCOL))


EMPTY: Collected = ([], {})  # CollectScans of no shard


def build(
    p: beam.Pipeline,
    tasks: list[ShardTask],
    labels: list[str],
    token_sources: list[set[str]],
    tokenizer: str | None,
    path: str,
    spread: bool = True,
    leak: Leak | None = None,
    progress: str | None = None,
) -> None:
    """spread: Reshuffle the shards so that every worker gets some (not with one in-process
    worker, where it only adds a stage). The combines have no default-value branch (a split with
    no shard gives EMPTY through the side inputs' defaults): fewer steps, less start-up.
    progress: the folder the scans' meters write into (pipelines.progress; None: none)."""

    def shards(label: str, split_tasks: list[ShardTask]) -> beam.PCollection:
        pc = p | f"{label}Shards" >> beam.Create(split_tasks)
        return pc | f"Spread{label}" >> beam.Reshuffle() if spread else pc

    held_scans = (
        shards("Heldout", [t for t in tasks if t.order[0] == 0])
        | "ScanHeldout" >> beam.ParDo(ScanShard(tokenizer, meter=Meter(progress)))
        | "CollectHeldout" >> beam.CombineGlobally(CollectScans()).without_defaults()
    )
    index = held_scans | "HeldoutIndex" >> beam.Map(heldout_index, tasks, labels, token_sources, tokenizer)
    train_scans = (
        shards("Train", [t for t in tasks if t.order[0] == 1])
        | "ScanTrain"
        >> beam.ParDo(
            ScanShard(tokenizer, leak, Meter(progress)), index=beam.pvalue.AsSingleton(index, default_value=None)
        )
        | "CollectTrain" >> beam.CombineGlobally(CollectScans()).without_defaults()
    )
    _ = (
        p
        | "Once" >> beam.Create([None])
        | "WriteScans"
        >> beam.Map(
            write_scans,
            beam.pvalue.AsSingleton(held_scans, default_value=EMPTY),
            beam.pvalue.AsSingleton(train_scans, default_value=EMPTY),
            path,
        )
    )


def run(
    tasks: list[ShardTask],
    labels: list[str],
    token_sources: list[set[str]],
    tokenizer: str | None,
    beam_args: Sequence[str] = (),
    leak: tuple[LeakIndex, DetectorConfig] | None = None,
) -> tuple[Collected, Collected]:
    """Runs the pass; returns ((held-out scans, token counts), (training scans, token counts)).
    leak: (LeakIndex, DetectorConfig) to score every training document with (eval leakage), or None.
    Raises beam_options.OptionsError for options that make no pipeline, DryRun for --dry_run=True."""
    options = pipeline_options(beam_args, AUDIT_FLAGS)
    # the graph is small and its element types are ours: Beam's type inference over every step
    # (signature introspection) cost more than the pass itself on a small dataset
    options.view_as(TypeOptions).pipeline_type_check = False
    one_local_worker = (
        runner_name(options) in ("DirectRunner", "direct")
        and (options.view_as(DirectOptions).direct_num_workers or 1) == 1
    )
    temp = options.view_as(GoogleCloudOptions).temp_location
    local_dir = "" if temp else tempfile.mkdtemp(prefix="audit-scans-")
    path = FileSystems.join(temp or local_dir, f"audit-scans-{uuid.uuid4().hex}.pickle")
    p = make_pipeline(options)
    shipped: Leak | None = leak
    if leak is not None and temp:  # with --temp_location the workers read the index from a file there
        shipped = (ship(leak[0], temp, write=not is_dry_run(options)), leak[1])
    if is_dry_run(options):
        build(p, tasks, labels, token_sources, tokenizer, path, spread=not one_local_worker, leak=shipped)
        if local_dir:  # nothing is written there: a local dry run stops at the graph
            os.rmdir(local_dir)
        raise DryRun(dry_run_result(p, options), dry_run_text(options, "the audit's data pass"))
    total = sum(t.expected_records for t in tasks)
    reporter = Reporter(
        lambda counts, elapsed: rate_line("audit: shard pass", "records", counts["records"], elapsed, total),
        local=runner_name(options) in ("DirectRunner", "direct"),
    )
    try:
        with reporter:  # a line on stderr every OLMAX_PROGRESS_S seconds (15) until the pass ends
            build(p, tasks, labels, token_sources, tokenizer, path, not one_local_worker, shipped, reporter.folder)
            p.run().wait_until_finish()
        with FileSystems.open(path) as f:
            return pickle.loads(f.read())
    finally:
        if FileSystems.exists(path):
            FileSystems.delete([path])
        if local_dir:
            os.rmdir(local_dir)
