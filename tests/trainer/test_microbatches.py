"""Gradient accumulation (``microbatches``) and the chunked loss (``loss_chunk``): the same update
as one batch with full logits, the same data, exact resume, the audit; a batch that does not
split is refused."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from tests import fast_compile
from tests.trainer.conftest import HANG_GUARD_S, ROOT, read_jsonl, run_trainer, trainer_cmd, trainer_env
from trainer import mesh as mesh_lib

STEPS = 8  # the reference run's (conftest.reference_run)
# float32, tiny model (tests/trainer/accumulate_steps.py): what regrouping the sums may change
LOSS_RTOL = 1e-6  # loss, z-loss, grad norm, held-out sums: relative
PARAMS_ATOL = 1e-5  # updated parameters after 2 steps at lr 1e-2: a thousandth of one update


@pytest.fixture(scope="module")
def accumulated():
    """The trainer's step on 4 CPU devices for microbatches 1, 2, 4 and a chunked loss."""
    # every step it compares is compiled alike in that one process (tests/fast_compile.py)
    env = fast_compile.env({**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"})
    proc = subprocess.run(
        [sys.executable, "-m", "tests.trainer.accumulate_steps"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["n2", "n4", "n2_chunk5"])
def test_microbatched_step_gives_the_loss_grad_norm_and_params_of_one_batch(accumulated, name):
    ref, got = accumulated["runs"]["n1"], accumulated["runs"][name]
    for a, b in zip(ref["metrics"], got["metrics"]):  # 2 steps: the second from the updated params
        assert a["target_tokens"] == b["target_tokens"] and a["skipped"] == b["skipped"] == 0.0
        for key in ("loss", "z_loss", "grad_norm", "eval_ce"):
            np.testing.assert_allclose(b[key], a[key], rtol=LOSS_RTOL, err_msg=key)
    for x, y in zip(ref["params"], got["params"]):
        np.testing.assert_allclose(np.asarray(y), np.asarray(x), rtol=0, atol=PARAMS_ATOL)


@pytest.mark.slow
def test_the_microbatch_split_moves_no_data_between_devices(accumulated):
    assert accumulated["split_collectives"] == []


def test_every_microbatch_takes_rows_from_every_devices_shard():
    G, D, N = 16, 4, 2
    parts = mesh_lib.split_microbatches(np.arange(G), N, D)  # global row ids per microbatch
    assert parts.shape == (N, G // N) and sorted(parts.ravel().tolist()) == list(range(G))
    for mb in parts:  # its rows, laid over D devices, are each device's own rows
        for d, rows in enumerate(mb.reshape(D, -1)):
            assert all(d * G // D <= r < (d + 1) * G // D for r in rows)


@pytest.mark.slow
def test_a_batch_that_does_not_split_into_the_microbatches_exits_2(trainer_process, data_manifest, tmp_path):
    # G 4 over 2 devices: 2 rows each, not a multiple of 3. Refused once the mesh is built, and it
    # leaves no trace, not even the run dir's parents (this case was also one of test_preflight.py's
    # test_a_refused_start_leaves_no_trace_not_even_the_run_dir starts: one start proves both now).
    # A process of its own (the real `python -m trainer.main` path of a refusal once JAX and the mesh
    # are up); the same command in the session's refusal process (tests/trainer/shared_process.py, where
    # the other start-up refusals run) must give the same exit status and output.
    cmd = trainer_cmd(data_manifest, tmp_path / "new" / "run", "steps=2", "microbatches=3")
    proc = subprocess.run(cmd, cwd=ROOT, env=trainer_env(), capture_output=True, text=True, timeout=HANG_GUARD_S)
    assert proc.returncode == 2, proc.stderr[-3000:]
    (line,) = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert line.startswith("error: mesh 1×-1×1 (data×fsdp×tensor) with global_batch_size=4 on 2 device(s)")
    assert "global_batch_size 4 does not split into microbatches=3" in line
    assert "choose microbatches dividing 2" in proc.stderr and "Traceback" not in proc.stderr
    assert [p.name for p in tmp_path.iterdir()] == []
    shared = trainer_process.run(cmd)
    errors = [line for line in shared.stderr.splitlines() if line.startswith("error:")]
    assert (shared.returncode, shared.stdout, errors) == (2, proc.stdout, [line])
    assert "Traceback" not in shared.stderr
    assert [p.name for p in tmp_path.iterdir()] == []


@pytest.mark.slow
def test_microbatched_run_reads_the_same_data_resumes_bit_identically_and_passes_the_audit(
    trainer_process, reference_run, data_manifest, tmp_path
):
    whole, resumed = tmp_path / "whole", tmp_path / "resumed"
    run_trainer(data_manifest, whole, f"steps={STEPS}", "microbatches=2", via=trainer_process)
    # The resumed run starts from the whole run's checkpoint 4 (a copy with the later step and the
    # summary removed), not from a second run stopped at 4: the first 4 updates are the same command's,
    # so checkpoint 4 is the same either way, and one trainer start (JAX, compile, 4 steps) is saved.
    shutil.copytree(whole, resumed)
    shutil.rmtree(resumed / "checkpoints" / str(STEPS))
    (resumed / "summary.json").unlink()
    proc = run_trainer(data_manifest, resumed, f"steps={STEPS}", "microbatches=2", via=trainer_process)
    assert f"restored checkpoint {STEPS // 2}" in proc.stderr
    ref, a, b = (json.loads((d / "summary.json").read_text()) for d in (reference_run, whole, resumed))
    assert a["data_sha256"] == b["data_sha256"] == ref["data_sha256"]  # the stream is the global batch's
    log = "data_log/host-00000-of-00001.jsonl"
    assert read_jsonl(whole / log) == read_jsonl(resumed / log) == read_jsonl(reference_run / log)
    assert b["params_sha256"] == a["params_sha256"]  # exact resume with N = 2
    losses = [[r["loss"] for r in read_jsonl(d / "metrics.jsonl")] for d in (reference_run, whole)]
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)  # the same training, up to rounding
    audit = subprocess.run(
        [
            sys.executable,
            "-m",
            "audit",
            "--data",
            str(data_manifest),
            "--run",
            str(resumed),
            "--out",
            str(tmp_path / "audit"),
        ],
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert audit.returncode == 0, audit.stdout[-2000:] + audit.stderr[-2000:]
