"""What a run records of its config is the same bytes as before the pydantic models, and the
loading machinery's own promises (nearest key, one-line errors, frozen sections)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from contract.config_model import nearest
from trainer.config.loading import ConfigError
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
# previous one with that key left out), then the periods moved into their sections (eval_every →
# eval.every, checkpoint_every → checkpoint.every, downstream.interval → downstream.every; each
# digest checked to be the previous one with the three keys moved back to their old names and places),
# then the new key verify_data_sample (default 64: shards re-hashed at random per start; each digest
# checked to be the previous one with that key left out), then stage 2 and stage1-ai2 took AI2's padded
# vocabulary (model_overrides vocab_pad_multiple: 128, vocab_padding: unmasked; each digest checked to
# be the previous one with those two keys left out).
RECORDED = {
    (None, ()): "c08b8c358e88972b6db0fe62916a2b305e4b6c1cbf34ef91d04050e86fc8fe57",
    ("tiny.yaml", ()): "fba1fb449cf8f8a748d7f633ae2778ba4cf245c666862eae018018b165037fa5",
    ("olmo3-7b-stage1.yaml", ()): "d2e4c803861d987b116000de9468700a3e719638966c443e58e0b5ecf3912f37",
    ("olmo3-7b-stage2.yaml", ()): "2082ccde5e91ee64cb40cef88181ba0186b1657aa2e26c48a9cd82c92ec9eace",
    ("olmo3-7b-stage1-ai2.yaml", ()): "4816e4db81d006ff6382fd60c9337355ba7f61893e979bf3fda9f95a3d52691c",
    ("small.yaml", tuple(EVERY_KIND)): "0793b1c8722ae054d64adaca6b87e789a7312383a38582ef64bfb660f82da2ec",
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


def test_the_periods_old_keys_are_read_as_aliases_and_mean_the_same(tmp_path):
    """eval_every, checkpoint_every and downstream.interval moved into their sections; a recipe, an
    override and a recorded config (an old checkpoint's meta) that use the old name still work."""
    from trainer.config.loading import build

    new = load_config(
        None, ["eval.every=7", "checkpoint.every=3", "downstream.every=5", "downstream.tasks=[olmo3-fast]"]
    )
    old = load_config(
        None, ["eval_every=7", "checkpoint_every=3", "downstream.interval=5", "downstream.tasks=[olmo3-fast]"]
    )
    assert old == new and (new.eval.every, new.checkpoint.every, new.downstream.every) == (7, 3, 5)
    recipe = tmp_path / "old.yaml"
    recipe.write_text("eval_every: 7\ncheckpoint_every: 3\ncheckpoint: {keep: 2}\n")
    assert load_config(recipe).eval.every == 7 and load_config(recipe).checkpoint.every == 3
    assert load_config(recipe, ["eval.every=9"]).eval.every == 9  # an override wins under either name
    recorded = {**load_config(None).to_dict(), "eval_every": 4}
    recorded["eval"] = {k: v for k, v in recorded["eval"].items() if k != "every"}
    assert build(TrainConfig, recorded).eval.every == 4
    with pytest.raises(ConfigError, match=r"eval_every=4 and eval.every=5: eval_every is the old name of eval.every"):
        build(TrainConfig, {"eval_every": 4, "eval": {"every": 5}})
