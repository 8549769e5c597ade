"""CLI argument handling of `python -m pipelines.tokenize` (no pipeline is run)."""

from __future__ import annotations

import pytest

from pipelines.beam_options import OptionsError, is_dry_run, pipeline_options
from pipelines.mixture import DEFAULT_MIXTURE, MixtureError
from pipelines.tokenize import main, parse_args, run


def test_job_flags_are_ours_and_the_rest_go_to_beam():
    args, beam = parse_args(["--output", "o", "--runner=DirectRunner", "--direct_num_workers=2"])
    assert (args.output, args.mixture) == ("o", str(DEFAULT_MIXTURE))
    assert beam == ["--runner=DirectRunner", "--direct_num_workers=2"]


@pytest.mark.parametrize(
    "argv,near",
    [
        (["--outptu", "x"], "--outptu: did you mean --output?"),
        (["--outptu=x"], "--outptu: did you mean --output?"),
        (["--direct_num_worker=2"], "--direct_num_worker: did you mean --direct_num_workers?"),
        (["--mixtrue=m.yaml"], "--mixtrue: did you mean --mixture?"),
    ],
)
def test_a_mistyped_flag_is_one_error_line_naming_the_nearest_and_exit_2(tmp_path, capsys, argv, near):
    """Before: exit 1, Beam's "Discarding unparseable args" warning twice, and no `error:` prefix."""
    with pytest.raises(OptionsError, match="unknown option"):
        run(argv)
    capsys.readouterr()
    assert main([*argv, "--output", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1, captured.err
    assert captured.err.startswith(f"error: unknown option(s) {argv[0].split('=')[0]}: not a job option")
    assert near in captured.err and "Discarding" not in captured.err and not (tmp_path / "out").exists()


@pytest.mark.parametrize("argv", [["out/x"], ["-o", "x"]])
def test_an_argument_beam_would_silently_drop_is_refused(tmp_path, capsys, argv):
    """Beam drops a stray value or a single-dash flag with a warning: the job would then run into
    the default output."""
    assert main([*argv, "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: unexpected argument(s) {' '.join(argv)}") and err.count("\n") == 1, err
    assert not (tmp_path / "out").exists()


def test_real_beam_options_pass_whatever_their_spelling():
    argv = [
        "--runner=DirectRunner",
        "--direct_num_workers",
        "2",
        "--direct_running_mode=multi_threading",
        "--project=p",
        "--region",
        "us-central1",
        "--temp_location=/tmp/t",
        "--no_auth",
        "--dry_run=True",
    ]
    options = pipeline_options(argv, "job flags")
    got = options.get_all_options()
    assert (got["direct_num_workers"], got["direct_running_mode"], got["project"], got["region"]) == (
        2,
        "multi_threading",
        "p",
        "us-central1",
    )
    assert got["temp_location"] == "/tmp/t" and got["no_auth"] is True and is_dry_run(options)
    with pytest.raises(OptionsError, match="argument --direct_num_workers: invalid int value: 'two'"):
        pipeline_options(["--direct_num_workers=two"], "job flags")


@pytest.mark.parametrize("value,dry", [("True", True), ("true", True), ("False", False), ("false", False)])
def test_dry_run_is_true_or_false_as_written(value, dry):
    """Beam keeps --dry_run's value as a string, so "False" was a (truthy) dry run: a local
    `--dry_run=False` then built the job and ran nothing, exit 0."""
    options = pipeline_options([f"--dry_run={value}"], "job flags")
    assert is_dry_run(options) is dry and options.get_all_options()["dry_run"] is dry


@pytest.mark.parametrize("value", ["maybe", "0", ""])
def test_a_dry_run_value_that_is_neither_true_nor_false_is_refused(tmp_path, capsys, value):
    assert main([f"--dry_run={value}", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"error: --dry_run={value}: expected True or False\n" and not (tmp_path / "out").exists()


def test_engine_flags_are_ours_and_a_bad_crosscheck_rate_stops_the_job():
    args, beam = parse_args(["--tokenizer_engine=tiktoken", "--tokenizer_crosscheck=all", "--direct_num_workers=2"])
    assert (args.tokenizer_engine, args.tokenizer_crosscheck, beam) == ("tiktoken", "all", ["--direct_num_workers=2"])
    assert parse_args(["--tokenizer_crosscheck=0.5"])[0].tokenizer_crosscheck == 0.5
    assert (parse_args([])[0].tokenizer_engine, parse_args([])[0].tokenizer_crosscheck) == (None, None)
    for bad in ("2", "some", "-0.1"):
        with pytest.raises(SystemExit):
            parse_args([f"--tokenizer_crosscheck={bad}"])
    with pytest.raises(MixtureError, match="unknown tokenizer engine"):
        run(["--tokenizer_engine=fasttok"])


def test_an_unknown_engine_is_one_error_line_and_exit_2(tmp_path, capsys):
    assert main(["--tokenizer_engine=fasttok", "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown tokenizer engine 'fasttok'") and "Traceback" not in err
    assert not (tmp_path / "out").exists()
