"""bench.mfu on a CPU: its arithmetic (model FLOPs by model.flops's convention), that it times
the trainer's own step (trainer.build.build), its profile reading, and the command end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import mfu
from tests import fast_compile

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "trainer/configs/tiny.yaml"
CPU_OVERRIDES = ["seq_len=32", "global_batch_size=2", "model_overrides.compute_dtype=float32"]


def test_rates_are_model_flops_over_the_median_step():
    import model

    cfg = model.get_config("olmo3-7b-proxy", n_layers=2)
    fpt = model.flops_per_token(cfg, 8192)  # 6 x matmul params + causal attention at S/2 (accounting)
    r = mfu.summarize(
        [1.0, 2.0, 9.0],
        tokens_per_step=4 * 8192,
        flops_per_token=fpt,
        devices=1,
        spec_tflops=197.0,
        measured_tflops=166.0,
    )
    assert r["step_s"] == 2.0 and r["tokens_per_s"] == 16384.0
    assert r["tflops_per_device"] == pytest.approx(fpt * 16384 / 1e12)
    assert r["tflops_per_device"] == pytest.approx(59.57, abs=0.01)  # 3.636 GFLOP/token x 16,384 tokens/s
    assert r["mfu_spec"] == pytest.approx(59.57 / 197, abs=1e-4)
    assert r["mfu_measured"] == pytest.approx(59.57 / 166, abs=1e-4)
    two = mfu.summarize([2.0], 4 * 8192, fpt, devices=2, spec_tflops=None, measured_tflops=None)
    assert two["tflops_per_device"] == pytest.approx(r["tflops_per_device"] / 2)
    assert two["mfu_spec"] is None and two["mfu_measured"] is None
    with pytest.raises(ValueError):
        mfu.summarize([], 1, 1.0, 1, None, None)


def test_the_ratio_is_each_layout_over_the_first():
    rows = [{"tokens_per_s": 1000.0}, {"tokens_per_s": 1124.0}]
    assert mfu.ratios(rows) == [1.0, 1.124]


def test_top_ops_sum_time_per_op_and_rank_them():
    events = [("fusion.1", 3e6, "a"), ("convolution.2", 5e6, "b"), ("fusion.1", 4e6, "c"), ("copy", 1e6, "")]
    top = mfu.top_ops(events, n=2)
    assert [t["op"] for t in top] == ["fusion.1", "convolution.2"]
    assert top[0]["ms"] == 7.0 and top[0]["count"] == 2 and top[0]["detail"] == "a"
    assert top[0]["share"] == pytest.approx(7 / 13) and top[1]["share"] == pytest.approx(5 / 13)


@pytest.mark.ci_extra  # a minute of make test's 12: CI runs it in make test-extra
@pytest.mark.slow
def test_the_benchmark_times_the_trainers_step_and_reads_its_profile(monkeypatch, tmp_path):
    """In-process worker on a CPU: the step comes from trainer.build.build (optimizer, skip step,
    z-loss, clipping: the step trainer.main runs), the profile yields the step's XLA ops."""
    import trainer.build

    built = []
    real_build = trainer.build.build

    def spy(cfg):
        built.append(real_build(cfg))
        return built[-1]

    monkeypatch.setattr(trainer.build, "build", spy)
    out = mfu._step_worker(
        str(TINY),
        CPU_OVERRIDES + ["skip_step.enabled=true", "z_loss=1e-4"],
        steps=2,
        warmup=1,
        profile=str(tmp_path / "prof"),
    )
    assert len(built) == 1 and built[0].model_cfg.name == "olmo3-tiny"
    assert out["tokens_per_step"] == 64 and len(out["step_seconds"]) == 2 and out["skipped"] == 0
    import model

    assert out["flops_per_token"] == model.flops_per_token(built[0].model_cfg, 32)
    assert out["spec_tflops"] is None and "device kind 'cpu'" in out["spec_why"]  # never a made-up peak
    assert out["peak_hbm_bytes"] is None  # a CPU reports no memory stats
    ops = out["top_ops"]
    assert ops and all(o["ms"] > 0 for o in ops) and sum(o["share"] for o in ops) <= 1.0 + 1e-9
    assert list((tmp_path / "prof" / "tiny").rglob("*.xplane.pb"))
    # the phase table: the step's scopes found in the compiled step's op names, each phase's time once
    phases = {r["phase"]: r for r in out["phases"]}
    for phase in ("LM head + loss", "optimizer update", "layer matmuls fwd", "layer matmuls bwd", "attention fwd"):
        assert phases[phase]["ms_per_step"] > 0, phase
    assert phases["host gap (device idle)"]["ms_per_step"] >= 0


