"""Beam option handling shared by the Beam jobs (`pipelines.tokenize`, and the audit's data pass):
command-line flags → PipelineOptions, unknown flags refused, the pipeline made for the chosen
runner (local runs on FnApiRunner, offline)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import apache_beam as beam
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions, TestOptions
from apache_beam.portability.api import beam_provision_api_pb2
from apache_beam.runners.portability.fn_api_runner import fn_runner
from apache_beam.runners.portability.portable_runner import JobServiceHandle

from contract.cli import nearest
from contract.errors import Refused

LOCAL_RUNNERS = (None, "DirectRunner", "direct")


class OptionsError(Refused, ValueError):
    """Beam options that cannot make a pipeline (an unknown --runner, …): refused before the job."""


def unknown_flags(options: PipelineOptions) -> list[str]:
    """Flags that neither this job nor any Beam options class defines (Beam would only warn)."""
    known = options.get_all_options()
    return sorted(set(options.get_all_options(retain_unknown_options=True)) - set(known))


def pipeline_options(argv: Sequence[str], job_flags: str, own: Iterable[str] = ()) -> PipelineOptions:
    """PipelineOptions of the flags the job did not take itself; job_flags names those (for the
    message), own lists them (for the nearest-flag hint). A typo such as --outptu would otherwise
    run the default job somewhere unexpected."""
    options = PipelineOptions(list(argv))
    if unknown := unknown_flags(options):
        known = [*own, *(f"--{k}" for k in options.get_all_options())]
        hints = [f"--{u}: did you mean {g}?" for u in unknown if (g := nearest(f"--{u}", known))]
        raise OptionsError(
            f"unknown option(s) {unknown}: not a job option ({job_flags}) nor a Beam option"
            + (f" ({'; '.join(hints)})" if hints else "")
        )
    workers = options.view_as(DirectOptions).direct_num_workers
    if workers is not None and workers < 0:  # Beam itself fails with an IndexError deep in the runner
        raise OptionsError(f"--direct_num_workers={workers}: a number of workers is ≥ 1 (0: one per CPU core)")
    return options


def is_dry_run(options: PipelineOptions) -> bool:
    return bool(options.view_as(TestOptions).dry_run)


def runner_name(options: PipelineOptions) -> str:
    return options.view_as(StandardOptions).runner or "DirectRunner"


def local_runner(options: PipelineOptions):
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
        runner = local_runner(options) if options.view_as(StandardOptions).runner in LOCAL_RUNNERS else None
        return beam.Pipeline(runner=runner, options=options)
    except (ValueError, ImportError) as e:  # Beam: "Unexpected pipeline runner: …", or its extra is missing
        raise OptionsError(f"cannot set up the Beam pipeline: {e}") from None
