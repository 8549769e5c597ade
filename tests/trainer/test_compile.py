"""`python -m trainer.compile`: the trainer's real step compiled for TPU topologies on this CPU
machine (libtpu from the `tpu` extra), its memory figures consistent with the state it holds, and
the refusals: a step that does not fit, a topology libtpu does not know."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import model
from tests.trainer.conftest import ROOT, trainer_env
from trainer import memory_report as report
from trainer.config.schema import load_config

TINY = str(ROOT / "trainer/configs/tiny.yaml")
SMALL = str(ROOT / "trainer/configs/small.yaml")
# olmo3-small (d_model 512: every shard a whole number of TPU tiles, so the compiler's argument bytes
# are the state's, not its layout padding) with 2 layers (the layer scan compiles once anyway)
SMALL_STEP = ("seq_len=256", "model_overrides.n_layers=2", "skip_step.enabled=true")
LIBTPU_NOISE = ("TPU_ACCELERATOR_TYPE", "TPU_WORKER_HOSTNAMES", "InitGoogle")


def compile_cmd(
    tmp_path: Path, config: str, topology: str, *args: str, timeout: int = 600
) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "compile.json"
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.compile", "--config", config, "--topology", topology, "--out", str(out), *args],
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    return proc, (json.loads(out.read_text()) if out.exists() else {})


@pytest.mark.slow
def test_small_step_compiles_for_v5e_2x2_and_its_arguments_are_params_plus_optimizer_state(tmp_path):
    """The trainer's train and eval steps (skip step on) compiled for 4 v5e chips: what the
    compiler says each device holds as arguments is the sharded params + Adam moments + skip-step
    buffers + the batch, params and moments come back as outputs and are donated (aliased), and the
    step fits a v5e's 16 GB."""
    proc, r = compile_cmd(tmp_path, SMALL, "v5e:2x2", *SMALL_STEP)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert not any(noise in proc.stdout + proc.stderr for noise in LIBTPU_NOISE)  # libtpu's warnings hidden
    assert (r["topology"], r["devices"], r["device_kind"], r["hosts"]) == ("v5e:2x2", 4, "TPU v5 lite", 1)
    assert r["mesh"] == {"data": 1, "fsdp": 4, "tensor": 1} and r["fits"] is True
    assert (r["model"], r["remat"], r["microbatches"], r["seq_len"], r["global_batch_size"]) == (
        "olmo3-small",
        "none",
        1,
        256,
        4,
    )
    cfg = load_config(SMALL, SMALL_STEP)
    model_cfg = cfg.model_cfg()
    assert r["model_flops_per_step"] == model.flops_per_token(model_cfg, 256) * 4 * 256
    st, mem = r["state_bytes_per_device"], r["per_device_bytes"]
    n_params = model.count_params(model_cfg)
    # float32 params over 4 devices: every matrix is split over fsdp (only the tiny q/k norm scales are not)
    assert n_params * 4 / 4 <= st["params"] <= n_params * 4 / 4 * 1.01
    skip_step = 2 * 128 * 4 + 3 * 4  # two float32 windows of 128 + counters, replicated
    assert st["optimizer_state"] == pytest.approx(2 * st["params"] + skip_step, abs=64)  # mu + nu + skip step
    state = st["params"] + st["optimizer_state"]
    assert mem["arguments"] == pytest.approx(state + st["batch"], rel=0.001)  # + the scalars' tiles
    assert mem["outputs"] == pytest.approx(state, rel=0.001) and mem["aliased"] == pytest.approx(state, rel=0.001)
    assert mem["arguments"] < mem["peak"] < r["hbm_bytes_per_device"]
    assert 15 * report.GIB < r["hbm_bytes_per_device"] < 16 * report.GIB  # v5e: 16 GB HBM per chip
    assert r["eval_per_device_bytes"]["arguments"] == pytest.approx(st["params"] + st["batch"], rel=0.001)
    assert r["largest_buffers"] and r["compile_seconds"] > 0 and r["eval_compile_seconds"] > 0
    assert "fits: yes" in proc.stdout


@pytest.mark.slow
def test_a_step_that_cannot_fit_exits_2_with_its_need_the_capacity_and_the_levers(tmp_path):
    # no remat, full float32 logits, 16 sequences of 8192 per v5e chip
    proc, r = compile_cmd(
        tmp_path, TINY, "v5e:2x2", "--skip_eval", "seq_len=8192", "global_batch_size=64", "loss_chunk=0"
    )
    assert proc.returncode == 2, proc.stderr[-4000:]
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "Traceback" not in proc.stderr
    assert "olmo3-tiny does not fit v5e:2x2" in error[0] and "capacity 15.75 GiB" in error[0]
    assert "RESOURCE_EXHAUSTED" in error[0] and "largest buffers:" in error[0]
    assert "100278]" in error[0]  # the compiler names the full float32 logits among them
    for lever in ("microbatches=N", "remat", "loss_chunk", "--num_slices"):
        assert lever in error[0]
    assert r["fits"] is False and r["per_device_bytes"] is None and "RESOURCE_EXHAUSTED" in r["compiler_error"]


@pytest.mark.slow
def test_one_v5e_chip_is_a_topology_and_slices_split_the_data_axis(tmp_path):
    """`v5e:1x1` (the one-chip machine) is described as one host of one chip; two such slices put
    the mesh's data axis across them, one host each, each fed its loader slice."""
    proc, r = compile_cmd(tmp_path, TINY, "v5e:1x1", "--num_slices", "2", "--skip_eval", "seq_len=128")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (r["devices"], r["hosts"], r["num_slices"]) == (2, 2, 2)
    assert r["mesh"] == {"data": 2, "fsdp": 1, "tensor": 1} and r["fits"] is True


