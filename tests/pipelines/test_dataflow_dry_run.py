"""The job builds for Dataflow without being submitted (offline: --dry_run=True --no_auth),
as Beam's own dataflow_runner_test.py does; a local dry run builds the job and runs nothing. Each
says what it was built for."""

from __future__ import annotations

import pytest

DATAFLOW_FLAGS = [
    "--runner=DataflowRunner",
    "--project=my-project-123",
    "--region=us-central1",
    "--temp_location=gs://my-bucket/tmp",
    "--staging_location=gs://my-bucket/staging",
    "--dry_run=True",
    "--no_auth",
    "--sdk_location=container",
]


def test_job_builds_for_dataflow_with_gcs_output_without_submitting(corpus, capsys):
    from pipelines.tokenize import main, run

    result, output, options = run(
        ["--mixture", str(corpus.mixture_path), "--output", "gs://my-bucket/olmax/test/", *DATAFLOW_FLAGS]
    )
    assert output == "gs://my-bucket/olmax/test"
    job = result.job  # the Dataflow job request that would have been sent
    assert job.proto.name and job.proto.environment is not None
    labels = {t.unique_name for t in job.proto_pipeline.components.transforms.values()}
    for step in ("DocKeys", "GroupCopies", "Dedup", "TokenizeFiles", "Finalize"):
        assert step in labels
    assert main(["--mixture", str(corpus.mixture_path), "--output", "gs://b/o", *DATAFLOW_FLAGS]) == 0
    assert capsys.readouterr().out == (
        "dry run: the job was built for DataflowRunner (project my-project-123, region us-central1) and not submitted\n"
    )


@pytest.mark.parametrize("runner", [[], ["--runner=DirectRunner"]], ids=["no runner", "DirectRunner"])
def test_a_local_dry_run_builds_the_job_and_neither_runs_nor_writes_it(corpus, tmp_path, capsys, runner):
    """Before, Beam's local engine ignored --dry_run=True: the whole job ran and wrote its output
    (without the job's lock), then printed "built for None and not submitted"."""
    from pipelines.tokenize import main

    out = tmp_path / "out"
    assert main(["--mixture", str(corpus.mixture_path), "--output", str(out), "--dry_run=True", *runner]) == 0
    given = "" if runner else "no --runner given: "
    assert (
        capsys.readouterr().out
        == f"dry run: the job was built for the local runner ({given}DirectRunner) and not run\n"
    )
    assert not out.exists()
