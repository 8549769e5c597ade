"""Beam option handling shared by the Beam jobs (`pipelines.tokenize`, and the audit's data pass):
command-line flags → PipelineOptions, unknown flags refused, the pipeline made for the chosen
runner (local runs on FnApiRunner, offline)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
)
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.runners.portability.portable_runner import JobServiceHandle
from apache_beam.runners.runner import PipelineResult

from contract.cli import nearest
from contract.errors import Refused

LOCAL_RUNNERS = (None, "DirectRunner", "direct")
DRY_RUN_VALUES = {"true": True, "false": False}  # --dry_run=VALUE, any case


class OptionsError(Refused, ValueError):
    """Beam options that cannot make a pipeline (an unknown --runner, …): refused before the job."""


def beam_parser() -> argparse.ArgumentParser:
    """Beam's own parser of every registered PipelineOptions class (the one `get_all_options`
    builds), taken through its public `add_extra_args_fn` hook (with no flags to parse: no
    "Discarding unparseable args" warning, which Beam logs once per call)."""
    got: list[argparse.ArgumentParser] = []
    PipelineOptions([]).get_all_options(add_extra_args_fn=got.append)
    assert len(got) == 1, "Beam's get_all_options did not call add_extra_args_fn"  # Beam changed
    return got[0]


def unparsed(argv: Sequence[str]) -> tuple[list[str], list[str]]:
    """What no Beam option takes in `argv`: (unknown flags as written, without "=value"; stray
    arguments: a value no flag takes, a single-dash flag). Beam itself would drop them with a
    warning, and the job would run as if they were not there. OptionsError for a value a Beam
    option refuses (argparse's message, in one line)."""
    parser = beam_parser()
    parser.exit_on_error = False  # argparse's ArgumentError, not its usage block and exit
    try:
        _, rest = parser.parse_known_args(list(argv))
    except argparse.ArgumentError as e:
        raise OptionsError(" ".join(str(e).split())) from None
    flags, stray = [], []
    for i, arg in enumerate(rest):
        if arg.startswith("--"):
            flags.append(arg.split("=", 1)[0])
        elif not (i and rest[i - 1].startswith("--") and "=" not in rest[i - 1]):  # not an unknown flag's value
            stray.append(arg)
    return flags, stray


def pipeline_options(argv: Sequence[str], job_flags: str, own: Iterable[str] = ()) -> PipelineOptions:
    """PipelineOptions of the flags the job did not take itself; job_flags names those (for the
    message), own lists them (for the nearest-flag hint). A typo such as --outptu would otherwise
    run the default job somewhere unexpected: refused (OptionsError, one line), naming the nearest
    known flag; any Beam option (--runner, --direct_num_workers, --project, ...) passes."""
    flags, stray = unparsed(argv)
    if flags:
        known = [*own, *(f"--{k}" for k in PipelineOptions([]).get_all_options())]
        hints = [f"{u}: did you mean {g}?" for u in flags if (g := nearest(u, known))]
        raise OptionsError(
            f"unknown option(s) {' '.join(flags)}: not a job option ({job_flags}) nor a Beam option"
            + (f" ({'; '.join(hints)})" if hints else "")
        )
    if stray:
        raise OptionsError(
            f"unexpected argument(s) {' '.join(stray)}: the job's options and Beam's are --name=value or --name value"
        )
    options = PipelineOptions(list(argv))
    workers = options.view_as(DirectOptions).direct_num_workers
    if workers is not None and workers < 0:  # Beam itself fails with an IndexError deep in the runner
        raise OptionsError(f"--direct_num_workers={workers}: a number of workers is ≥ 1 (0: one per CPU core)")
    test = options.view_as(TestOptions)
    if isinstance(test.dry_run, str):  # Beam keeps the text: "False" would be a (truthy) dry run
        if test.dry_run.lower() not in DRY_RUN_VALUES:
            raise OptionsError(f"--dry_run={test.dry_run}: expected True or False")
        test.dry_run = DRY_RUN_VALUES[test.dry_run.lower()]  # the views share it: Dataflow reads the bool too
    return options


def is_dry_run(options: PipelineOptions) -> bool:
    return bool(options.view_as(TestOptions).dry_run)


def runner_name(options: PipelineOptions) -> str:
    return options.view_as(StandardOptions).runner or "DirectRunner"


def is_local(options: PipelineOptions) -> bool:
    """Does the pipeline run here (DirectRunner, the default: `local_runner`)?"""
    return options.view_as(StandardOptions).runner in LOCAL_RUNNERS


def dry_run_result(p: beam.Pipeline, options: PipelineOptions) -> PipelineResult | None:
    """A --dry_run=True pipeline, not run: Dataflow honours the flag (it builds the job request,
    the result's `job`, and submits nothing); Beam's local engine ignores it and would run the whole
    job, so a local dry run stops at the graph built (None)."""
    return None if is_local(options) else p.run()


def dry_run_text(options: PipelineOptions, what: str) -> str:
    """The line a dry run prints: what `what` was built for (the runner, and where it would run)."""
    runner = options.view_as(StandardOptions).runner
    if is_local(options):
        given = "no --runner given: " if runner is None else ""
        return f"dry run: {what} was built for the local runner ({given}DirectRunner) and not run"
    gcp = options.view_as(GoogleCloudOptions)
    where = ", ".join(f"{k} {v}" if v else f"no --{k}" for k, v in (("project", gcp.project), ("region", gcp.region)))
    return f"dry run: {what} was built for {runner} ({where}) and not submitted"


def local_runner(options: PipelineOptions) -> fn_runner.FnApiRunner:
    """Beam's batch engine behind DirectRunner (FnApiRunner), set up as DirectRunner does.

    DirectRunner first tries the Prism runner, which downloads a binary; the jobs must run
    offline, so local runs go straight to FnApiRunner, which honours --direct_num_workers and
    --direct_running_mode (in_memory / multi_threading / multi_processing).
    """
    encoded = JobServiceHandle.encode_pipeline_options(options.get_all_options())
    info = fn_runner.ExtendedProvisionInfo(beam_provision_api_pb2.ProvisionInfo(pipeline_options=encoded))
    return fn_runner.FnApiRunner(provision_info=info)


def make_pipeline(options: PipelineOptions) -> beam.Pipeline:
    """The pipeline for the options' runner: DirectRunner (the default) on FnApiRunner, which
    honours --direct_num_workers and --direct_running_mode; any other runner by name."""
    try:
        runner = local_runner(options) if is_local(options) else None
        return beam.Pipeline(runner=runner, options=options)
    except (ValueError, ImportError) as e:  # Beam: "Unexpected pipeline runner: …", or its extra is missing
        # (Dataflow's "Pipeline has validations errors:" lists one missing option a line: one line here)
        raise OptionsError(f"cannot set up the Beam pipeline: {_one_line(e)}") from None


def _one_line(error: BaseException) -> str:
    """An error's message in one line: its first line, then the others (each a listed item)
    joined by "; "."""
    head, *rest = [line.strip().rstrip(".") for line in str(error).splitlines() if line.strip()] or [""]
    return " ".join([head, "; ".join(rest)]) if rest else head
