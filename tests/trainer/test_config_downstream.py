"""The recipe's `downstream` section: tasks checked at load (a typo names the nearest label), off by
default and then absent from the recorded config, and the start-up check of the frozen task files
(`trainer.downstream.check.check_downstream`): missing files or tasks refused in one line with the
command that builds them, files built for another context length or tokenizer refused."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from contract import downstream as ds
from trainer.config.loading import ConfigError
from trainer.config.schema import DownstreamConfig, load_config
from trainer.downstream.check import DownstreamCheckError, check_downstream

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ROOT / "trainer" / "configs"
TINY_TASKS = ROOT / "trainer" / "configs" / "downstream" / "tiny"


def test_a_preset_expands_to_olmo3s_26_tasks_and_labels_mix_in_once():
    cfg = load_config(None, ["downstream.tasks=[olmo3-fast, copycolors_10way_fast, hellaswag_rc_5shot]"]).downstream
    assert cfg.labels == [*ds.OLMO3_FAST_TASKS, "hellaswag_rc_5shot"] and len(ds.OLMO3_FAST_TASKS) == 26
    assert load_config(None, ["downstream.tasks=olmo3-fast,hellaswag_rc_5shot"]).downstream.labels == cfg.labels
    assert (cfg.every, cfg.precision, cfg.tasks_dir) == (0, "bfloat16", "out/downstream/olmo3-fast")


@pytest.mark.parametrize(
    "override, message",
    [
        (
            "downstream.tasks=[arc_challenge_test_mc_5shot_fats]",
            "unknown task 'arc_challenge_test_mc_5shot_fats' (did you mean 'arc_challenge_test_mc_5shot_fast'?)",
        ),
        ("downstream.tasks=olmo3_fast", "unknown task 'olmo3_fast' (did you mean 'olmo3-fast'?)"),
        ("downstream.every=100", "downstream.every=100 with no downstream.tasks"),
        ("downstream.precision=bf16", "downstream.precision='bf16'; expected one of ('bfloat16', 'float32')"),
        ("downstream.every=-1", "downstream.every=-1; must be >= 0"),
        ("downstream.batch_size=0", "downstream.batch_size=0; must be > 0"),
    ],
)
def test_a_bad_downstream_section_is_refused_at_load_in_one_line(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert message in str(e.value) and "\n" not in str(e.value)


def test_the_section_is_recorded_only_when_it_is_not_the_default():
    assert "downstream" not in load_config(None).to_dict()
    assert "downstream" not in load_config(None, ["downstream.every=0"]).to_dict()
    d = load_config(None, ["downstream.tasks=olmo3-fast", "downstream.every=10000"]).to_dict()["downstream"]
    assert d == {
        "tasks": ("olmo3-fast",),
        "every": 10000,
        "tasks_dir": "out/downstream/olmo3-fast",
        "precision": "bfloat16",
        "batch_size": None,
    }


def test_the_7b_stage1_recipes_log_olmo3s_tasks_every_10000_steps():
    for name in ("olmo3-7b-stage1.yaml", "olmo3-7b-stage1-ai2.yaml", "olmo3-7b-stage1-mxu.yaml"):
        cfg = load_config(CONFIGS / name)
        assert cfg.downstream.labels == list(ds.OLMO3_FAST_TASKS) and cfg.downstream.every == 10000
        with pytest.raises(DownstreamCheckError) as e:  # not built here: refused, naming the command
            check_downstream(cfg.downstream.model_copy(update={"tasks_dir": "/nonexistent/olmo3-fast"}), 8192, "dolma2")
        assert (
            "python -m pipelines.downstream_tasks --tasks olmo3-fast --out /nonexistent/olmo3-fast "
            "--tokenizer dolma2 --model_ctx_len 8192"
        ) in str(e.value)


def test_the_tiny_recipe_runs_its_committed_small_tasks_within_the_demo(monkeypatch):
    """Its tasks_dir (relative to the repository root, where `make demo` runs) holds its tasks, built
    for the sample's seq_len and tokenizer; the interval fires within its steps; under 1 MB."""
    monkeypatch.chdir(ROOT)
    cfg = load_config(CONFIGS / "tiny.yaml")
    assert 0 < cfg.downstream.every <= cfg.steps
    tasks = check_downstream(cfg.downstream, model_ctx_len=512, tokenizer="dolma2")
    assert tasks.labels == cfg.downstream.labels == ["copycolors_10way_fast", "basic_skills_pattern_rc_5shot"]
    assert [len(t) for t in tasks.tasks.values()] == [100, 2142]
    assert sum(p.stat().st_size for p in TINY_TASKS.rglob("*") if p.is_file()) < 1 << 20
    assert load_config(CONFIGS / "small.yaml").downstream.every == 0


def test_off_is_not_checked_and_each_problem_is_refused_naming_the_fix(tmp_path):
    on = DownstreamConfig(tasks=("copycolors_10way_fast",), every=5, tasks_dir=str(tmp_path / "none"))
    assert check_downstream(on.model_copy(update={"every": 0})) is None  # off: no files needed
    with pytest.raises(
        DownstreamCheckError,
        match=r"no manifest.json \(downstream.every=5\); build the task "
        r"files with: python -m pipelines.downstream_tasks --tasks copycolors_10way_fast --out ",
    ):
        check_downstream(on)
    built = shutil.copytree(TINY_TASKS, tmp_path / "tiny")
    lacking = on.model_copy(update={"tasks": ("copycolors_10way_fast", "hellaswag_bpb_5shot"), "tasks_dir": str(built)})
    with pytest.raises(DownstreamCheckError, match=r"lacks 1 of the 2 tasks named \(hellaswag_bpb_5shot\); build"):
        check_downstream(lacking)
    ok = on.model_copy(update={"tasks_dir": str(built)})
    with pytest.raises(DownstreamCheckError, match="built for model_ctx_len 512, the run's seq_len is 8192"):
        check_downstream(ok, model_ctx_len=8192)
    with pytest.raises(DownstreamCheckError, match="built with tokenizer 'dolma2', the run's data with 'proxy32k'"):
        check_downstream(ok, tokenizer="proxy32k")
    assert check_downstream(ok, 512, "dolma2").labels == ["copycolors_10way_fast"]
    (built / "copycolors_10way_fast" / "label_id.npy").write_bytes(b"damaged")  # the data itself is checked
    with pytest.raises(DownstreamCheckError, match="copycolors_10way_fast"):
        check_downstream(ok)
    manifest = json.loads((built / ds.MANIFEST_NAME).read_text())
    manifest["model_ctx_len"] = 1024  # an edited manifest: its content_hash no longer matches
    (built / ds.MANIFEST_NAME).write_text(json.dumps(manifest))
    with pytest.raises(DownstreamCheckError, match="content_hash"):
        check_downstream(ok)
