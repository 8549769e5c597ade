"""compare's messages and outputs: one `error:` line for any unusable input (exit 2),
--out checked before any work (never another command's output), the report and verdict written
with a plain file's mode, a full disk stopping it with exit 3 (never the FAIL code 1) and the
previous compare.json left whole, and a step a reference logged twice with two values refused."""

from __future__ import annotations

import csv
import os

import pytest

from compare import cli
from tests.audit import audit_fixtures as fx
from tests.audit.test_audit_outputs import run_limited
from tests.compare.test_compare import SEQ_LEN, metrics_rows, write_run
from tests.modes import modes, umask


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    manifest = fx.write_sample(str(tmp_path_factory.mktemp("data")), seq_len=SEQ_LEN)
    return write_run(str(tmp_path_factory.mktemp("run")), manifest)


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err, err
    return err


@pytest.mark.parametrize("reference", ["missing.csv", "empty.csv"])
def test_an_unusable_reference_is_one_error_line(run, tmp_path, capsys, reference):
    (tmp_path / "empty.csv").write_text("")
    assert cli.main([run, str(tmp_path / reference), "--out", str(tmp_path / "o")]) == 2
    one_error(capsys)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_an_out_that_is_or_is_under_a_file_is_refused_before_any_work(run, tmp_path, monkeypatch, capsys, where):
    blocker = tmp_path / "f"
    blocker.write_text("x")
    out = blocker if where == "a file" else blocker / "o"
    monkeypatch.setattr(cli, "judge", lambda cfg: pytest.fail("compared"))
    assert cli.main([run, run, "--out", str(out)]) == 2
    assert one_error(capsys).startswith(f"error: --out {out}")


def test_a_reference_logging_a_step_twice_with_two_values_is_refused(run, tmp_path, capsys):
    rows = metrics_rows()
    path = tmp_path / "ref.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["_step", "train/CE loss"])
        for r in rows:
            w.writerow([r["step"] + 1, r["loss"]])
        w.writerow([5, rows[4]["loss"] + 1.0])  # step 5 again, another loss
    assert cli.main([run, str(path), "--out", str(tmp_path / "o")]) == 2
    err = one_error(capsys)
    assert "step 5 logged loss twice" in err


@pytest.mark.slow  # ~8 s (a process importing matplotlib); the audit's twin and contract.write_atomic's test are not
def test_a_full_disk_stops_compare_with_exit_3_and_leaves_the_previous_verdict(run, tmp_path):
    out = tmp_path / "o"
    assert cli.main([run, run, "--out", str(out)]) == 0
    before = (out / "compare.json").read_bytes()
    r = run_limited(["-m", "compare", run, run, "--out", str(out)])
    err = r.stderr.strip()
    assert r.returncode == 3 and err.startswith("error: cannot write ") and "\n" not in err, r.stderr
    assert (out / "compare.json").read_bytes() == before
    assert sorted(os.listdir(out)) == ["compare.html", "compare.json"]


@pytest.mark.parametrize("mask,file_mode", [(0o022, 0o644), (0o077, 0o600)], ids=["umask022", "umask077"])
def test_the_report_and_its_verdict_have_a_plain_files_mode_under_the_umask(run, tmp_path, capsys, mask, file_mode):
    """Before, compare.html and compare.json were 0600 whatever the umask (mkstemp)."""
    out = tmp_path / "o"
    with umask(mask):
        assert cli.main([run, run, "--out", str(out)]) == 0
    assert modes(out, ["compare.html", "compare.json"]) == {"compare.html": file_mode, "compare.json": file_mode}
    assert modes(tmp_path, ["o"]) == {"o": 0o777 & ~mask}


def test_an_out_that_holds_a_tokenize_output_is_refused_before_any_work(run, tmp_path, monkeypatch, capsys):
    data = tmp_path / "data"
    fx.write_sample(str(data), seq_len=SEQ_LEN)
    before = sorted(os.listdir(data))
    monkeypatch.setattr(cli, "judge", lambda cfg: pytest.fail("compared"))
    assert cli.main([run, run, "--out", str(data)]) == 2
    says = f"error: --out {data} holds a tokenize output (manifest.json, written by python -m pipelines.tokenize)"
    assert one_error(capsys).startswith(says) and sorted(os.listdir(data)) == before
