"""The trainer's config system and the shipped OLMo 3 recipes."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import optim
from trainer.config import TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


def test_required_override_keys_exist_and_are_typed():
    cfg = load_config(CONFIGS / "tiny.yaml", [
        "data=x/manifest.json", "model=olmo3-small", "steps=7", "global_batch_size=4", "seed=9",
        "checkpoint_every=3", "eval_every=2", "lr=1e-3", "optimizer.mu_dtype=float64",
        "model_overrides.n_layers=2", "mesh.cpu_devices=2"])
    assert cfg.data == ("x/manifest.json",)
    assert (cfg.model, cfg.steps, cfg.global_batch_size, cfg.seed) == ("olmo3-small", 7, 4, 9)
    assert (cfg.checkpoint_every, cfg.eval_every) == (3, 2)
    assert cfg.lr == 1e-3 and isinstance(cfg.lr, float)  # YAML 1.1 reads "1e-3" as a string
    assert cfg.optimizer.mu_dtype == "float64"
    assert cfg.model_overrides == {"compute_dtype": "float32", "n_layers": 2}
    assert cfg.mesh.cpu_devices == 2


def test_unknown_or_mistyped_keys_are_rejected_with_the_valid_keys():
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['optimizer.mu_dtyp'\]"):
        load_config(None, ["optimizer.mu_dtyp=float32"])
    with pytest.raises(ValueError, match="steps='ten' is not a int"):
        load_config(None, ["steps=ten"])
    with pytest.raises(ValueError, match="not of the form key=value"):
        load_config(None, ["steps"])
    with pytest.raises(ValueError, match="schedule.kind"):
        load_config(None, ["schedule.kind=exponential"])


def test_stage1_recipe_values():
    cfg = load_config(CONFIGS / "olmo3-7b-stage1.yaml")
    assert (cfg.model, cfg.seq_len, cfg.global_batch_size, cfg.seed) == ("olmo3-7b", 8192, 512, 34521)
    o = cfg.optimizer
    assert (cfg.lr, o.b1, o.b2, o.eps, o.weight_decay, o.clip_norm) == (3e-4, 0.9, 0.95, 1e-8, 0.1, 1.0)
    assert o.decay_exclude == ("embed",) and (o.mu_dtype, o.nu_dtype) == ("float32", "float32")
    assert cfg.z_loss == 1e-5 and cfg.model_overrides["compute_dtype"] == "bfloat16"
    assert cfg.model_overrides["param_dtype"] == "float32"
    sched = optim.make_schedule(cfg)
    assert float(sched(0)) == 0.0
    assert float(sched(2000)) == pytest.approx(3e-4)
    assert float(sched(cfg.steps)) == pytest.approx(3e-5)  # cosine to 0.1 x peak
    assert float(sched(1000)) == pytest.approx(1.5e-4)
    mxu = load_config(CONFIGS / "olmo3-7b-stage1-mxu.yaml")
    assert mxu.model == "olmo3-7b-mxu" and mxu.optimizer == cfg.optimizer and mxu.steps == cfg.steps


def test_stage2_recipe_values():
    cfg = load_config(CONFIGS / "olmo3-7b-stage2.yaml")
    assert (cfg.lr, cfg.seed, cfg.global_batch_size * cfg.seq_len) == (2.0712e-4, 1337, 2 ** 21)
    assert cfg.steps * 2 ** 21 >= 100e9 > (cfg.steps - 1) * 2 ** 21
    assert cfg.checkpoint.init_from  # starts from a stage-1 checkpoint
    sched = optim.make_schedule(cfg)
    assert float(sched(0)) == pytest.approx(2.0712e-4)  # no warmup
    assert float(sched(cfg.steps // 2)) == pytest.approx(2.0712e-4 / 2, rel=1e-3)
    assert float(sched(cfg.steps)) == 0.0


def test_cpu_configs_load():
    for name in ("tiny.yaml", "small.yaml"):
        cfg = load_config(CONFIGS / name)
        assert isinstance(cfg, TrainConfig) and cfg.steps > 0


def test_7b_recipes_lower_to_an_fsdp_train_step_with_fp32_state_sharded_like_params():
    """The real 7B train step (both head layouts, stage 2 too) traced and lowered on an 8-device
    FSDP mesh, abstractly: shardings, optimizer state and recipe compose at full size."""
    root = CONFIGS.parents[1]
    names = ("olmo3-7b-stage1.yaml", "olmo3-7b-stage1-mxu.yaml", "olmo3-7b-stage2.yaml")
    proc = subprocess.run([sys.executable, str(Path(__file__).with_name("lower_recipe.py")),
                           *(str(CONFIGS / n) for n in names)], cwd=root, capture_output=True, text=True,
                          env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(root)}, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    facts = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(facts) == len(names)
    for f in facts:
        assert f["params"] == facts[0]["params"] and 7.29e9 < f["params"] < 7.31e9  # 7.298B either layout
        assert f["mesh"] == {"data": 1, "fsdp": 8, "tensor": 1}
        assert f["param_dtypes"] == ["float32"] and f["moment_dtypes"] == ["float32"]
        assert f["moments_sharded_like_params"] and "fsdp" in f["embed_sharded"]
        assert f["compute_dtype"] == "bfloat16" and f["lowered_chars"] > 0


def test_jax_coordinator_address_in_the_environment_initializes_jax_distributed(monkeypatch):
    """JAX's own environment variable is enough to join the cluster (no silent single-host run)."""
    import jax

    from trainer import main

    calls = []
    monkeypatch.setattr(jax.distributed, "initialize", lambda *a, **kw: calls.append((a, kw)))
    monkeypatch.setattr(jax.config, "update", lambda *a: None)
    cfg = load_config(None)
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    main.init_jax(main.parse_args([]), cfg)
    assert calls == []  # a plain run stays single-process
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    main.init_jax(main.parse_args(["--num_processes", "2", "--process_id", "1"]), cfg)
    assert calls == [((), {"num_processes": 2, "process_id": 1})]


