"""CLI of the tokenize-and-pack job: Dolma-style JSONL mixture → ArrayRecord shards + manifest.json.

    python -m pipelines.tokenize [--mixture PATH] [--output DIR] [--overwrite_output]
        [--tokenizer_engine quicktok|gigatoken|tiktoken] [--tokenizer_crosscheck RATE|all] [Beam options…]

With no arguments: the embedded sample mixture into `out/sample` on the local runner.
Everything that can be checked before the job runs is (output folder, mixture, every input
file), and nothing is written or deleted before those checks pass (`pipelines.outdir`).
Unknown flags go to Beam's PipelineOptions (`--runner`, `--direct_num_workers`, `--project`, …).
The graph itself lives in `pipelines.job` (so that its classes pickle by module name).
"""

from __future__ import annotations

# isort: off
from pipelines import startup  # first: in the CLI's own process it trims Beam's start-up (see there)

# isort: on
import argparse
import json
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import replace

from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TestOptions
from apache_beam.runners.runner import PipelineResult

import contract
from contract.cli import Parser, run_main
from contract.errors import Refused
from contract.lock import probe
from contract.manifest import JSONL
from contract.outputs import WriteFailed
from pipelines import beam_metrics as metrics
from pipelines.beam_options import (  # noqa: F401 (OptionsError re-exported)
    OptionsError,
    dry_run_result,
    dry_run_text,
    make_pipeline,
    pipeline_options,
)
from pipelines.dolma2_tokenizer import DEFAULT_CROSSCHECK, DEFAULT_ENGINE, default_engine, get_engine
from pipelines.job import build
from pipelines.mixture import (
    DEFAULT_MIXTURE,
    Mixture,
    MixtureError,
    load_mixture,
    parse_crosscheck,
    resolve,
    uses_sample,
)
from pipelines.outdir import (
    MARKER_NAME,
    OutputError,
    check_inputs_outside,
    check_output,
    check_own_paths,
    delete_files,
    is_local,
    lock_output,
    marker_bytes,
    remove_temporaries,
)
from pipelines.progress import Reporter, duration, rate_line
from pipelines.sample import build_sample
from pipelines.shards import quiet_write_failures, write_bytes, write_failure

DEFAULT_OUTPUT = "out/sample"


