"""The trainer's config system and the shipped OLMo 3 recipes."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import optim
from trainer.config.schema import TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"


def test_required_override_keys_exist_and_are_typed():
    cfg = load_config(
        CONFIGS / "tiny.yaml",
        [
            "data=x/manifest.json",
            "model=olmo3-small",
            "steps=7",
            "global_batch_size=4",
            "seed=9",
            "checkpoint.every=3",
            "eval.every=2",
            "lr=1e-3",
            "optimizer.mu_dtype=float64",
            "model_overrides.n_layers=2",
            "mesh.cpu_devices=2",
        ],
    )
    assert cfg.data == ("x/manifest.json",)
    assert (cfg.model, cfg.steps, cfg.global_batch_size, cfg.seed) == ("olmo3-small", 7, 4, 9)
    assert (cfg.checkpoint.every, cfg.eval.every) == (3, 2)
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
    assert (cfg.loss_chunk, cfg.microbatches) == (1024, 1)  # memory levers (bench/RESULTS.md, issue 21)
    sched = optim.make_schedule(cfg)
    assert float(sched(0)) == 0.0
    assert float(sched(2000)) == pytest.approx(3e-4)
    assert float(sched(cfg.steps)) == pytest.approx(3e-5)  # cosine to 0.1 x peak
    assert float(sched(1000)) == pytest.approx(1.5e-4)
    mxu = load_config(CONFIGS / "olmo3-7b-stage1-mxu.yaml")
    assert mxu.model == "olmo3-7b-mxu" and mxu.optimizer == cfg.optimizer and mxu.steps == cfg.steps


def test_stage2_recipe_values():
    cfg = load_config(CONFIGS / "olmo3-7b-stage2.yaml")
    # AI2's model, padded vocabulary as AI2 trains it (it continues AI2's stage-1 checkpoint); stage 1's settings kept
    mc, stage1 = cfg.model_cfg(), load_config(CONFIGS / "olmo3-7b-stage1.yaml").model_cfg()
    assert (mc.padded_vocab_size, mc.scored_vocab_size, mc.vocab_size) == (100352, 100352, 100278)
    assert dataclasses.replace(mc, vocab_pad_multiple=None, vocab_padding="masked") == stage1
    assert (cfg.lr, cfg.seed, cfg.global_batch_size * cfg.seq_len) == (2.0712e-4, 1337, 2**21)
    assert cfg.steps * 2**21 >= 100e9 > (cfg.steps - 1) * 2**21
    assert cfg.checkpoint.init_from  # starts from a stage-1 checkpoint
    sched = optim.make_schedule(cfg)
    assert float(sched(0)) == pytest.approx(2.0712e-4)  # no warmup
    assert float(sched(cfg.steps // 2)) == pytest.approx(2.0712e-4 / 2, rel=1e-3)
    assert float(sched(cfg.steps)) == 0.0


def test_cpu_configs_load():
    for name in ("tiny.yaml", "small.yaml"):
        cfg = load_config(CONFIGS / name)
        assert isinstance(cfg, TrainConfig) and cfg.steps > 0


@pytest.mark.slow
def test_7b_recipes_lower_to_an_fsdp_train_step_with_fp32_state_sharded_like_params():
    """The real 7B train step (both head layouts, stage 2 too) traced and lowered on an 8-device
    FSDP mesh, abstractly: shardings, optimizer state and recipe compose at full size."""
    root = CONFIGS.parents[1]
    names = ("olmo3-7b-stage1.yaml", "olmo3-7b-stage1-mxu.yaml", "olmo3-7b-stage2.yaml")
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("lower_recipe.py")), *(str(CONFIGS / n) for n in names)],
        cwd=root,
        capture_output=True,
        text=True,
        env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(root)},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    facts = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert len(facts) == len(names)
    for f in facts:
        # 7.298B either layout; stage 2 is AI2's model with its padded vocabulary: 2 x 74 x 4096 more
        padded = 2 * (100352 - 100278) * 4096 if f["padded_vocab"] else 0
        assert f["params"] - padded == facts[0]["params"] and 7.29e9 < f["params"] < 7.31e9
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


# ----------------------------------------------------------------------------- values that cannot be right

# One refused value per numeric field (dotted key → override value); the test below checks that
# this table covers every numeric field of the dataclasses, so a new field needs a rule.
OUT_OF_RANGE = {
    "data_weights": "{prose: -1}",
    "steps": "0",
    "global_batch_size": "-4",
    "seq_len": "0",
    "seed": "-1",
    "init_seed": "-1",
    "lr": "-1e-3",
    "z_loss": "-1e-5",
    "checkpoint.every": "-1",
    "eval.every": "-1",
    "eval_batches": "0",
    "optimizer.b1": "2",
    "optimizer.b2": "1",
    "optimizer.eps": "0",
    "optimizer.weight_decay": "-0.1",
    "optimizer.clip_norm": "0",
    "schedule.warmup_steps": "-1",
    "schedule.final_lr_ratio": "-1",
    "schedule.decay_steps": "0",
    "schedule.step_offset": "-1",
    "skip_step.sigma": "0",
    "skip_step.window": "1",
    "skip_step.min_history": "1",
    "mesh.data": "0",
    "mesh.fsdp": "-2",
    "mesh.tensor": "0",
    "mesh.context": "0",
    "mesh.cpu_devices": "-1",
    "checkpoint.keep": "0",
    "checkpoint.keep_period": "0",
    "log.peak_tflops_per_device": "-1",
    "log.progress_every": "-1",
    "UNSAFE_double_sharding_experiment_hosts": "1",
    "verify_data_gib": "-1",
    "verify_data_sample": "-1",
    "microbatches": "0",
    "loss_chunk": "-1",
    "downstream.every": "-1",
    "downstream.batch_size": "0",
}
ACCEPTED = {
    "optimizer.b1": "0",
    "optimizer.b2": "0.999",
    "schedule.final_lr_ratio": "1",
    "lr": "0",
    "checkpoint.keep": "1",
    "mesh.fsdp": "-1",
    "data_weights": "{a: 0, b: 1}",
    "verify_data_gib": "0",
    "verify_data_sample": "0",
    "microbatches": "1",
    "loss_chunk": "0",
    "downstream.every": "0",
}


def _numeric_fields(cls, prefix=""):
    """Dotted keys of every int/float field (optional ones too) and float-valued mappings."""
    import typing

    from pydantic import BaseModel

    out = {}
    for name, tp in typing.get_type_hints(cls).items():
        if name not in cls.model_fields:  # pydantic's own class variables
            continue
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            out.update(_numeric_fields(tp, f"{prefix}{name}."))
        elif (
            tp in (int, float)
            or (args and args[0] in (int, float))
            or (args and typing.get_args(args[0])[-1:] == (float,))
        ):
            out[prefix + name] = args[0] if args else tp
    return out


def test_every_numeric_field_refuses_non_finite_and_impossible_values_naming_the_key():
    fields = _numeric_fields(TrainConfig)
    assert set(OUT_OF_RANGE) == set(fields)  # every numeric field is covered (and has a rule)
    for key, value in OUT_OF_RANGE.items():
        with pytest.raises(ValueError, match=rf"bad trainer config: {re.escape(key)}\b.*must be"):
            load_config(None, [f"{key}={value}"])
    for key, tp in fields.items():
        if tp is float:
            for bad in (".inf", "-.inf", ".nan", "'inf'"):
                with pytest.raises(ValueError, match=rf"{re.escape(key)}=(-?inf|nan) is not a finite number"):
                    load_config(None, [f"{key}={bad}"])
    for key, value in ACCEPTED.items():  # the boundaries that are right stay accepted
        load_config(None, [f"{key}={value}"])
    # non-finite numbers anywhere, nested mappings included
    with pytest.raises(ValueError, match=r"model_overrides\.rope_theta=nan is not a finite number"):
        load_config(None, ["model_overrides.rope_theta=.nan"])
    with pytest.raises(ValueError, match=r"data_weights\.web=inf is not a finite number"):
        load_config(None, ["data_weights={prose: 1, web: .inf}"])
    with pytest.raises(ValueError, match="skip_step.min_history=200 must be <= skip_step.window=128"):
        load_config(None, ["skip_step.min_history=200"])
    with pytest.raises(ValueError, match="data must name at least one manifest"):
        load_config(None, ["data=[]"])


def test_checkpoint_keep_zero_is_refused_because_it_would_delete_the_final_checkpoint():
    from trainer.config.schema import CheckpointConfig

    with pytest.raises(ValueError, match=r"checkpoint.keep=0; must be >= 1 .*delete every checkpoint"):
        CheckpointConfig(keep=0)
    assert CheckpointConfig(keep=None).keep is None and CheckpointConfig(keep=1).keep == 1


@pytest.mark.slow
def test_the_cli_refuses_impossible_values_before_anything_runs(tmp_path):
    root = CONFIGS.parents[1]
    for override, key in (
        ("lr=.inf", "lr=inf"),
        ("checkpoint.keep=0", "checkpoint.keep=0"),
        ("optimizer.b1=2", "optimizer.b1=2.0"),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "trainer.main", "--run_dir", str(tmp_path / "run"), override],
            cwd=root,
            env={**os.environ, "PYTHONPATH": str(root)},
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 2 and f"error: bad trainer config: {key}" in proc.stderr, proc.stderr[-2000:]
        assert "Traceback" not in proc.stderr and not (tmp_path / "run").exists()


def test_step_counts_past_the_int32_step_counter_and_ints_past_int64_are_refused_at_load():
    """A step count the jitted step's int32 counter cannot hold would train a step and then die."""
    assert load_config(None, [f"steps={2**31 - 1}"]).steps == 2**31 - 1
    for key in ("steps", "schedule.warmup_steps", "schedule.decay_steps", "schedule.step_offset"):
        with pytest.raises(
            ValueError,
            match=rf"^bad trainer config: {re.escape(key)}=2147483648 is too large; "
            r"must be < 2\*\*31 \(the step counter is int32\)$",
        ):
            load_config(None, [f"{key}={2**31}"])
    with pytest.raises(
        ValueError,
        match=r"^bad trainer config: steps=99999999999999999999999 is too large; "
        r"must be < 2\*\*63",
    ):
        load_config(None, ["steps=99999999999999999999999"])
    for key in ("global_batch_size", "checkpoint.every", "eval_batches", "log.progress_every"):
        with pytest.raises(ValueError, match=rf"^bad trainer config: {re.escape(key)}=\d+ is too large"):
            load_config(None, [f"{key}={2**63}"])
    with pytest.raises(ValueError, match=r"schedule.step_offset=2147483600 with steps=100 .* must be < 2\*\*31"):
        load_config(None, ["schedule.step_offset=2147483600"])


