"""CLI argument handling of `python -m pipelines.tokenize` (no pipeline is run)."""

from __future__ import annotations

import pytest

from pipelines.mixture import DEFAULT_MIXTURE, MixtureError
from pipelines.tokenize import main, parse_args, run


def test_job_flags_are_ours_and_the_rest_go_to_beam():
    args, beam = parse_args(["--output", "o", "--runner=DirectRunner", "--direct_num_workers=2"])
    assert (args.output, args.mixture) == ("o", str(DEFAULT_MIXTURE))
    assert beam == ["--runner=DirectRunner", "--direct_num_workers=2"]


@pytest.mark.parametrize("flag", ["--outptu=x", "--direct_num_worker=2", "--mixtrue=m.yaml"])
def test_a_mistyped_flag_stops_the_job_before_it_runs(flag):
    with pytest.raises(SystemExit, match="unknown option"):
        run([flag])


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
