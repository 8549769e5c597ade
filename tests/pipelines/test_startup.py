"""The tokenize CLI's trimmed start-up (pipelines.startup): the CLI's own process leaves pandas and
pyarrow out of Beam's import, and writes exactly what the job writes in any other process."""

from __future__ import annotations

import filecmp
import gc
import os
import subprocess
import sys
from pathlib import Path

from pipelines import startup

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "pipelines.tokenize", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _imported(importtime: str) -> set[str]:
    """Module names in `python -X importtime`'s report (stderr)."""
    return {line.rsplit("|", 1)[1].strip() for line in importtime.splitlines() if line.startswith("import time:")}


def test_the_cli_writes_the_same_files_without_pandas_or_pyarrow(corpus, job_out, tmp_path):
    out = tmp_path / "cli"
    done = _cli("--mixture", str(corpus.mixture_path), "--output", str(out), "--direct_num_workers=1")
    assert done.returncode == 0, done.stderr[-3000:]
    imported = _imported(done.stderr)
    assert "apache_beam" in imported and "pipelines.job" in imported  # the report is the whole job's
    # a refused import is still reported (a few µs, no submodule); a real one loads pandas.core, pyarrow.lib…
    assert not {m for m in imported if "." in m and m.split(".")[0] in startup.OPTIONAL_IMPORTS}
    files = sorted(str(p.relative_to(job_out)) for p in job_out.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    _, mismatch, errors = filecmp.cmpfiles(job_out, out, files, shallow=False)  # job_out: in this process
    assert mismatch == [] and errors == []


def test_lean_does_nothing_in_a_process_that_already_imported_beam():
    import apache_beam  # noqa: F401  # lazy: this test's point is a process where Beam is already in

    enabled = gc.isenabled()
    assert startup.lean() is False
    assert gc.isenabled() == enabled and all(sys.modules.get(m, 0) is not None for m in startup.OPTIONAL_IMPORTS)
    startup.settle()  # nothing to undo
    assert gc.isenabled() == enabled


def test_only_the_cli_module_as_main_counts_as_the_cli():
    assert not startup._is_cli()  # pytest's __main__