@pytest.mark.ci_extra  # a minute of make test's 12: CI runs it in make test-extra
@pytest.mark.slow
def test_the_command_runs_both_layouts_on_a_cpu_and_writes_json(tmp_path):
    twin = tmp_path / "tiny-wide-heads.yaml"  # the MXU-style twin of tiny: half the heads, twice as wide
    twin.write_text(
        f"base: {TINY}\nmodel_overrides: {{compute_dtype: float32, n_heads: 2, n_kv_heads: 2, head_dim: 32}}\n"
    )
    out = tmp_path / "mfu.json"
    env = fast_compile.env({**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)})  # structure only
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "bench.mfu",
            "--configs",
            f"{TINY},{twin}",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--matmul_n",
            "128",
            "--out",
            str(out),
            *CPU_OVERRIDES,
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    rows = result["rows"]
    assert [r["heads"] for r in rows] == ["4x16", "2x32"] and result["ratios"][0] == 1.0
    matmul = result["matmul"]["matmul_tflops"]
    for r in rows:
        assert r["tokens_per_s"] > 0 and r["mfu_spec"] is None
        assert r["mfu_measured"] == pytest.approx(r["tflops_per_device"] / matmul)
    assert result["ratios"][1] == pytest.approx(rows[1]["tokens_per_s"] / rows[0]["tokens_per_s"])
    assert "| tiny.yaml | 4x16 |" in proc.stdout and "MXU/stock 1.124" in proc.stdout


def test_a_variant_naming_a_config_runs_for_that_config_only_in_order():
    s, m = "trainer/configs/olmo3-7b-proxy-v5e.yaml", "trainer/configs/olmo3-7b-proxy-v5e-mxu.yaml"
    variants = [["@olmo3-7b-proxy-v5e-mxu", "a=1"], ["b=2"], ["@olmo3-7b-proxy-v5e.yaml", "c=3", "env.X=1"]]
    assert mfu.runs([m, s], variants) == [(m, ["a=1"]), (m, ["b=2"]), (s, ["b=2"]), (s, ["c=3", "env.X=1"])]
    assert mfu.runs([s], [[]]) == [(s, [])]
    with pytest.raises(ValueError, match="names no config of --configs: @olmo3-7b-proxy-v5e-mxo"):
        mfu.runs([m, s], [["@olmo3-7b-proxy-v5e-mxo", "a=1"]])


def test_a_bad_override_is_refused_before_any_worker_runs(capsys):
    assert mfu.main(["--configs", str(TINY), "steps=0"]) == 2
    assert "error: bad trainer config: steps=0" in capsys.readouterr().err


def test_a_variant_that_fails_is_one_line_and_the_sweep_goes_on(capfd):
    """A worker whose step cannot run (here: no such JAX platform; on the chip: a kernel that does not
    fit VMEM) prints one line and exits at once, and the sweep reports it as not run; it never hangs."""
    args = ["--worker", "step", "--configs", str(TINY), "--steps", "1", "--warmup", "0", *CPU_OVERRIDES]
    assert mfu._worker(args, {"JAX_PLATFORMS": "no_such_platform"}, required=False) is None
    err = capfd.readouterr().err
    assert "bench.mfu worker tiny.yaml" in err and "Traceback" not in err
    with pytest.raises(SystemExit, match="failed"):  # a required worker stops the benchmark
        mfu._worker(args, {"JAX_PLATFORMS": "no_such_platform"})