@pytest.mark.slow
def test_an_unknown_topology_exits_2_listing_the_generations_libtpu_knows(tmp_path):
    proc, _ = compile_cmd(tmp_path, TINY, "v7x:2x2x1")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "topology 'v7x:2x2x1' is not one the installed libtpu" in proc.stderr
    for known in ("v5e:AxB", "v5p:AxBxC", "tpu7x:AxBxC"):
        assert known in proc.stderr


@pytest.mark.slow
def test_a_refused_batch_layout_exits_2_before_compiling(tmp_path):
    proc, _ = compile_cmd(tmp_path, TINY, "v5e:2x2", "seq_len=128", "microbatches=3")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "error: global_batch_size 4 does not split into microbatches=3" in proc.stderr


@pytest.mark.slow
def test_an_out_that_cannot_be_written_as_a_file_exits_2_before_compiling(tmp_path):
    """A directory (or a path under a file) as --out is refused up front, not after the compile."""
    from trainer.compile import Refused, check_out_file

    (tmp_path / "a_file").write_text("x")
    for out, says in (
        (tmp_path, "is a directory; give a file path"),
        (tmp_path / "a_file" / "c.json", "a_file is not a directory"),
    ):
        with pytest.raises(Refused, match=says):
            check_out_file(str(out))
    check_out_file(str(tmp_path / "new" / "deeper" / "c.json"))  # folders to be made: fine
    assert not (tmp_path / "new").exists()  # and nothing made by the check
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.compile", "--config", TINY, "--topology", "v5e:2x2", "--out", str(tmp_path)],
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert (
        proc.stderr.strip() == f"error: --out {tmp_path} is a directory; give a file path, e.g. --out "
        f"{tmp_path / 'compile.json'}"
    )
    assert proc.stdout == ""  # refused before the compile (which prints its table first)


MEMORY_REPORT = """Memory Space: default (color=0)
Total bytes: 203513902592 (189.54GiB)
  cumulative_size;       size;       offset; used_by_n_values; shapes_list
  ------------------------------------------------------------
   64.00GiB( 29%);   64.00GiB;      2621440;                8; f32[131072,64], 5×f32[4,16,4,1,8192,8192]
  112.96GiB( 51%);   48.96GiB;  68722098176;                4; bf16[16,8191,100278], 3×f32[16,8191,100278]
  113.00GiB( 51%);   40.0KiB;   68722098176;                1; f32[10240]

Memory Space: alt (color=1)
    6.12MiB(100%);    6.12MiB;            0;                2; 2×f32[100278,16]
"""


def test_largest_buffers_are_read_from_xlas_memory_usage_report():
    got = report.largest_buffers(MEMORY_REPORT, n=5)
    assert got == [
        {"bytes": 64 * 2**30, "shapes": "f32[131072,64], 5×f32[4,16,4,1,8192,8192]"},
        {"bytes": int(48.96 * 2**30), "shapes": "bf16[16,8191,100278], 3×f32[16,8191,100278]"},
        {"bytes": 40 * 2**10, "shapes": "f32[10240]"},
    ]  # HBM only, not the other memory space
    assert report.largest_buffers("") == []


def test_remat_is_reported_in_the_policy_names():
    assert [report.remat_name(v) for v in (True, False, "dots_saveable")] == ["full", "none", "dots_saveable"]


def test_a_peak_over_the_capacity_does_not_fit_even_when_the_compiler_accepts_it():
    ok = report.StepMemory(
        {"arguments": 1, "outputs": 1, "temporaries": 1, "aliased": 0, "generated_code": 0, "peak": 17 * report.GIB},
        1.0,
    )
    assert not ok.fits(16 * report.GIB) and ok.fits(17 * report.GIB)
    assert not report.StepMemory(None, 1.0, "RESOURCE_EXHAUSTED: ...").fits(10**15)
    r = {
        "hbm_bytes_per_device": 16 * report.GIB,
        "per_device_bytes": ok.bytes,
        "compiler_error": None,
        "model": "m",
        "topology": "v5e:2x2",
        "num_slices": 1,
        "devices": 4,
        "device_kind": "TPU v5 lite",
    }
    message = report.not_fitting_message(r)
    assert (
        message.startswith("m does not fit v5e:2x2") and "peak is 17.00 GiB per device, capacity 16.00 GiB" in message
    )
    assert "Levers: microbatches=N" in message


def test_a_kernels_scoped_vmem_refusal_is_not_reported_as_hbm():
    """The splash kernel's CompileTimeScopedVmemOom (the stage-3 recipe's first compile) is on-chip
    scratch: the message names it and the VMEM limit lever, not the HBM ones."""
    error = (
        "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem. "
        "Scoped allocation with size 17.38M and limit 16.00M exceeded scoped vmem limit by 1.38M. "
        "CompileTimeScopedVmemOom in splash_mqa_fwd_segmented_residuals"
    )
    r = {
        "hbm_bytes_per_device": 95 * report.GIB,
        "per_device_bytes": None,
        "compiler_error": error,
        "model": "m",
        "topology": "v5p:4x4x4",
        "num_slices": 1,
        "devices": 64,
        "device_kind": "TPU v5p",
    }
    message = report.not_fitting_message(r)
    assert "needs 17.38MiB of scoped VMEM (on-chip scratch, not HBM), the compiler's limit is 16.00MiB" in message
    assert "xla_tpu_scoped_vmem_limit_kib" in message and "microbatches=N" not in message
    hbm = {**r, "compiler_error": "RESOURCE_EXHAUSTED: memory required for HLO temporaries (18.50G)"}
    assert "needs 18.50GiB per device" in report.not_fitting_message(hbm)
