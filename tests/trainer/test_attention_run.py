"""The trainer says which attention ran, refuses a sequence the kernel cannot tile at start-up,
and (on a TPU) trains the same loss curve with splash as with xla."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import fast_compile
from tests.trainer.conftest import ROOT, read_jsonl, trainer_cmd


@pytest.mark.slow
def test_run_record_names_the_attention_that_ran(reference_run):
    record = json.loads((reference_run / "run.json").read_text())
    assert record["model"]["attention_impl"] == "xla"  # auto on CPU


@pytest.mark.slow
def test_a_sequence_splash_cannot_tile_is_refused_at_start_up_naming_the_field(
    trainer_process, data_manifest, tmp_path
):
    proc = trainer_process.run(
        trainer_cmd(data_manifest, tmp_path / "run", "steps=1", "model_overrides.attention_impl=splash")
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    from model.config import SPLASH_BLOCK_Q

    assert (
        "error: the model config cannot run this data (seq_len 32): splash attention cannot tile sequence "
        f"length 32 with splash_block_q={SPLASH_BLOCK_Q}" in proc.stderr
    )
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run" / "run.json").exists()


# On the chip: the tiny model (head_dim 128: the TPU's lane width) on the embedded sample
# (out/sample, seq 512, built by `python -m pipelines.tokenize` when missing), 12 updates, bf16
# compute. Splash and xla compute the same function; bf16 rounding differs (splash scales q before
# its matmul, xla the float32 scores after), so the curves agree to a tolerance, not bit for bit.
TPU_LOSS_TOL = 0.02  # absolute, on losses of ~5-11 nats
SAMPLE_MANIFEST = ROOT / "out/sample/manifest.json"


def _chip_run(run_dir: Path, impl: str, caplog, *extra: str) -> list[float]:
    """trainer.main in this process: the chip is held by the process that first starts JAX's TPU
    backend (this one: conftest asked for the default backend), so a subprocess could not have it."""
    from trainer import main

    args = [
        "--config",
        str(ROOT / "trainer/configs/tiny.yaml"),
        "--run_dir",
        str(run_dir),
        "steps=12",
        "checkpoint.every=0",
        "eval.every=0",
        "downstream.every=0",  # the tiny recipe's tasks are built for the sample's seq_len 512
        "model_overrides={compute_dtype: bfloat16, n_heads: 2, n_kv_heads: 1, head_dim: 128, "
        f"attention_impl: {impl}, splash_block_q: 256, splash_block_kv: 256}}",
        *extra,
    ]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trainer.loop"):
        assert main.main(args) == 0
    assert f"attention {impl} (attention_impl={impl})" in caplog.text
    return [row["loss"] for row in read_jsonl(run_dir / "metrics.jsonl")]


@pytest.mark.slow
@pytest.mark.tpu
def test_training_with_splash_follows_the_xla_loss_curve_step_for_step(tmp_path, monkeypatch, caplog):
    monkeypatch.chdir(ROOT)  # tiny.yaml reads out/sample/manifest.json
    if not SAMPLE_MANIFEST.exists():  # what `python -m trainer.main` with no arguments would do first
        subprocess.run(
            [sys.executable, "-m", "pipelines.tokenize"],
            cwd=ROOT,
            check=True,
            timeout=600,
            env={**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"},
        )
    xla = _chip_run(tmp_path / "xla", "xla", caplog)
    splash = _chip_run(tmp_path / "splash", "splash", caplog)
    assert len(xla) == len(splash) == 12
    assert xla[-1] < xla[0] - 0.5  # it learns, so the comparison is over a moving curve
    diffs = [abs(a - b) for a, b in zip(xla, splash)]
    assert max(diffs) <= TPU_LOSS_TOL, list(zip(xla, splash))


@pytest.mark.slow
def test_the_chip_runs_command_trains_in_process_on_cpu_and_names_the_attention(data_manifest, tmp_path, caplog):
    """The on-chip run's helper (trainer.main in this process, the chip run's overrides) with xla on
    the CPU test data: it trains, and the start-up line says what ran (structure only: its programs at
    LLVM level 0, tests/fast_compile.py)."""
    with fast_compile.structure_only():
        losses = _chip_run(tmp_path / "run", "xla", caplog, f"data={data_manifest}", "steps=2")
    assert len(losses) == 2 and "remat none" in caplog.text