JOB_FLAGS = ("--mixture", "--output", "--overwrite_output", "--tokenizer_engine", "--tokenizer_crosscheck")


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    ap = Parser("python -m pipelines.tokenize", __doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--mixture", default=str(DEFAULT_MIXTURE), help="mixture YAML (the embedded sample's)")
    ap.add_argument(
        "--output",
        default=DEFAULT_OUTPUT,
        help="output folder, local or gs://; must be new, empty or an earlier olmax output",
    )
    ap.add_argument(
        "--overwrite_output",
        action="store_true",
        help="write into a non-empty --output that holds no olmax output: files named as the job "
        "names its outputs are replaced, nothing else is touched",
    )
    ap.add_argument(
        "--tokenizer_engine",
        default=None,
        help=f"encoder: quicktok, gigatoken or tiktoken (default: the mixture's, else {DEFAULT_ENGINE}; "
        "tiktoken for a tokenizer the others cannot encode, e.g. dolma2-proxy32k); same ids either way",
    )
    ap.add_argument(
        "--tokenizer_crosscheck",
        default=None,
        type=_crosscheck_arg,
        help=f"share of documents (by content hash) also encoded with tiktoken, or 'all' "
        f"(default: the mixture's, else {DEFAULT_CROSSCHECK})",
    )
    return ap.parse_known_args(argv)


def _crosscheck_arg(value: str) -> float | str | None:
    try:
        return parse_crosscheck(value)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def with_engine(mixture: Mixture, engine: str | None, crosscheck: float | str | None) -> Mixture:
    """The mixture with its engine settings resolved: command line over mixture file over defaults.
    Loads and checks the engine here (VocabularyError, or MixtureError for an unknown name), so a
    wrong engine stops the job before anything starts; every worker checks it again."""
    engine = engine or mixture.tokenizer_engine or default_engine(mixture.tokenizer)
    crosscheck = crosscheck if crosscheck is not None else mixture.tokenizer_crosscheck
    try:
        get_engine(engine, mixture.tokenizer)  # a VocabularyError (a RuntimeError) goes through as itself
    except ValueError as e:  # an unknown name, or an engine that cannot encode the vocabulary: refused
        # like any other bad setting, before the job
        raise MixtureError(str(e)) from None
    return replace(
        mixture, tokenizer_engine=engine, tokenizer_crosscheck=DEFAULT_CROSSCHECK if crosscheck is None else crosscheck
    )


def claim_output(output: str, sources: list[str]) -> bool:
    """Mark `output` as this job's (its marker lists every source that may have files there,
    so that a later run can remove those of sources it drops), then delete an earlier run's
    manifest.json before this run starts rewriting shards under the same names: if this run then
    fails, no manifest describes a mix of old and new shards (the new one is written last, only
    when the job succeeds). True if a manifest was deleted."""
    write_bytes(marker_bytes(sources), FileSystems.join(output, MARKER_NAME))
    if FileSystems.exists(FileSystems.join(output, contract.MANIFEST_NAME)):
        delete_files(output, [contract.MANIFEST_NAME])
        return True
    return False


def run(argv: Sequence[str] | None = None) -> tuple[PipelineResult | None, str, PipelineOptions]:
    """Build and run the job. Returns (pipeline result, output dir, pipeline options)."""
    args, beam_argv = parse_args(argv)
    options = pipeline_options(beam_argv, ", ".join(JOB_FLAGS), own=JOB_FLAGS)  # OptionsError: one line, exit 2
    dry_run = options.view_as(TestOptions).dry_run
    if not dry_run and args.output.strip() and is_local(args.output):
        probe(os.path.abspath(args.output))  # another job writes there: refused before any work
    # local paths become absolute, so worker processes with another cwd agree
    output, previous = check_output(args.output, args.overwrite_output, look=not dry_run)
    mixture = with_engine(load_mixture(args.mixture), args.tokenizer_engine, args.tokenizer_crosscheck)
    startup.settle()  # everything is imported and the engine loaded: the collector back on (CLI only)
    sample_dir = None
    if uses_sample(mixture):
        sample_dir = build_sample()
    mixture = resolve(mixture, sample_dir)  # checks every input file
    check_inputs_outside(output, [f for files in mixture.files for f in files])
    names = [s.name for s in mixture.sources]
    check_own_paths(output, names, previous)
    # the pipeline and its graph are built before anything is written: a bad --runner (or any
    # setting the graph refuses) must not leave the previous output without its manifest
    p = make_pipeline(options)
    reporter = progress_of(mixture, local=not dry_run and is_direct(options))
    build(p, mixture, output, dropped=previous, progress=reporter.folder)
    if dry_run:
        return dry_run_result(p, options), output, options
    try:  # one job per --output, for the job's life, from before its first write or deletion
        lock = lock_output(output)
    except (OSError, BeamIOError) as e:
        raise OutputError(f"cannot write into --output {output}: {e}") from e
    try:
        try:  # the first write into --output, after every check
            claim_output(output, sorted(set(previous) | set(names)))
        except (OSError, BeamIOError) as e:
            raise OutputError(f"cannot write into --output {output}: {e}") from e
        try:
            with reporter:  # a line on stderr every OLMAX_PROGRESS_S seconds (15) until the job ends
                result = p.run()
                result.wait_until_finish()
        except Exception as e:
            if write_failure(e) is not None:  # the job's own temporaries go, under the lock
                remove_temporaries(output, sorted(set(previous) | set(names)))
            raise
    finally:
        lock.release()
    return result, output, options


def is_direct(options: PipelineOptions) -> bool:
    return (options.view_as(StandardOptions).runner or "DirectRunner") in ("DirectRunner", "direct")


def progress_of(mixture: Mixture, local: bool) -> Reporter:
    """The job's progress line: documents tokenized and their rate, the text files done of all
    (and the ETA, from the files done: the documents in a file are not known before it is read),
    and during the dedup pass the documents read."""
    files = [f for s, fs in zip(mixture.sources, mixture.files) if s.format == JSONL for f in fs]

    def describe(c: Mapping[str, int], elapsed: float) -> str:
        line = rate_line("tokenize", "documents", c["documents"], elapsed)
        line += f"; {c['files']:,} of {len(files):,} text files done"
        if 0 < c["files"] < len(files):
            line += f", ETA {duration(elapsed * (len(files) - c['files']) / c['files'])}"
        if c["keyed"] > c["documents"]:  # the dedup pass reads every file before any is tokenized
            line += f"; dedup pass: {c['keyed']:,} documents read"
        return line

    return Reporter(describe, local=local)


def summary(output: str, counters: dict[str, int]) -> str:
    """A short human summary of a finished job from its manifest: per source, documents by where
    they went, then the training split's tokens and examples (packed records), and all shards.
    Beam's counters repeat the table: they go to the DEBUG log, not the console."""
    with FileSystems.open(FileSystems.join(output, contract.MANIFEST_NAME)) as f:
        m = json.loads(f.read())
    head = f"{'source':<16}{'docs':>9}{'train':>9}{'heldout':>9}{'dups':>7}{'rejected':>9}{'train tok':>12}{'train ex':>10}{'shards':>7}"
    lines = [f"mixture {m['mixture']['name']}  seq_len {m['seq_len']}  fingerprint {m['fingerprint'][:16]}…", head]
    for name, s in m["sources"].items():
        c, sp = s["counts"], s["splits"]
        lines.append(
            f"{name:<16}{c['documents']:>9}{c['train']:>9}{c['heldout']:>9}{c['duplicates']:>7}"
            f"{sum(c['rejected'].values()):>9}{s['tokens']['train']:>12}"
            f"{sp['train']['examples']:>10}"
            f"{len(sp['train']['shards']) + len(sp['heldout']['shards']):>7}"
        )
    if counters:
        logging.getLogger(__name__).debug("beam metrics: %s", ", ".join(f"{k}={v}" for k, v in counters.items()))
    lines.append(f"output: {FileSystems.join(output, contract.MANIFEST_NAME)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    quiet_write_failures()
    return run_main(lambda: _main(argv))


def _main(argv: Sequence[str] | None) -> int:
    try:
        result, output, options = run(argv)
    except Refused:  # refused before the job ran (mixture, output, options, vocabulary, lock): nothing was written
        raise
    except Exception as e:
        line = write_failure(e)
        if line is None:
            raise
        raise WriteFailed(line) from None  # the job stopped writing: exit 1
    if options.view_as(TestOptions).dry_run:
        print(dry_run_text(options, "the job"))
        return 0
    print(summary(output, metrics.collect(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
