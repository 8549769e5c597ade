"""End-to-end `python -m trainer.main` runs of the tiny model (subprocesses, CPU)."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from contract.rundir import RunDir
from tests.trainer.conftest import HANG_GUARD_S, ROOT, free_port, read_jsonl, run_trainer, trainer_cmd, trainer_env

G = 4
STEPS = 8  # the reference run (conftest.reference_run uses the same)
POLL_S = 0.05


def _summary(run_dir: Path) -> dict:
    return json.loads((run_dir / "summary.json").read_text())


def _losses(run_dir: Path) -> list[float]:
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(len(rows))), "every step logged exactly once, in order"
    return [r["loss"] for r in rows]


def _data_log(run_dir: Path, h: int, n: int) -> list[dict]:
    return read_jsonl(run_dir / "data_log" / f"host-{h:05d}-of-{n:05d}.jsonl")


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(
                f"trainer exited ({proc.returncode}) before the condition:\n{out[-2000:]}\n{err[-4000:]}"
            )
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("timed out waiting for the trainer")
        time.sleep(POLL_S)


def _popen(cmd: list[str]) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=ROOT, env=trainer_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
def test_every_file_a_run_writes_is_one_the_run_directory_value_names(reference_run):
    """contract.RunDir is the one list of a run directory's files (the audit, compare and
    trainer.downstream read them by its names): a file the trainer writes under another name fails."""
    from contract import RunDir

    names = {v for k, v in vars(RunDir).items() if k.isupper() and isinstance(v, str)}
    assert {p.name for p in reference_run.iterdir()} <= names
    run = RunDir(reference_run)
    assert run.metrics.is_file() and run.summary.is_file() and run.config.is_file() and run.run_record.is_file()
    assert run.data_logs() and (run.checkpoints / str(STEPS)).is_dir()
    assert RunDir.of_step(run.checkpoints / str(STEPS)) == RunDir(reference_run.resolve())


@pytest.mark.slow
def test_loss_decreases_and_heldout_loss_is_reported(reference_run):
    losses = _losses(reference_run)
    assert len(losses) == STEPS
    assert losses[-1] < losses[0] - 2.0, losses
    rows = read_jsonl(reference_run / "metrics.jsonl")
    held = [(r["step"], r["heldout_loss"]) for r in rows if "heldout_loss" in r]
    assert [s for s, _ in held] == [3, 7]  # every eval.every=4 updates
    assert held[-1][1] < held[0][1] < rows[0]["loss"]
    for r in rows:
        assert {"lr", "grad_norm", "tokens_per_s", "tflops_per_device", "mfu"} <= set(r)
        assert r["tokens_per_s"] > 0 and r["tflops_per_device"] > 0 and np.isfinite(r["grad_norm"])
    summary = _summary(reference_run)
    assert summary["step"] == STEPS and summary["heldout_loss"] == held[-1][1]
    assert summary["last_losses"] == losses[-len(summary["last_losses"]) :]
    assert len(summary["params_sha256"]) == len(summary["data_sha256"]) == 64
    for line in _data_log(reference_run, 0, 1):  # the host read global positions [s*G, (s+1)*G)
        assert line["index"] == list(range(line["step"] * G, (line["step"] + 1) * G))
        assert len(line["example"]) == G


# A SIGKILL after a checkpoint, then the same command: tests/trainer/test_checkpoint_sigkill.py kills one
# run at five points around its saves (after checkpoint 4 among them) and resumes it each time,
# bit-identical to reference_run and `compare`d with it.


@pytest.mark.slow
def test_sigterm_saves_a_checkpoint_and_exits_zero(data_manifest, tmp_path):
    proc = _popen(trainer_cmd(data_manifest, tmp_path, "steps=100", "checkpoint.every=0"))
    _wait_for(
        lambda: (tmp_path / "metrics.jsonl").exists() and (tmp_path / "metrics.jsonl").read_text().count("\n") >= 1,
        proc,
    )
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    steps = sorted(int(p.name) for p in (tmp_path / "checkpoints").iterdir() if p.name.isdigit())
    assert len(steps) == 1 and 1 <= steps[0] < 100  # saved at the step it stopped, not by schedule
    step_dir = tmp_path / "checkpoints" / str(steps[0])
    data = json.loads((step_dir / "data" / "metadata").read_text())  # orbax JsonSave's file
    meta = json.loads((step_dir / "meta" / "metadata").read_text())
    assert data["step"] == meta["step"] == steps[0]  # the data position matches the parameters
    assert len(read_jsonl(tmp_path / "metrics.jsonl")) == steps[0]
    assert "preempted" in err


@pytest.mark.slow
def test_bf16_optimizer_state_is_refused_without_opt_in(trainer_process, data_manifest, tmp_path):
    for override in ("optimizer.mu_dtype=bfloat16", "optimizer.nu_dtype=bfloat16"):
        proc = trainer_process.run(trainer_cmd(data_manifest, tmp_path, "steps=2", override))
        assert proc.returncode != 0
        assert "refusing low-precision optimizer state" in proc.stderr
        assert not (tmp_path / "checkpoints").exists()


@pytest.mark.slow
def test_two_processes_train_the_same_batches_as_one_and_resume_elastically(
    trainer_process, reference_run, data_manifest, tmp_path
):
    half = STEPS // 2
    port = free_port()
    procs = [
        _popen(trainer_cmd(data_manifest, tmp_path, f"steps={half}", cpu_devices=1, dist=(port, 2, i)))
        for i in range(2)
    ]
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-4000:]
    ref_log = _data_log(reference_run, 0, 1)
    hosts = [_data_log(tmp_path, h, 2) for h in range(2)]
    for s in range(half):
        a, b = hosts[0][s], hosts[1][s]
        assert a["step"] == b["step"] == s
        assert not set(a["index"]) & set(b["index"])  # disjoint host slices ...
        assert a["index"] + b["index"] == ref_log[s]["index"]  # ... that tile the same global batch
        assert a["example"] + b["example"] == ref_log[s]["example"]
    ref_losses = _losses(reference_run)
    np.testing.assert_allclose(_losses(tmp_path), ref_losses[:half], rtol=1e-5)
    # Elastic: continue the 2-process run with 1 process (2 devices) to the reference's end.
    run_trainer(data_manifest, tmp_path, f"steps={STEPS}", via=trainer_process)
    one = _data_log(tmp_path, 0, 1)
    assert one == ref_log[half:]  # the same data stream continues
    np.testing.assert_allclose(_losses(tmp_path), ref_losses, rtol=1e-4)
    assert _summary(tmp_path)["data_sha256"] == _summary(reference_run)["data_sha256"]
    from contract import HostRange, RunRecord

    assert RunRecord.load(str(tmp_path)).hosts == (HostRange(0, 2), HostRange(half, 1))  # hosts per step range


@pytest.mark.slow
def test_run_json_hands_the_run_to_the_audit(reference_run, tmp_path):
    """run.json is written at start-up (before any checkpoint) with what the audit needs: G, seed,
    the loader's plan fingerprint, the data order and the host count per step range."""
    from audit.runner import read_run
    from contract import INDEX_SHUFFLE, HostRange, RunRecord

    rec = RunRecord.load(str(reference_run))
    assert rec.global_batch_size == G and rec.seed == 0 and rec.order == INDEX_SHUFFLE
    assert rec.hosts == (HostRange(0, 1),)
    state = json.loads((reference_run / "checkpoints" / str(STEPS) / "data" / "metadata").read_text())
    assert rec.loader_fingerprint == state["fingerprint"]  # the plan the loader read
    early = tmp_path / "early"
    early.mkdir()
    (early / "run.json").write_text(json.dumps({**rec.to_json(), "seed": 1234}))
    run = read_run(RunDir(early))  # no checkpoint, no summary.json
    assert run.record.global_batch_size == G and run.record.seed == 1234 and run.summary is None


