"""checkpoint.init_from (a new stage from another run's step) refuses what a resume refuses but the
learning rate and its schedule, naming each field and both values, unless the field is named in
checkpoint.init_from_allow_changes; nothing is written when it refuses."""

from __future__ import annotations

import dataclasses
import json

import pytest

from tests.trainer.conftest import run_trainer, trainer_cmd
from trainer.checkpointing.resume import init_from_changes
from trainer.config.schema import load_config

STAGE1 = ["model=olmo3-tiny", "steps=100", "lr=1e-3"]


def stage1_meta(*overrides):
    cfg = load_config(None, [*STAGE1, *overrides])
    return cfg.to_dict(), dataclasses.asdict(cfg.model_cfg())


@pytest.mark.parametrize(
    "override, line",
    [
        ("model_overrides.rope_theta=10000.0", "model.rope_theta: checkpoint has 500000.0, config gives 10000.0"),
        ("model_overrides.sliding_window=8", "model.sliding_window: checkpoint has "),
        ("document_masking=false", "document_masking: checkpoint has True, config gives False"),
        ("optimizer.b2=0.99", "optimizer.b2: checkpoint has 0.95, config gives 0.99"),
    ],
)
def test_init_from_refuses_each_setting_a_resume_refuses_naming_both_values_unless_allowed_by_name(override, line):
    config, model = stage1_meta()
    refused, allowed = init_from_changes(config, load_config(None, [*STAGE1, override]), model)
    assert len(refused) == 1 and refused[0].startswith(line) and allowed == []
    field = line.split(":")[0]
    for name in {field, field.removeprefix("model.")}:  # as the error names it, or the bare field
        refused, allowed = init_from_changes(config, load_config(None, [*STAGE1, override]), model, [name])
        assert refused == [] and len(allowed) == 1 and allowed[0].startswith(line)


def test_init_from_may_change_the_learning_rate_and_schedule_a_new_stage_sets_anew():
    config, model = stage1_meta()
    stage2 = load_config(
        None,
        [
            "model=olmo3-tiny",
            "steps=50",
            "lr=2e-4",
            "schedule.kind=linear",
            "schedule.warmup_steps=0",
            "schedule.final_lr_ratio=0.0",
        ],
    )
    assert init_from_changes(config, stage2, model) == ([], [])


def test_an_allowed_name_that_is_no_compared_setting_is_refused():
    config, model = stage1_meta()
    refused, _ = init_from_changes(config, load_config(None, STAGE1), model, ["rope_thta"])
    assert len(refused) == 1 and "'rope_thta', which is no setting init_from compares" in refused[0]
    assert load_config(
        None, ["checkpoint.init_from_allow_changes=[rope_theta]"]
    ).checkpoint.init_from_allow_changes == ("rope_theta",)


@pytest.mark.slow
def test_a_trainer_started_from_a_step_of_another_rope_theta_is_refused_unless_allowed(
    trainer_process, reference_run, data_manifest, tmp_path
):
    step = reference_run / "checkpoints" / "8"
    cmd = trainer_cmd(
        data_manifest, tmp_path / "run", "steps=1", f"checkpoint.init_from={step}", "model_overrides.rope_theta=20000.0"
    )
    proc = trainer_process.run(cmd)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"checkpoint.init_from={step}: its run's settings differ" in errors[0]
    assert "model.rope_theta: checkpoint has 500000.0, config gives 20000.0" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()  # a refusal writes nothing
    ok = run_trainer(
        data_manifest,
        tmp_path / "run",
        "steps=1",
        f"checkpoint.init_from={step}",
        "model_overrides.rope_theta=20000.0",
        "checkpoint.init_from_allow_changes=[rope_theta]",
        via=trainer_process,
    )
    assert "model.rope_theta: checkpoint has 500000.0, config gives 20000.0 (allowed by" in ok.stderr
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["step"] == 1
