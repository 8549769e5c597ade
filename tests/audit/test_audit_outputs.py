"""Where the audit writes: --out checked before any work (a file, a folder under a file, another
command's output: one `error:` line, exit 2), report.html and audit.json written atomically with a
plain file's mode, and a write that fails (a full disk) is one `error:` line with exit 3, never the
FAIL code 1, leaving the previous audit.json."""

from __future__ import annotations

import os
import resource
import signal
import subprocess
import sys

import pytest

import audit.__main__ as audit_main
from tests.audit import audit_fixtures as fx
from tests.modes import modes, umask

FILE_LIMIT = 4096  # bytes any file of the limited process may hold


def run_limited(args: list[str]) -> subprocess.CompletedProcess:
    """`python ARGS` whose files cannot grow past FILE_LIMIT bytes: a write past it fails with
    EFBIG (SIGXFSZ ignored), as a full disk fails one with ENOSPC."""

    def limit():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_LIMIT, FILE_LIMIT))

    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, preexec_fn=limit, env=env)


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return fx.write_sample(str(tmp_path_factory.mktemp("data")))


@pytest.mark.parametrize("where", ["a file", "under a file"])
def test_an_out_that_is_or_is_under_a_file_is_refused_before_any_work(manifest, tmp_path, monkeypatch, capsys, where):
    blocker = tmp_path / "report"
    blocker.write_text("not a folder")
    out = blocker if where == "a file" else blocker / "sub"
    import audit.runner  # the command imports the runner (and Beam) where it runs, after its flags

    monkeypatch.setattr(audit.runner, "run_audit", lambda cfg: pytest.fail("the audit ran"))
    assert audit_main.main(["--data", manifest, "--data-checks", "none", "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --out {out}") and "\n" not in err
    assert blocker.read_text() == "not a folder"


def test_a_full_disk_stops_the_audit_with_exit_3_and_leaves_the_previous_verdict(manifest, tmp_path, capsys):
    """The kernel refuses the writes past 4 KiB (RLIMIT_FSIZE: EFBIG, as a full disk's ENOSPC):
    before, audit.json was cut short or report.html left empty, with a traceback and exit 1."""
    out = tmp_path / "out"
    assert audit_main.main(["--data", manifest, "--data-checks", "none", "--out", str(out)]) == 0
    before = {p: (out / p).read_bytes() for p in ("audit.json", "report.html")}
    r = run_limited(["-m", "audit", "--data", manifest, "--data-checks", "none", "--out", str(out)])
    err = r.stderr.strip()
    assert r.returncode == 3 and err.startswith("error: cannot write ") and "\n" not in err, r.stderr
    assert {p: (out / p).read_bytes() for p in before} == before  # the old verdict and report, whole
    assert sorted(os.listdir(out)) == ["audit.json", "report.html"]  # no temporary file left


def test_an_unreadable_input_is_one_error_line(tmp_path, capsys):
    assert audit_main.main(["--data", str(tmp_path / "nope" / "manifest.json"), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err


def test_steps_past_int64_positions_are_refused_before_any_check(manifest, tmp_path, capsys):
    out = tmp_path / "o"
    assert (
        audit_main.main(["--data", manifest, "--steps", str(10**20), "--data-checks", "none", "--out", str(out)]) == 2
    )
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --steps 100000000000000000000 × global batch 8") and "\n" not in err
    assert not out.exists()


@pytest.mark.parametrize(
    "mask,file_mode,dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)], ids=["umask022", "umask077"]
)
def test_the_report_and_its_verdict_have_a_plain_files_mode_under_the_umask(
    manifest, tmp_path, capsys, mask, file_mode, dir_mode
):
    """Before, report.html and audit.json were 0600 whatever the umask (mkstemp): teammates and a
    web server could not read them, while the shards and metrics beside them were 0644."""
    out = tmp_path / "reports" / "audit"
    with umask(mask):
        assert audit_main.main(["--data", manifest, "--data-checks", "none", "--out", str(out)]) == 0
    assert modes(out, ["audit.json", "report.html"]) == {"audit.json": file_mode, "report.html": file_mode}
    assert modes(tmp_path, ["reports", "reports/audit"]) == {"reports": dir_mode, "reports/audit": dir_mode}


def test_an_out_that_holds_a_training_run_is_refused_before_any_work(manifest, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    fx.write_run_logs(str(run), manifest, hosts=1, steps=2, global_batch_size=8)
    before = sorted(os.listdir(run))
    import audit.runner  # the command imports the runner (and Beam) where it runs, after its flags

    monkeypatch.setattr(audit.runner, "run_audit", lambda cfg: pytest.fail("the audit ran"))
    assert audit_main.main(["--data", manifest, "--data-checks", "none", "--out", str(run)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --out {run} holds a training run (run.json, written by python -m trainer.main)")
    assert "\n" not in err and sorted(os.listdir(run)) == before