@pytest.mark.slow
def test_a_damaged_newest_checkpoint_is_skipped_and_the_resume_is_still_bit_identical(
    reference_run, resumed_past_a_damaged_step
):
    # conftest: reference_run with a flipped byte in a parameter file of checkpoint 8, run again
    run_dir, stderr = resumed_past_a_damaged_step
    assert f"checkpoint {STEPS} in" in stderr and "sha256 mismatch" in stderr
    assert "restored checkpoint 4" in stderr  # the newest intact step
    assert (run_dir / "checkpoints_rejected" / str(STEPS) / "params").is_dir()
    ref, got = _summary(reference_run), _summary(run_dir)
    assert got["params_sha256"] == ref["params_sha256"] and got["data_sha256"] == ref["data_sha256"]
    # the resumed steps' losses (the fixture dropped the log's lines before step 4 for
    # test_summary_kept.py; they were the reference's own lines, copied, not recomputed)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(4, STEPS))
    assert [r["loss"] for r in rows] == _losses(reference_run)[4:]


@pytest.mark.slow
def test_a_resume_with_other_data_or_optimizer_settings_needs_the_overrides_its_error_names(
    trainer_process, reference_run, data_manifest, tmp_path
):
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    changed = [f"steps={STEPS + 1}", "seed=1", "optimizer.b1=0.8"]
    refused = trainer_process.run(trainer_cmd(data_manifest, run_dir, *changed))
    assert refused.returncode == 2, refused.stderr[-3000:]  # the config is refused, like any bad config
    err = refused.stderr
    assert f"cannot resume from checkpoint {STEPS}" in err and "Traceback" not in err
    assert "seed: checkpoint has 0, config gives 1" in err
    assert "optimizer.b1: checkpoint has 0.9, config gives 0.8" in err
    assert "allow_mismatch=True" not in err  # the loader's Python-only hint is not shown
    hints = re.findall(r"add the override (\S+=\S+)", err)
    assert len(hints) == 2 and len(set(hints)) == 2, err[-3000:]
    assert not (run_dir / "checkpoints" / str(STEPS + 1)).exists()
    # The hinted overrides parse on the command line and let exactly this resume go ahead, loudly.
    proc = run_trainer(data_manifest, run_dir, *changed, *hints, via=trainer_process)
    assert "RESUMING WITH THE NEW SETTINGS" in proc.stderr and "optimizer.b1" in proc.stderr
    assert _summary(run_dir)["step"] == STEPS + 1
    assert [r["step"] for r in read_jsonl(run_dir / "metrics.jsonl")] == list(range(STEPS + 1))


