"""A run that evaluates every held-out set on its own, as OLMo-core's padded instances, and logs to
TensorBoard and W&B (offline), killed after a checkpoint and resumed: one run, many assertions."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from contract import Manifest
from dataloader import heldout
from tests.dataloader.olmo_fixtures import write_validation_mix
from tests.trainer.conftest import HANG_GUARD_S, ROOT, SEQ_LEN, read_jsonl, run_trainer, trainer_cmd, trainer_env
from trainer import trackers

STEPS, G, EVAL_BATCHES = 8, 4, 1


def wandb_env(root: Path) -> dict[str, str]:
    """W&B offline with every folder it writes under `root`: nothing is contacted, nothing written elsewhere."""
    return {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DISABLE_CODE": "true",
        "WANDB_CONFIG_DIR": str(root / "wandb-config"),
        "WANDB_CACHE_DIR": str(root / "wandb-cache"),
        "WANDB_DATA_DIR": str(root / "wandb-data"),
    }


@pytest.fixture(scope="module")
def validation_manifest(tmp_path_factory) -> Path:
    _, manifest = write_validation_mix(str(tmp_path_factory.mktemp("validation")), SEQ_LEN)
    return Path(manifest)


@pytest.fixture(scope="module")
def eval_run(data_manifest, validation_manifest, tmp_path_factory):
    """The trainer's data plus AI2's validation sets (in small), padded evaluation, both trackers;
    SIGKILLed once checkpoint 4 exists and steps past it are logged, then the same command again."""
    root = tmp_path_factory.mktemp("eval_run")
    run_dir = root / "run"
    overrides = [
        f"data=[{data_manifest},{validation_manifest}]",
        "eval.instances=padded",
        f"steps={STEPS}",
        f"eval_batches={EVAL_BATCHES}",
        "log.tensorboard=true",
        "log.wandb={project: olmax-tests, mode: offline}",
    ]
    env = {**trainer_env(), **wandb_env(root)}
    proc = subprocess.Popen(
        trainer_cmd(data_manifest, run_dir, *overrides),
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + HANG_GUARD_S
    while not ((run_dir / "checkpoints" / "4").is_dir() and metrics.exists() and metrics.read_text().count("\n") >= 6):
        assert proc.poll() is None, proc.communicate()[1][-4000:]
        assert time.monotonic() < deadline, "timed out waiting for the trainer"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert not (run_dir / "summary.json").exists(), "killed before it finished"
    os.environ.update(wandb_env(root))  # run_trainer's environment
    try:
        resumed = run_trainer(data_manifest, run_dir, *overrides)
    finally:
        for k in wandb_env(root):
            os.environ.pop(k, None)
    return run_dir, resumed.stdout, [Manifest.load(str(data_manifest)), Manifest.load(str(validation_manifest))]


@pytest.mark.slow
def test_each_heldout_set_is_logged_and_their_token_weighted_mean_is_the_overall(eval_run):
    run_dir, _, manifests = eval_run
    rows = read_jsonl(run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS))
    labels = heldout.choose_sets(manifests, None)
    assert labels[0] == "prose" and len(labels) == 12  # the mixture's held-out share and AI2's 11 sets
    evals = [r for r in rows if "heldout_loss" in r]
    assert [r["step"] for r in evals] == [3, 7]
    for r in evals:
        assert {k for k in r if k.startswith("heldout/")} == {
            f"heldout/{x}/{w}" for x in labels for w in ("loss", "tokens")
        }
        tokens = {x: r[f"heldout/{x}/tokens"] for x in labels}
        mean = sum(r[f"heldout/{x}/loss"] * tokens[x] for x in labels) / sum(tokens.values())
        assert r["heldout_loss"] == pytest.approx(mean, rel=1e-12) and r["heldout_tokens"] == sum(tokens.values())
        assert len({r[f"heldout/{x}/loss"] for x in labels}) == len(labels)  # each set its own number
        # what decides the examples evaluated, recorded with each evaluation (compare checks it)
        assert r["eval_settings"] == {"instances": "padded", "batches": EVAL_BATCHES, "global_batch_size": G}


@pytest.mark.slow
def test_padded_evaluation_counts_olmo_cores_targets_of_the_first_batches_of_each_set(eval_run):
    """eval.instances=padded wired end to end: each set's target tokens are those of its first
    eval_batches × G padded instances (dataloader.heldout, tested equal to OLMo-core's)."""
    run_dir, _, manifests = eval_run
    row = read_jsonl(run_dir / "metrics.jsonl")[-1]
    labels = heldout.choose_sets(manifests, None)
    for s in heldout.open_sets(manifests, labels, heldout.PADDED):
        n = s.size(EVAL_BATCHES * G)
        _, lengths = s.spans()
        assert row[f"heldout/{s.label}/tokens"] == float(np.maximum(lengths[:n] - 1, 0).sum()), s.label
        s.source.close()


@pytest.mark.slow
def test_tensorboard_holds_every_scalar_of_metrics_jsonl_at_its_step_after_a_kill_and_resume(eval_run):
    from tensorboard.backend.event_processing import event_accumulator as ea

    run_dir, _, _ = eval_run
    assert len(list((run_dir / "tensorboard").glob("events.out.tfevents.*"))) == 2  # one per start
    acc = ea.EventAccumulator(str(run_dir / "tensorboard"), size_guidance={ea.SCALARS: 0})
    acc.Reload()
    want: dict[str, list[tuple[int, float]]] = {}
    for r in read_jsonl(run_dir / "metrics.jsonl"):
        for tag, value in trackers.scalars(r).items():
            want.setdefault(tag, []).append((r["step"], value))
    assert set(acc.Tags()["scalars"]) == set(want)
    assert {
        "train/CE loss",
        "optim/total grad norm",
        "optim/LR (group 0)",
        "throughput/total tokens",
        "eval/lm/c4_en-validation/CE loss",
        "eval/lm/c4_en-validation/PPL",
        "eval/lm/overall/CE loss",
    } <= set(want)
    for tag, points in want.items():
        got = [(e.step, e.value) for e in acc.Scalars(tag)]
        assert [s for s, _ in got] == [s for s, _ in points], tag  # no step missing, none twice
        # the resumed run's values (tokens/s differ between the two starts): float32 in the events
        assert [v for _, v in got] == [float(np.float32(v)) for _, v in points], tag


@pytest.mark.slow
def test_wandb_offline_writes_its_run_and_the_resume_continues_the_same_run_id(eval_run, validation_manifest):
    run_dir, _, manifests = eval_run
    run_id = json.loads((run_dir / "trackers.json").read_text())["wandb_run_id"]
    runs = sorted((run_dir / "wandb").glob("offline-run-*"))
    assert len(runs) == 2 and all(p.name.endswith(f"-{run_id}") for p in runs)  # one per start, one id
    assert (runs[0] / f"run-{run_id}.wandb").is_file()  # the killed start's (what it flushed)
    data = (runs[1] / f"run-{run_id}.wandb").read_bytes()  # the resumed start's, closed properly
    assert all(m.fingerprint.encode() in data for m in manifests)  # the config holds the fingerprints
    assert b"eval/lm/c4_en-validation/CE loss" in data and b"train/CE loss" in data


@pytest.mark.slow
def test_the_progress_line_shows_each_sets_latest_heldout_loss(eval_run):
    run_dir, stdout, _ = eval_run
    last = read_jsonl(run_dir / "metrics.jsonl")[-1]
    line = next(x for x in stdout.splitlines() if x.startswith(f"step {STEPS - 1:>6} ({STEPS}/{STEPS})"))
    assert "ETA" in line and "tok/s" in line
    assert (
        f"heldout_loss {last['heldout_loss']:.4f}" in line  # each value under its metrics.jsonl key
        and f"heldout/c4_en-validation/loss {last['heldout/c4_en-validation/loss']:.4f}" in line
    )
    lines = [x for x in stdout.splitlines() if x.startswith("step ")]
    printed = {int(x.split()[1]): x for x in lines}  # row step (as metrics.jsonl numbers it) → its line
    evals = {r["step"] for r in read_jsonl(run_dir / "metrics.jsonl") if "heldout_loss" in r}
    assert {s for s, x in printed.items() if "heldout" in x} == evals & set(printed)  # only after an evaluation


def test_each_evaluation_row_records_the_settings_that_chose_its_examples(monkeypatch):
    """Pure: the evaluator's row carries eval.instances, eval_batches and G beside the losses."""
    from trainer import heldout_eval

    ev = heldout_eval.Evaluator(
        None, [], None, global_batch_size=8, max_batches=2, process_index=0, process_count=1, instances="padded"
    )
    monkeypatch.setattr(ev, "sums", lambda params: {"a": (10.0, 5.0)})
    row = ev(None)
    assert row[heldout_eval.SETTINGS] == {"instances": "padded", "batches": 2, "global_batch_size": 8}
    assert row["heldout/a/loss"] == 2.0 and not any("settings" in tag for tag in trackers.scalars(row))  # no scalar
