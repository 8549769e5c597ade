"""CLI argument handling of `python -m pipelines.tokenize` (no pipeline is run)."""
from __future__ import annotations

import pytest

from pipelines.mixture import DEFAULT_MIXTURE
from pipelines.tokenize import parse_args, run


def test_job_flags_are_ours_and_the_rest_go_to_beam():
    args, beam = parse_args(["--output", "o", "--runner=DirectRunner", "--direct_num_workers=2"])
    assert (args.output, args.mixture) == ("o", str(DEFAULT_MIXTURE))
    assert beam == ["--runner=DirectRunner", "--direct_num_workers=2"]


@pytest.mark.parametrize("flag", ["--outptu=x", "--direct_num_worker=2", "--mixtrue=m.yaml"])
def test_a_mistyped_flag_stops_the_job_before_it_runs(flag):
    with pytest.raises(SystemExit, match="unknown option"):
        run([flag])