def test_seeds_are_32_bit_as_the_data_order_and_jax_take_them():
    from dataloader.order import SEED_MODULUS
    from trainer.config.schema import SEED_END

    assert SEED_END == SEED_MODULUS
    for key in ("seed", "init_seed"):
        assert getattr(load_config(None, [f"{key}={SEED_END - 1}"]), key) == SEED_END - 1
        with pytest.raises(ValueError, match=rf"bad trainer config: {key}={SEED_END}; must be in \[0, 2\*\*32\)"):
            load_config(None, [f"{key}={SEED_END}"])


@pytest.mark.parametrize(
    "override, says",
    [
        ("model=nope", "unknown model config 'nope'"),
        ("model_overrides={d_model: -5}", "d_model must be a positive int"),
        ("model_overrides={no_such_field: 1}", "unknown ModelConfig fields"),
        ("model_overrides.n_layer=3", "unknown ModelConfig fields ['n_layer'] (did you mean 'n_layers'?)"),
        ("model_overrides.n_layers=true", "model_overrides.n_layers=True is not an int (model='olmo3-tiny')"),
        ("model_overrides.attention_chunk=true", "model_overrides.attention_chunk=True is not an int"),
        ("model_overrides.rope_theta=abc", "model_overrides.rope_theta='abc' is not a float (model='olmo3-tiny')"),
        ("model_overrides.compute_dtype=1", "model_overrides.compute_dtype=1 is not a str"),
        ("model_overrides.init_cutoff=0", "model_overrides.init_cutoff=0 must be a finite number > 0"),
        ("model_overrides.init_cutoff=-1.5", "model_overrides.init_cutoff=-1.5 must be a finite number > 0"),
        ("seed=4294967296", "seed=4294967296; must be in"),
    ],
)
def test_the_cli_refuses_a_model_or_seed_that_cannot_be_before_anything_is_written(tmp_path, capsys, override, says):
    from trainer import main

    assert main.main(["--run_dir", str(tmp_path / "run"), override]) == 2  # returns before JAX starts
    err = capsys.readouterr().err
    assert "error: bad trainer config" in err and says in err and not (tmp_path / "run").exists()


