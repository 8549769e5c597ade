"""CLI of the tokenize-and-pack job: Dolma-style JSONL mixture → ArrayRecord shards + manifest.json.

    python -m pipelines.tokenize [--mixture PATH] [--output DIR] [Beam options…]

With no arguments: the embedded sample mixture into `out/sample` on the local runner.
Unknown flags go to Beam's PipelineOptions (`--runner`, `--direct_num_workers`, `--project`, …).
The graph itself lives in `pipelines.job` (so that its classes pickle by module name).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions, TestOptions

from pipelines import contract
from pipelines import metrics
from pipelines.job import build, local_runner
from pipelines.mixture import DEFAULT_MIXTURE, Mixture, load_mixture, resolve, uses_sample

DEFAULT_OUTPUT = "out/sample"


def parse_args(argv: Sequence[str] | None) -> tuple[argparse.Namespace, list[str]]:
    ap = argparse.ArgumentParser(prog="python -m pipelines.tokenize", description=__doc__.split("\n")[0], allow_abbrev=False)
    ap.add_argument("--mixture", default=str(DEFAULT_MIXTURE), help="mixture YAML (default: the embedded sample)")
    ap.add_argument("--output", default=DEFAULT_OUTPUT, help="output folder, local or gs:// (default: %(default)s)")
    return ap.parse_known_args(argv)


def unknown_flags(options: PipelineOptions) -> list[str]:
    """Flags that neither this job nor any Beam options class defines (Beam would only warn)."""
    known = options.get_all_options()
    return sorted(set(options.get_all_options(retain_unknown_options=True)) - set(known))


def remove_old_manifest(output: str) -> bool:
    """Delete an earlier run's manifest.json before this run starts rewriting shards under the
    same names: if this run then fails, no manifest describes a mix of old and new shards (the
    new one is written last, only when the job succeeds). True if one was deleted."""
    path = FileSystems.join(output, contract.MANIFEST_NAME)
    if FileSystems.exists(path):
        FileSystems.delete([path])
        return True
    return False


def run(argv: Sequence[str] | None = None):
    """Build and run the job. Returns (pipeline result, output dir, pipeline options)."""
    args, beam_argv = parse_args(argv)
    options = PipelineOptions(beam_argv)
    if unknown := unknown_flags(options):
        # a typo such as --outptu would otherwise run the default job somewhere unexpected
        raise SystemExit(f"unknown option(s) {unknown}: not --mixture/--output nor a Beam option")
    mixture = load_mixture(args.mixture)
    sample_dir = None
    if uses_sample(mixture):
        from pipelines.sample import build_sample

        sample_dir = build_sample()
    mixture = resolve(mixture, sample_dir)
    runner_name = options.view_as(StandardOptions).runner
    runner = local_runner(options) if runner_name in (None, "DirectRunner", "direct") else None
    output = args.output.rstrip("/")
    if "://" not in output:  # local: absolute, so worker processes with another cwd agree
        output = os.path.abspath(output)
    if not options.view_as(TestOptions).dry_run:
        remove_old_manifest(output)
    p = beam.Pipeline(runner=runner, options=options)
    build(p, mixture, output)
    result = p.run()
    result.wait_until_finish()
    return result, output, options


def summary(output: str, counters: dict[str, int]) -> str:
    """A short human summary of a finished job from its manifest (and Beam metrics if any)."""
    with FileSystems.open(FileSystems.join(output, contract.MANIFEST_NAME)) as f:
        m = json.loads(f.read())
    head = f"{'source':<16}{'docs':>9}{'train':>9}{'heldout':>9}{'dups':>7}{'rejected':>9}{'train tok':>12}{'examples':>10}{'shards':>7}"
    lines = [f"mixture {m['mixture']['name']}  seq_len {m['seq_len']}  fingerprint {m['fingerprint'][:16]}…", head]
    for name, s in m["sources"].items():
        c, sp = s["counts"], s["splits"]
        lines.append(
            f"{name:<16}{c['documents']:>9}{c['train']:>9}{c['heldout']:>9}{c['duplicates']:>7}"
            f"{sum(c['rejected'].values()):>9}{s['tokens']['train']:>12}"
            f"{sp['train']['examples'] + sp['heldout']['examples']:>10}"
            f"{len(sp['train']['shards']) + len(sp['heldout']['shards']):>7}"
        )
    if counters:
        lines.append("beam metrics: " + ", ".join(f"{k}={v}" for k, v in counters.items()))
    lines.append(f"output: {FileSystems.join(output, contract.MANIFEST_NAME)}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    result, output, options = run(argv)
    if options.view_as(TestOptions).dry_run:
        print(f"dry run: the job was built for {options.view_as(StandardOptions).runner} and not submitted")
        return 0
    print(summary(output, metrics.collect(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
