"""How a run is stopped from outside (trainer/preemption.py), with real processes and real signals:
SIGTERM or a first Ctrl-C (SIGINT) on one host of several stops every host after the same step
(orbax's reached_preemption, JAX's preemption service), and the process that got it lives on to
save; on one process a first Ctrl-C saves after the current step and exits 0, and the same command
resumes bit-identically; a second Ctrl-C stops at once (exit 130, one line); a Ctrl-C during the
start-up checks leaves the run directory as it was found (one line, exit 130)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.processes import TIMEOUT_S, outputs_ok, workers
from tests.trainer.conftest import HANG_GUARD_S, PYTHON, ROOT, read_jsonl, run_trainer, trainer_cmd, trainer_env


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_sigterm_or_ctrl_c_on_one_process_stops_both_after_the_same_step(tmp_path, signum):
    with workers("tests.trainer.preemption_worker", str(tmp_path)) as procs:
        deadline = time.monotonic() + TIMEOUT_S
        while not all((tmp_path / f"pid-{i}").exists() for i in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "workers did not start"
            time.sleep(0.1)
        time.sleep(0.5)
        procs[1].send_signal(signum)
        outs = outputs_ok(procs, "STOP")
    stops = [out.split("STOP")[1].split()[0] for out in outs]
    assert stops[0] == stops[1]  # both save the same step


# ----------------------------------------------------------------------------- trainer.main, one process


def _interrupted_at(point: str, data: Path, run_dir: Path, folder: Path, *overrides: str):
    """`python -m trainer.main` (tests.trainer.interrupt_at) waiting at `point`; (process, marker, stderr file)."""
    cmd = trainer_cmd(data, run_dir, *overrides)
    marker, err = folder / "arrived", folder / "stderr.txt"
    proc = subprocess.Popen(
        [PYTHON, "-m", "tests.trainer.interrupt_at", point, str(marker), *cmd[3:]],
        cwd=ROOT,
        env=trainer_env(),
        stdout=subprocess.PIPE,
        stderr=err.open("w"),
        text=True,
    )
    _wait(lambda: marker.exists(), proc, err)
    return proc, err


def _wait(predicate, proc: subprocess.Popen, err: Path) -> None:
    deadline = time.monotonic() + HANG_GUARD_S
    while not predicate():
        if proc.poll() is not None:
            raise AssertionError(f"the trainer exited ({proc.returncode}) too early:\n{err.read_text()[-4000:]}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the trainer")
        time.sleep(0.05)


def _finish(proc: subprocess.Popen, err: Path) -> str:
    proc.communicate(timeout=HANG_GUARD_S)
    return err.read_text()


def _steps(run_dir: Path) -> list[int]:
    folder = run_dir / "checkpoints"
    return sorted(int(p.name) for p in folder.iterdir() if p.name.isdigit()) if folder.is_dir() else []


def _same_as_reference(run_dir: Path, reference_run: Path) -> None:
    ref = json.loads((reference_run / "summary.json").read_text())
    got = json.loads((run_dir / "summary.json").read_text())
    assert got["params_sha256"] == ref["params_sha256"] and got["data_sha256"] == ref["data_sha256"]
    losses = [r["loss"] for r in read_jsonl(run_dir / "metrics.jsonl")]
    assert losses == [r["loss"] for r in read_jsonl(reference_run / "metrics.jsonl")]


@pytest.mark.slow
def test_a_first_ctrl_c_saves_after_the_current_step_exits_0_and_the_same_command_resumes_bit_identically(
    trainer_process, reference_run, data_manifest, tmp_path
):
    run_dir = tmp_path / "run"
    proc, err = _interrupted_at("step:2:1", data_manifest, run_dir, tmp_path, "steps=8")  # in step 2
    proc.send_signal(signal.SIGINT)
    stderr = _finish(proc, err)
    assert proc.returncode == 0, stderr[-4000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert "Ctrl-C: will checkpoint after the current step" in stderr
    assert "rerun the same command to resume" in stderr
    assert _steps(run_dir) == [3]  # after step 2 (update 3), not by schedule (checkpoint.every=4)
    resumed = run_trainer(data_manifest, run_dir, "steps=8", via=trainer_process)
    assert "restored checkpoint 3" in resumed.stderr
    _same_as_reference(run_dir, reference_run)


@pytest.mark.slow
def test_a_second_ctrl_c_stops_at_once_in_one_line_with_exit_130_and_nothing_half_written(
    trainer_process, reference_run, data_manifest, tmp_path
):
    run_dir = tmp_path / "run"
    proc, err = _interrupted_at("step:5:2", data_manifest, run_dir, tmp_path, "steps=8")  # after checkpoint 4
    _wait(lambda: _steps(run_dir) == [4], proc, err)  # committed (orbax's thread: a save under way would be lost)
    proc.send_signal(signal.SIGINT)
    _wait(lambda: "Ctrl-C: will checkpoint" in err.read_text(), proc, err)
    proc.send_signal(signal.SIGINT)
    stderr = _finish(proc, err)
    assert proc.returncode == 130, stderr[-4000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    after = stderr.split("Ctrl-C: will checkpoint")[1].splitlines()[1:]
    assert after == [
        "interrupted: stopped at once without saving (Ctrl-C twice); "
        "rerun the same command to resume from the newest intact checkpoint"
    ]
    assert _steps(run_dir) == [4]  # nothing saved at the interrupt
    resumed = run_trainer(data_manifest, run_dir, "steps=8", via=trainer_process)
    assert "restored checkpoint 4" in resumed.stderr
    _same_as_reference(run_dir, reference_run)


@pytest.mark.slow
def test_a_ctrl_c_during_the_start_up_checks_leaves_the_run_dir_as_found_and_says_so_in_one_line(
    data_manifest, tmp_path
):
    from trainer.main import STARTUP_INTERRUPTED

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("mine")
    proc, err = _interrupted_at("lock", data_manifest, run_dir, tmp_path, "steps=8")  # the lock is taken
    proc.send_signal(signal.SIGINT)
    stderr = _finish(proc, err)
    assert proc.returncode == 130, stderr[-4000:]
    assert "Traceback" not in stderr and "KeyboardInterrupt" not in stderr
    assert stderr.splitlines()[-1] == STARTUP_INTERRUPTED
    assert sorted(p.name for p in run_dir.iterdir()) == ["notes.txt"]  # no lock file, no record, no checkpoints
    assert (run_dir / "notes.txt").read_text() == "mine"