@pytest.mark.slow
def test_a_resume_with_other_model_shapes_or_optimizer_state_is_a_refused_config_not_a_damaged_checkpoint(
    trainer_process, reference_run, data_manifest, tmp_path
):
    # Other model shapes and skip_step toggled make orbax fail on every (intact) step; the resume
    # settings are checked on the step's meta first, so the run is refused naming the keys and
    # no step is declared damaged, moved aside, or reported as "no intact checkpoint".
    run_dir = tmp_path / "run"
    shutil.copytree(reference_run, run_dir)
    steps_before = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    refused = trainer_process.run(
        trainer_cmd(
            data_manifest, run_dir, f"steps={STEPS + 1}", "skip_step.enabled=true", "model_overrides.mlp_hidden=128"
        )
    )
    err = refused.stderr
    assert refused.returncode == 2, err[-3000:]
    assert f"cannot resume from checkpoint {STEPS}" in err and "Traceback" not in err
    assert "skip_step.enabled: checkpoint has False, config gives True" in err
    assert "model.mlp_hidden: checkpoint has 192, config gives 128" in err, err[-3000:]
    assert "not intact" not in err and "no intact checkpoint" not in err and "move" not in err
    assert not (run_dir / "checkpoints_rejected").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == steps_before
    # Allowed past the settings check, orbax cannot fit the stored arrays to the config's: still
    # the config's doing (exit 2, the differing arrays named), and still nothing is moved.
    forced = trainer_process.run(
        trainer_cmd(
            data_manifest,
            run_dir,
            f"steps={STEPS + 1}",
            "skip_step.enabled=true",
            "model_overrides.mlp_hidden=128",
            "checkpoint.allow_optimizer_change=true",
        )
    )
    err = forced.stderr
    assert forced.returncode == 2, err[-3000:]
    assert f"checkpoint {STEPS} in" in err and "holds other arrays than this config makes" in err
    assert "params: layers.mlp.up_proj: checkpoint has shape (4, 64, 192), config makes (4, 64, 128)" in err, err[
        -2500:
    ]
    assert "opt_state: 34 array(s) only in the config's state, e.g. grad_norms" in err and "Traceback" not in err
    assert "not intact" not in err and not (run_dir / "checkpoints_rejected").exists()
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == steps_before


@pytest.mark.slow
def test_an_update_with_a_non_finite_loss_stops_the_run_with_an_error_and_no_checkpoint(data_manifest, tmp_path):
    # lr 1e30 is finite (config accepts it) but the first update overflows the logits: loss NaN at step 1.
    proc = subprocess.run(
        trainer_cmd(
            data_manifest,
            tmp_path,
            "steps=6",
            "lr=1e30",
            "schedule.warmup_steps=0",
            "checkpoint.every=1",
            "eval.every=0",
        ),
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=HANG_GUARD_S,
    )
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert "error: step 1: loss nan" in proc.stderr and "no longer finite" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "summary.json").exists()
    rows = read_jsonl(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1] and np.isfinite(rows[0]["loss"]) and np.isnan(rows[1]["loss"])
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["1"]  # nothing saved after it
    from trainer.checkpointing.files import verify_step

    assert verify_step(tmp_path / "checkpoints" / "1") is None  # the last good step is sealed


def test_the_data_mismatch_message_names_the_trainers_override_only_where_it_helps():
    from dataloader.checkpoint import StateMismatchError
    from trainer.loop import data_mismatch_text

    other = StateMismatchError(
        "data state does not match:",
        ("seed: checkpoint has 0, config gives 1",),
        "pass allow_mismatch=True to resume anyway",
    )
    assert data_mismatch_text(other) == (
        "data state does not match:\n  seed: checkpoint has 0, config gives 1\n"
        "to resume anyway, add the override checkpoint.allow_data_mismatch=true"
    )
    assert (
        data_mismatch_text(StateMismatchError("data state has negative step -1")) == "data state has negative step -1"
    )


def test_only_a_skipped_update_may_have_a_non_finite_loss_and_not_the_last_one():
    from trainer.loop import RunError, check_final_loss, check_finite_update

    check_finite_update(3, {"loss": 2.5, "grad_norm": 1.0, "skipped": False})
    check_finite_update(3, {"loss": float("nan"), "grad_norm": float("inf"), "skipped": True})  # dropped
    for loss, norm in ((float("nan"), 1.0), (float("inf"), 1.0), (2.5, float("nan"))):
        with pytest.raises(RunError, match="step 3: .*no longer finite"):
            check_finite_update(3, {"loss": loss, "grad_norm": norm, "skipped": False})
    check_final_loss({"step": 7, "loss": 2.5})
    check_final_loss({})  # resumed at its last step: no update ran
    with pytest.raises(RunError, match="ended with a non-finite loss .* at step 7"):
        check_final_loss({"step": 7, "loss": float("nan"), "skipped": True})
