"""What a run records of its config is the same bytes as before the pydantic models, and the
loading machinery's own promises (nearest key, one-line errors, frozen sections)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from trainer.config.loading import ConfigError, nearest
from trainer.config.schema import CheckpointConfig, OptimizerConfig, TrainConfig, load_config

CONFIGS = Path(__file__).resolve().parents[2] / "trainer" / "configs"

# Every kind of value once: tuples from a scalar and a list, a float from an int and from YAML
# 1.1's "1e1" string, an int from 512.0, nested mappings, an optional section, None over a default.
EVERY_KIND = [
    "data=one/manifest.json",
    "data_weights={prose: 1, web: 2.5}",
    "model_overrides={n_layers: 2, rope_theta: 1e4}",
    "lr=1",
    "seq_len=512.0",
    "optimizer.decay_exclude=[embed, norm]",
    "schedule.decay_steps=300",
    "eval.sets=[c4, wiki]",
    "log.wandb={mode: offline}",
    "log.peak_tflops_per_device=197",
    "verify_data_gib='1e1'",
    "checkpoint.keep=null",
    "checkpoint.init_from=a/b",
]

# sha256 of repr(cfg.to_dict()) as the dataclass implementation (before pydantic) produced it.
# repr tells a tuple from a list and 1.0 from 1, so equal digests mean equal config.json,
# checkpoint meta and tracker config, and an old checkpoint's recorded config still resumes.
# A recipe changed on purpose changes its digest: recompute it then (tiny, small and the 7B recipes
# since they set `downstream`; the default config, which leaves it off, records the same bytes). Every
# digest changed once on purpose since: skip_step.min_history's default became OLMo-core's rule (None,
# was 20; each digest checked to be the old one with that one value put back), then the new key
# loss_backward (default "fused", recorded: which backward a run used; each digest checked to be the
# previous one with that key left out), then the new key verify_data_sample (default 64: shards
# re-hashed at random per start; each digest checked to be the previous one with that key left out).
RECORDED = {
    (None, ()): "0233d2a2840f050a75e82ee50c5a57a712d0ab0210ca861e6f6bb9e73858943e",
    ("tiny.yaml", ()): "e9e8e222d461f4f2f7ddf2d489d120fc02e9e9fd88158bbb45f01b87f9ca3e76",
    ("olmo3-7b-stage1.yaml", ()): "d093528c005af2db8faa1b0cfe3ed4d6c387e47cab973c3620e2bf1adbe95b1b",
    ("olmo3-7b-stage2.yaml", ()): "c7b933322984f9e766ef22cb988a2fa8bbdb7f93d4023e0fe7b194c9c26b3d77",
    ("olmo3-7b-stage1-ai2.yaml", ()): "5662894e5f467571dabfe35252d84e096a3a401dfc2b5230945d197313480e06",
    ("small.yaml", tuple(EVERY_KIND)): "8f5a4cc6d0bc8287e287bf0c26214de31d61c862ecabbb37614dec08600d03a5",
}


@pytest.mark.parametrize("recipe, overrides", list(RECORDED))
def test_the_recorded_config_is_byte_identical_to_the_dataclass_implementations(recipe, overrides):
    cfg = load_config(CONFIGS / recipe if recipe else None, list(overrides))
    assert hashlib.sha256(repr(cfg.to_dict()).encode()).hexdigest() == RECORDED[(recipe, overrides)]


def test_the_default_config_json_reads_as_before():
    d = load_config(None).to_dict()
    assert list(d)[:4] == ["data", "data_weights", "model", "model_overrides"]  # field order, as written
    assert d["data"] == ("out/sample/manifest.json",) and d["optimizer"]["decay_exclude"] == ("embed",)
    assert json.dumps(d["optimizer"]) == (
        '{"b1": 0.9, "b2": 0.95, "eps": 1e-08, "weight_decay": 0.1, "clip_norm": 1.0, '
        '"mu_dtype": "float32", "nu_dtype": "float32", "decay_exclude": ["embed"]}'
    )
    assert load_config(None, ["lr=1"]).to_dict()["lr"] == 1.0 and isinstance(load_config(None, ["lr=1"]).lr, float)


def test_a_typo_names_the_nearest_valid_key():
    with pytest.raises(
        ConfigError, match=r"unknown key\(s\) \['optimizer.mu_dtyp'\] \(did you mean 'optimizer.mu_dtype'\?\)"
    ):
        load_config(None, ["optimizer.mu_dtyp=float32"])
    with pytest.raises(ConfigError, match=r"\['stpes'\] \(did you mean 'steps'\?\); valid keys of the top level"):
        load_config(None, ["stpes=3"])
    with pytest.raises(ConfigError, match=r"unknown key\(s\) \['log.wandb.zzz'\]; valid keys of log.wandb.: "):
        load_config(None, ["log.wandb.zzz=1"])  # nothing close: no guess
    assert nearest("warmup_step", ["warmup_steps", "kind"]) == "warmup_steps" and nearest("x", ["kind"]) is None


def test_a_section_built_on_its_own_refuses_in_one_line_naming_the_dotted_key():
    with pytest.raises(ConfigError, match=r"^bad trainer config: optimizer.b1=2.0; must be in \[0, 1\)$"):
        OptimizerConfig(b1=2)
    with pytest.raises(ConfigError, match=r"^bad trainer config: unknown key\(s\) \['checkpoint.kep'\] \(did you mean"):
        CheckpointConfig(kep=1)
    with pytest.raises(ConfigError, match=r"^bad trainer config: steps=0; must be > 0$"):
        TrainConfig(steps=0)
    assert isinstance(ConfigError("x"), ValueError)  # the CLI's exit-2 path catches ValueError


def test_configs_are_frozen_and_compare_by_value():
    cfg = load_config(None)
    with pytest.raises(Exception, match="frozen"):
        cfg.steps = 3  # type: ignore[misc]
    assert cfg == load_config(None) and cfg != load_config(None, ["steps=3"])
    assert cfg.model_copy(update={"steps": 3}) == load_config(None, ["steps=3"])