def test_deterministic_gpu_kernels_are_requested_by_default_and_can_be_turned_off(monkeypatch):
    """Bit-exact resume on GPU needs deterministic scatter-adds (the embedding gradient)."""
    import jax

    from trainer import main

    monkeypatch.setattr(jax.config, "update", lambda *a: None)
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/tmp/x")
    main.init_jax(main.parse_args([]), load_config(None))
    assert os.environ["XLA_FLAGS"] == "--xla_dump_to=/tmp/x --xla_gpu_deterministic_ops=true"
    main.init_jax(main.parse_args([]), load_config(None))  # idempotent
    assert os.environ["XLA_FLAGS"].count("xla_gpu_deterministic_ops") == 1
    monkeypatch.setenv("XLA_FLAGS", "--xla_gpu_deterministic_ops=false")  # the user's choice stands
    main.init_jax(main.parse_args([]), load_config(None))
    assert os.environ["XLA_FLAGS"] == "--xla_gpu_deterministic_ops=false"
    monkeypatch.delenv("XLA_FLAGS")
    main.init_jax(main.parse_args([]), load_config(None, ["deterministic=false"]))
    assert "XLA_FLAGS" not in os.environ


def test_double_sharding_experiment_switch_is_off_by_default_and_checked():
    assert load_config(CONFIGS / "tiny.yaml").UNSAFE_double_sharding_experiment_hosts == 0
    cfg = load_config(CONFIGS / "tiny.yaml", ["UNSAFE_double_sharding_experiment_hosts=2"])
    assert cfg.UNSAFE_double_sharding_experiment_hosts == 2
    for bad in ("1", "3"):  # one host cannot double-shard; 3 does not divide the batch of 4
        with pytest.raises(ValueError, match="UNSAFE_double_sharding_experiment_hosts"):
            load_config(CONFIGS / "tiny.yaml", [f"UNSAFE_double_sharding_experiment_hosts={bad}"])