def test_model_overrides_written_as_yaml_writes_floats_pass_the_check_before_jax():
    """`model_overrides.init_std=1e-2` is the float 0.01 (YAML 1.1 reads it as text), as `lr=1e-2` is."""
    cfg = load_config(None, ["model_overrides.init_std=1e-2", "model_overrides.rope_theta=5e5", "lr=1e-2"])
    assert cfg.model_cfg().init_std == cfg.lr == 0.01  # load_config refuses a model that cannot be made


def test_a_config_file_that_is_not_utf8_is_refused_naming_the_file_and_line(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_bytes(b"steps: 3\nmodel: caf\xe9\n")  # Latin-1
    top = tmp_path / "top.yaml"
    top.write_text("base: base.yaml\nlr: 1.0e-3\n")
    for path in (base, top):  # the base file is named too when the top one names it
        with pytest.raises(ValueError, match=rf"^{re.escape(str(base))}:2: not UTF-8 text \(byte 0xe9\)"):
            load_config(path)


def test_duplicate_keys_in_a_yaml_config_are_refused_with_file_and_line(tmp_path):
    top = tmp_path / "top.yaml"
    top.write_text("steps: 5\nlr: 1.0e-3\nsteps: 7\n")
    with pytest.raises(ValueError, match=rf"{re.escape(str(top))}:3: duplicate key 'steps' \(first at line 1\)"):
        load_config(top)
    nested = tmp_path / "nested.yaml"
    nested.write_text("steps: 5\noptimizer:\n  b1: 0.9\n  b2: 0.95\n  b1: 0.8\n")
    with pytest.raises(ValueError, match=r"nested.yaml:5: duplicate key 'b1' \(first at line 3\)"):
        load_config(nested)
    flow = tmp_path / "flow.yaml"
    flow.write_text("schedule: {kind: cosine, kind: linear}\n")
    with pytest.raises(ValueError, match=r"flow.yaml:1: duplicate key 'kind'"):
        load_config(flow)
    child = tmp_path / "child.yaml"  # through `base:`, the base file's duplicate is named
    child.write_text("base: top.yaml\nlr: 2.0e-3\n")
    with pytest.raises(ValueError, match=r"top.yaml:3: duplicate key 'steps'"):
        load_config(child)
    ok = tmp_path / "ok.yaml"  # the same key in different mappings, and a child overriding its base, are fine
    ok.write_text("base: base.yaml\nsteps: 9\noptimizer: {b1: 0.8}\nschedule: {kind: linear}\n")
    (tmp_path / "base.yaml").write_text("steps: 5\noptimizer: {b1: 0.9, b2: 0.9}\n")
    cfg = load_config(ok)
    assert (cfg.steps, cfg.optimizer.b1, cfg.optimizer.b2, cfg.schedule.kind) == (9, 0.8, 0.9, "linear")


@pytest.mark.parametrize(
    "override, says",
    [
        ("optimizer={b1: 0.9, b1: 0.5}", "duplicate key 'b1'"),
        ("data_weights={a: 1, a: 2}", "duplicate key 'a'"),
        ("model_overrides={d_model: 8, n_layers: 2, d_model: 16}", "duplicate key 'd_model'"),
        ("optimizer={b1", "not valid YAML"),
        ("x=!!python/object:os.system ls", "not valid YAML"),
    ],
)
def test_an_override_with_a_repeated_key_or_broken_yaml_is_refused_naming_it(override, says):
    # the same rule as in YAML files (no silent last-wins), and a ValueError (exit 2), not a YAML traceback
    with pytest.raises(ValueError, match=re.escape(f"override {override!r}: ") + ".*" + re.escape(says)):
        load_config(None, [override])
    assert load_config(None, ["optimizer={b1: 0.8, b2: 0.9}"]).optimizer.b1 == 0.8  # distinct keys are fine


def test_resume_changes_name_every_optimizer_and_schedule_difference():
    from trainer.checkpointing.resume import resume_changes

    base = ["steps=100", "schedule.decay_steps=200"]
    saved = load_config(None, base).to_dict()
    assert resume_changes(saved, load_config(None, base)) == []
    # more steps with a fixed decay length (extending a run) and unrelated keys are no change
    assert resume_changes(saved, load_config(None, ["steps=150", "schedule.decay_steps=200", "eval.every=3"])) == []
    changes = resume_changes(
        saved,
        load_config(None, base + ["optimizer.b1=0.8", "lr=1e-3", "schedule.kind=linear", "skip_step.enabled=true"]),
    )
    assert changes == [
        "lr: checkpoint has 0.0003, config gives 0.001",
        "optimizer.b1: checkpoint has 0.9, config gives 0.8",
        "schedule.kind: checkpoint has 'cosine', config gives 'linear'",
        "skip_step.enabled: checkpoint has False, config gives True",
    ]
    # decay_steps unset follows steps: extending such a run changes the learning rate at every step
    unset = load_config(None, ["steps=100"]).to_dict()
    assert resume_changes(unset, load_config(None, ["steps=150"])) == [
        "schedule.decay_steps: checkpoint has 100, config gives 150"
    ]
    # the loss and the model that computes it count too (a changed z_loss, masking or dtype would
    # silently train another objective from the restored state)
    changes = resume_changes(
        saved,
        load_config(
            None,
            base
            + ["z_loss=1e-3", "document_masking=false", "model_overrides={compute_dtype: float32}", "model=olmo3-7b"],
        ),
    )
    assert changes[0] == "document_masking: checkpoint has True, config gives False"
    assert "model.compute_dtype: checkpoint has 'bfloat16', config gives 'float32'" in changes
    assert "model.d_model: checkpoint has 64, config gives 4096" in changes
    assert "model.name: checkpoint has 'olmo3-tiny', config gives 'olmo3-7b'" in changes
    assert changes[-1] == "z_loss: checkpoint has 1e-05, config gives 0.001"
    # the flags the resume errors name parse as overrides
    cfg = load_config(None, ["checkpoint.allow_data_mismatch=true", "checkpoint.allow_optimizer_change=true"])
    assert cfg.checkpoint.allow_data_mismatch is True and cfg.checkpoint.allow_optimizer_change is True


def test_resume_compares_the_resolved_model_and_ignores_memory_only_knobs():
    from trainer.checkpointing.resume import resume_changes

    saved = load_config(None, ["model=olmo3-tiny"]).to_dict()
    # writing out a default, or retuning remat / attention_chunk (memory only), is no change
    same = load_config(
        None, ["model=olmo3-tiny", "model_overrides={compute_dtype: bfloat16, remat: true, attention_chunk: 16}"]
    )
    assert resume_changes(saved, same) == []
    # nor is the attention kernel, its tiling, or a remat policy (speed and memory only)
    kernels = load_config(
        None,
        [
            "model=olmo3-tiny",
            "model_overrides={attention_impl: splash, splash_block_q: 256, "
            "splash_block_kv: 1024, remat: dots_with_no_batch_dims_saveable}",
        ],
    )
    assert resume_changes(saved, kernels) == []
    # nor are splash's operand layouts, tokamax's splash kernel (the same attention) or the fused
    # projections (the same matmuls over the same parameters, concatenated)
    layouts = load_config(
        None,
        [
            "model=olmo3-tiny",
            "model_overrides={splash_kernel: tokamax, splash_fused_bwd: true, splash_q_layout: seq_minor, "
            "splash_k_layout: seq_minor, splash_v_layout: seq_minor, fused_qkv: true, fused_gate_up: true}",
        ],
    )
    assert resume_changes(saved, layouts) == []
    # an override that changes the function is named by its field, with both resolved values
    assert resume_changes(saved, load_config(None, ["model_overrides.rope_theta=10000.0"])) == [
        "model.rope_theta: checkpoint has 500000.0, config gives 10000.0"
    ]


def test_microbatches_and_loss_chunk_may_change_on_resume_because_the_update_is_the_same():
    """Both regroup the same sums (gradient accumulation; the LM head in sequence chunks): the
    update differs by float rounding only, like remat, so a run may move to a smaller slice with
    more microbatches. Proved equal by tests/trainer/test_microbatches.py."""
    from trainer.checkpointing.resume import resume_changes

    saved = load_config(None, ["microbatches=1", "loss_chunk=0"]).to_dict()
    assert resume_changes(saved, load_config(None, ["microbatches=4", "loss_chunk=512"])) == []
    assert TrainConfig().microbatches == 1 and TrainConfig().loss_chunk == 1024


def test_resume_compares_the_model_the_checkpoint_recorded_not_its_name_resolved_today():
    import dataclasses

    from model import get_config
    from model.config import ModelConfig
    from trainer.checkpointing.resume import resume_changes

    cfg = load_config(None, ["model=olmo3-tiny"])
    recorded = dataclasses.asdict(get_config("olmo3-tiny"))
    assert resume_changes(cfg.to_dict(), cfg, recorded) == []
    # the named config was redefined since the checkpoint: its recorded model differs from today's
    assert resume_changes(cfg.to_dict(), cfg, {**recorded, "n_layers": recorded["n_layers"] + 1}) == [
        f"model.n_layers: checkpoint has {recorded['n_layers'] + 1}, config gives {recorded['n_layers']}"
    ]
    # a field recorded before it existed reads as its default
    newer = {k: v for k, v in recorded.items() if k != "ranks_sha256"}
    assert recorded["ranks_sha256"] == ModelConfig().ranks_sha256
    assert resume_changes(cfg.to_dict(), cfg, newer) == []
    # a model recorded before attention_impl existed, with remat as a boolean, resumes with the new knobs
    old = {k: v for k, v in recorded.items() if k not in ("attention_impl", "splash_block_q", "splash_block_kv")}
    retuned = load_config(None, ["model=olmo3-tiny", "model_overrides={remat: full, attention_impl: xla}"])
    assert resume_changes(cfg.to_dict(), retuned, {**old, "remat": True}) == []
    # initialisation-only fields never count (a resume does not initialise), recorded or resolved
    assert resume_changes(cfg.to_dict(), cfg, {**recorded, "init_std": 0.5, "init_cutoff": 2.0}) == []
    assert (
        resume_changes(
            cfg.to_dict(),
            load_config(None, ["model=olmo3-tiny", "model_overrides.init_std=0.5", "model_overrides.init_cutoff=2.0"]),
        )
        == []
    )


def test_a_checkpoint_from_before_a_resume_key_existed_reads_as_its_default():
    from trainer.checkpointing.resume import resume_changes

    cfg = load_config(None, ["steps=100"])
    old = cfg.to_dict()
    for key in ("document_masking", "model_overrides"):
        del old[key]
    del old["schedule"]["step_offset"]
    del old["skip_step"]["min_history"]
    assert resume_changes(old, cfg) == []
    # ... and a config that leaves the default is still told apart from it
    assert resume_changes(old, load_config(None, ["steps=100", "document_masking=false"])) == [
        "document_masking: checkpoint has True, config gives False"
    ]


def test_stage1_ai2_recipe_is_stage1_in_olmo_core_order_on_ai2_files():
    ai2 = load_config(CONFIGS / "olmo3-7b-stage1-ai2.yaml")
    base = load_config(CONFIGS / "olmo3-7b-stage1.yaml")
    assert ai2.data_order == "olmo-core" and base.data_order == "grain"
    assert (ai2.seed, ai2.global_batch_size, ai2.seq_len) == (34521, 512, 8192)
    # it evaluates (eval.every > 0), so it names a held-out manifest: AI2's validation files, split: heldout
    assert ai2.eval.every > 0 and ai2.data == (
        "out/olmo3-stage1-ai2/manifest.json",
        "out/olmo3-ppl-validation-ai2/manifest.json",
    )
    recipe = (CONFIGS / "olmo3-7b-stage1-ai2.yaml").read_text()
    for name in ("olmo3-stage1-ai2", "olmo3-ppl-validation-ai2"):  # the commands that build them
        assert (f"--mixture data_manifests/mixtures/{name}.yaml --output out/{name}\n") in recipe
    # otherwise stage 1, but for AI2's part-1 length and schedule (checked against OLMo-core below)
    # evaluated as AI2's evaluator does: padded instances, every one of each set; watched in TensorBoard;
    # and AI2's padded vocabulary, every padded row in the softmax (model/README.md)
    assert ai2.eval.instances == "padded" and ai2.eval_batches is None and ai2.log.tensorboard
    padded = {"vocab_pad_multiple": 128, "vocab_padding": "unmasked"}
    assert ai2.model_overrides == {**base.model_overrides, **padded}
    assert (ai2.model_cfg().padded_vocab_size, ai2.model_cfg().scored_vocab_size) == (100352, 100352)
    assert (
        ai2.model_copy(
            update=dict(
                data=base.data,
                data_order="grain",
                steps=base.steps,
                schedule=base.schedule,
                eval=base.eval,
                eval_batches=base.eval_batches,
                log=base.log,
                model_overrides=base.model_overrides,
            )
        )
        == base
    )


def test_stage1_ai2_recipe_learning_rates_are_olmo_cores_part_1_schedule():
    """AI2's OLMo-3-1025-7B-pretrain-1.py: CosWithWarmup(warmup 2000) (alpha_f default 0.1) over
    max_duration 5e12 tokens at 512 x 8192 per step, hard stop at 597,046; OLMo-core's Trainer
    turns the tokens into max_steps by rounding up and sets update s's rate at global_step s + 1.
    Our rate of every update is OLMo-core's own scheduler's (ai2-olmo-core, installed), bit for bit."""
    import math

    from olmo_core.optim import CosWithWarmup

    cfg = load_config(CONFIGS / "olmo3-7b-stage1-ai2.yaml")
    tokens_per_step = cfg.global_batch_size * cfg.seq_len
    t_max = math.ceil(int(5e12) / tokens_per_step)
    assert cfg.steps == 597046 and cfg.decay_steps == t_max == 1192093
    theirs = CosWithWarmup(warmup=2000)
    ours = optim.make_schedule(cfg)
    for s in (0, 1, 999, 1998, 1999, 2000, 2001, 300_000, 597_045, t_max - 1, t_max, t_max + 5):
        assert ours(s) == theirs.get_lr(cfg.lr, s + 1, t_max), s  # float64, OLMo-core's operations
    plain = optim.make_schedule(load_config(CONFIGS / "olmo3-7b-stage1-ai2.yaml", ["schedule.step_offset=0"]))
    assert float(plain(0)) == 0.0 != theirs.get_lr(cfg.lr, 1, t_max)  # without the offset: one step behind


def test_data_order_must_be_a_known_order():
    with pytest.raises(ValueError, match="data_order='olmo'"):
        load_config(None, ["data_order=olmo"])
    assert load_config(None, ["data_order=olmo-core"]).data_order == "olmo-core"


def test_double_sharding_experiment_switch_is_off_by_default_and_checked():
    assert load_config(CONFIGS / "tiny.yaml").UNSAFE_double_sharding_experiment_hosts == 0
    cfg = load_config(CONFIGS / "tiny.yaml", ["UNSAFE_double_sharding_experiment_hosts=2"])
    assert cfg.UNSAFE_double_sharding_experiment_hosts == 2
    for bad in ("1", "3"):  # one host cannot double-shard; 3 does not divide the batch of 4
        with pytest.raises(ValueError, match="UNSAFE_double_sharding_experiment_hosts"):
            load_config(CONFIGS / "tiny.yaml", [f"UNSAFE_double_sharding_experiment_hosts={bad}"])


def test_eval_and_tracker_settings_are_typed_and_checked_naming_the_key():
    cfg = load_config(
        CONFIGS / "tiny.yaml",
        ["eval.instances=padded", "eval.sets=[a, b]", "log.tensorboard=true", "log.wandb={project: p, mode: offline}"],
    )
    assert cfg.eval.instances == "padded" and cfg.eval.sets == ("a", "b") and cfg.log.tensorboard
    assert (cfg.log.wandb.project, cfg.log.wandb.mode, cfg.log.wandb.name) == ("p", "offline", None)
    assert load_config(CONFIGS / "tiny.yaml").eval.instances == "packed" and load_config(None).log.wandb is None
    assert load_config(None, ["log.wandb.mode=offline"]).log.wandb.project == "olmax"  # a dotted override alone
    for override, says in (
        ("eval.instances=docs", "eval.instances='docs'"),
        ("eval.sets=[]", "eval.sets"),
        ("eval.sets=[a, a]", "names a set twice"),
        ("log.wandb.mode=cloud", "log.wandb.mode='cloud'"),
        ("log.wandb={project: ''}", "log.wandb.project"),
        ("eval.bogus=1", "eval.bogus"),
    ):
        with pytest.raises(ValueError, match=re.escape(says)):
            load_config(None, [override])


@pytest.mark.parametrize(
    "override, says",
    [
        (
            "model_overrides.n_layer=3",
            "bad trainer config: model_overrides.n_layer: unknown ModelConfig fields "
            "['n_layer'] (did you mean 'n_layers'?)",
        ),
        (
            "model_overrides.d_model=64.5",
            "bad trainer config: model_overrides.d_model=64.5 is not an int (model='olmo3-tiny')",
        ),
        ("model_overrides.compute_dtype=1", "bad trainer config: model_overrides.compute_dtype=1 is not a str"),
    ],
)
def test_model_overrides_are_typed_when_the_config_loads(override, says):
    """A model override is checked where every other key is: at load, naming `model_overrides.KEY`."""
    from trainer.config.loading import ConfigError
    from trainer.config.schema import TrainConfig

    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert says in str(e.value)
    key, value = override.removeprefix("model_overrides.").split("=")
    with pytest.raises(ConfigError, match="model_overrides"):  # a config built in code too
        TrainConfig(model_overrides={key: value if key == "n_layer" else float(value)})


def test_integral_floats_are_ints_in_model_overrides_as_in_the_trainer_keys():
    cfg = load_config(None, ["model_overrides.d_model=64.0", "global_batch_size=8.0"])
    assert cfg.global_batch_size == 8 and cfg.model_cfg().d_model == 64 and type(cfg.model_cfg().d_model) is int
