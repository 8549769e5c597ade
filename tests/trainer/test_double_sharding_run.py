"""The trainer's UNSAFE double-sharding switch end to end: it replays the bug on 2 simulated hosts
(loudly), logs what 2 real hosts would have logged, and the audit fails the run naming step 0 and
both hosts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from contract import HostRange, RunRecord
from tests.trainer.conftest import ROOT, read_jsonl, run_trainer, trainer_env


@pytest.mark.slow
def test_double_sharding_switch_replays_the_bug_and_the_audit_names_step_0_and_hosts(
    trainer_process, data_manifest, tmp_path
):
    run = tmp_path / "run"
    proc = run_trainer(
        data_manifest,
        run,
        "steps=2",
        "checkpoint.every=0",
        "eval.every=0",
        "UNSAFE_double_sharding_experiment_hosts=2",
        via=trainer_process,
    )
    assert "UNSAFE DOUBLE-SHARDING EXPERIMENT" in proc.stderr and "more than once" in proc.stderr
    logs = [read_jsonl(run / "data_log" / f"host-{h:05d}-of-00002.jsonl") for h in range(2)]
    assert [[r["step"] for r in log] for log in logs] == [[0, 1], [0, 1]]
    for log in logs:  # each simulated host reads G/H = 2 rows: one record, twice
        assert all(len(r["example"]) == 2 and r["example"][0] == r["example"][1] for r in log)
    assert RunRecord.load(str(run)).hosts == (HostRange(0, 2),)
    out = tmp_path / "audit"
    audit = subprocess.run(
        [sys.executable, "-m", "audit", "--data", str(data_manifest), "--run", str(run), "--out", str(out)],
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert audit.returncode == 1, audit.stderr[-2000:]
    run_check = json.loads((out / "audit.json").read_text())["checks"]["run"]
    assert run_check["figures"]["first_double_sharding"]["step"] == 0
    assert run_check["figures"]["first_double_sharding"]["hosts"] == [0, 1]
    assert run_check["summary"].startswith(
        "double sharding: from step 0, hosts [0, 1] each re-read positions of their own"
    )
    assert not any("read the same" in f for f in run_check["failures"])  # the hosts never overlap
