"""The job builds for Dataflow without being submitted (offline: --dry_run=True --no_auth),
as Beam's own dataflow_runner_test.py does."""

from __future__ import annotations

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
    assert "dry run" in capsys.readouterr().out
