"""A SIGKILL never costs a saved checkpoint: killed at each point between two saves (tests.trainer.kill_at),
the same command resumes from the newest committed step, and the finished run is bit-identical to
an unbroken one (parameters, every loss, the data log), and `compare` of the two finds them
identical. (This chain replaced test_train_run.py's single SIGKILL once checkpoint 4 appeared: its
kill points include that one — `step:4`, deterministic rather than a race with the save — and its
compare check moved here.)"""

from __future__ import annotations

import json
import signal
import subprocess

import pytest

from tests.trainer.conftest import HANG_GUARD_S, PYTHON, ROOT, read_jsonl, run_trainer, trainer_cmd, trainer_env

# One run directory killed again and again, each start resuming where the kill before it left
# it (a run preempted repeatedly): (where it is killed, the step the next start must resume from).
# The reference run: 8 steps, evaluation after the updates 4 and 8; here a checkpoint every 2
# updates and only the newest kept (checkpoint.keep=1), so nothing older is there to fall back on.
CHAIN = [
    ("committed:2", 2),  # right after checkpoint 2 is committed
    ("step:4", 4),  # in the training step after checkpoint 4
    ("eval:6", 6),  # in the evaluation after checkpoint 6 (at update 8)
    ("written:8", 6),  # checkpoint 8 written, not yet sealed nor committed: never a step
    ("sealed:8", 6),  # checkpoint 8 sealed, not yet committed: never a step
]
OVERRIDES = ("steps=8", "checkpoint.every=2", "checkpoint.keep=1")


def killed_at(where: str, cmd: list[str]) -> subprocess.CompletedProcess:
    assert cmd[1:3] == ["-m", "trainer.main"]
    return subprocess.run(
        [PYTHON, "-m", "tests.trainer.kill_at", where, *cmd[3:]],
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )


def restored_step(stderr: str) -> int | None:
    lines = [line for line in stderr.splitlines() if "restored checkpoint " in line]
    return int(lines[-1].split("restored checkpoint ")[1].split()[0]) if lines else None


@pytest.mark.slow
def test_sigkill_at_any_point_after_a_save_resumes_from_that_step_bit_identically(
    trainer_process, reference_run, data_manifest, tmp_path
):
    cmd = trainer_cmd(data_manifest, tmp_path, *OVERRIDES)
    expected = None  # the first start finds no checkpoint
    for where, resumes_from in CHAIN:
        proc = killed_at(where, cmd)
        assert proc.returncode == -signal.SIGKILL, f"{where}: not killed ({proc.returncode}):\n{proc.stderr[-4000:]}"
        assert restored_step(proc.stderr) == expected, (where, proc.stderr[-4000:])
        assert "not intact" not in proc.stderr and "starting from step 0" not in proc.stderr
        expected = resumes_from
    final = run_trainer(data_manifest, tmp_path, *OVERRIDES, via=trainer_process)
    assert restored_step(final.stderr) == expected
    assert not (tmp_path / "checkpoints_rejected").exists()  # no step was ever set aside
    ref = json.loads((reference_run / "summary.json").read_text())
    got = json.loads((tmp_path / "summary.json").read_text())
    assert got["params_sha256"] == ref["params_sha256"] and got["data_sha256"] == ref["data_sha256"]
    assert [r["loss"] for r in read_jsonl(tmp_path / "metrics.jsonl")] == [
        r["loss"] for r in read_jsonl(reference_run / "metrics.jsonl")
    ]
    log = "data_log/host-00000-of-00001.jsonl"
    assert read_jsonl(tmp_path / log) == read_jsonl(reference_run / log)
    # compare on the two real runs (same seed and data; checkpoints every 2, not 4, change no
    # number): identical batches, zero difference, pass
    from compare import cli

    out = tmp_path.parent / f"{tmp_path.name}-compare"
    assert cli.main([str(tmp_path), str(reference_run), "--out", str(out)]) == 0
    result = json.loads((out / "compare.json").read_text())
    assert result["data"]["status"] == "identical" and result["data"]["steps_compared"] == 8
    assert result["verdict"]["passed"] is True and result["verdict"]["compared_points"] == 2
    for m in ("loss", "heldout_loss", "grad_norm", "lr"):
        assert result["aligned"][m]["max_abs_diff"] == 0.0, m
