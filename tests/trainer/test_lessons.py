"""`make lessons`: the three runs differ from the correct one in exactly their one setting, and data
or runs already in the output folder are reused only under equal recorded settings."""
import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from trainer.compare import lessons
from trainer.config import load_config


def test_each_lesson_run_differs_from_the_correct_run_in_its_one_setting():
    cfg = lessons.LessonsConfig()
    runs = {name: load_config(lessons.TINY, lessons.overrides(cfg, "m/manifest.json", name)) for name in lessons.RUNS}
    correct = runs["correct"]
    assert correct.UNSAFE_double_sharding_experiment_hosts == 0
    assert (correct.optimizer.mu_dtype, correct.optimizer.nu_dtype) == ("float32", "float32")
    assert not correct.allow_low_precision_optimizer_state
    assert (correct.steps, correct.global_batch_size, correct.data) == (cfg.steps, cfg.global_batch_size,
                                                                        ("m/manifest.json",))
    changed = {name: {k for k, v in dataclasses.asdict(c).items() if v != dataclasses.asdict(correct)[k]}
               for name, c in runs.items()}
    assert changed == {"correct": set(), "double_sharding": {"UNSAFE_double_sharding_experiment_hosts"},
                       "bf16_moments": {"optimizer", "allow_low_precision_optimizer_state"}}
    assert runs["bf16_moments"].optimizer == dataclasses.replace(correct.optimizer, mu_dtype="bfloat16",
                                                                 nu_dtype="bfloat16")


def test_bf16_moments_without_the_opt_in_are_refused():
    from trainer.config import check_state_precision

    cfg = lessons.LessonsConfig()
    bad = [o for o in lessons.overrides(cfg, "m/manifest.json", "bf16_moments")
           if not o.startswith("allow_low_precision")]
    with pytest.raises(ValueError, match="refusing low-precision optimizer state"):
        check_state_precision(load_config(lessons.TINY, bad))


# --- reuse: data and runs in OUT are reused only under equal recorded settings -------------------

def test_reuse_decision_needs_equal_recorded_settings_and_a_finished_output():
    wanted = {"overrides": ["steps=2"], "manifest_sha256": "a"}
    assert lessons.decide(dict(wanted), wanted, exists=True, finished=True)[0] == "reuse"
    action, why = lessons.decide({**wanted, "overrides": ["steps=1"]}, wanted, exists=True, finished=True)
    assert action == "rebuild" and "overrides" in why
    assert lessons.decide({"overrides": ["steps=2"]}, wanted, exists=True, finished=True)[0] == "rebuild"
    assert lessons.decide(dict(wanted), wanted, exists=True, finished=False) == ("rebuild", "it did not finish")
    assert lessons.decide(None, wanted, exists=False, finished=False)[0] == "build"
    # a folder with no record (another experiment's, or from before the records) is never replaced
    assert lessons.decide(None, wanted, exists=True, finished=True)[0] == "refuse"


def test_every_lessons_setting_reaches_the_recorded_settings_of_the_data_or_the_runs(tmp_path):
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    base = lessons.LessonsConfig(out=str(tmp_path))
    recorded = lambda c: (lessons.data_settings(c, tmp_path),  # noqa: E731
                          [lessons.run_settings(c, str(manifest), n) for n in lessons.RUNS])
    for f in dataclasses.fields(lessons.LessonsConfig):
        if f.name != "out":
            other = dataclasses.replace(base, **{f.name: f.default * 2})
            assert recorded(other) != recorded(base), f.name
    # rebuilt data under the same path are other data
    before = recorded(base)[1]
    manifest.write_text('{"counts": {}}')
    assert recorded(base)[1] != before


def _record_runs(monkeypatch):
    calls = []

    def fake_run(cmd, ok=(0,)):
        calls.append(cmd[2])  # the module: pipelines.tokenize / trainer.main
        if cmd[2] == "pipelines.tokenize":
            out = Path(cmd[cmd.index("--output") + 1])
            out.mkdir(parents=True, exist_ok=True)
            (out / "manifest.json").write_text(Path(cmd[cmd.index("--mixture") + 1]).read_text())
        else:
            run_dir = Path(cmd[cmd.index("--run_dir") + 1])
            run_dir.mkdir(parents=True, exist_ok=True)
            (run_dir / "summary.json").write_text(json.dumps(cmd[5:]))
        return 0, 0.0
    monkeypatch.setattr(lessons, "_run", fake_run)
    return calls


def test_changed_docs_or_steps_rebuild_instead_of_silently_reusing(tmp_path, monkeypatch, capsys):
    sample = tmp_path / "sample"
    (sample / "prose").mkdir(parents=True)
    with gzip.open(sample / "prose" / "part-0.jsonl.gz", "wt") as f:
        f.writelines(json.dumps({"id": str(i), "text": f"doc {i}"}) + "\n" for i in range(3))
    monkeypatch.setattr("pipelines.sample.build_sample", lambda: str(sample))
    calls = _record_runs(monkeypatch)
    cfg = lessons.LessonsConfig(out=str(tmp_path / "out"), docs=1, steps=1)

    manifest = lessons.prepare_data(cfg)
    assert lessons.train(cfg, manifest, "correct") is not None
    assert calls == ["pipelines.tokenize", "trainer.main"]
    assert lessons.prepare_data(cfg) == manifest and lessons.train(cfg, manifest, "correct") is None
    assert calls == ["pipelines.tokenize", "trainer.main"]          # equal settings: reused

    more_steps = dataclasses.replace(cfg, steps=2)
    assert lessons.prepare_data(more_steps) == manifest             # data do not depend on steps
    lessons.train(more_steps, manifest, "correct")
    assert calls[2:] == ["trainer.main"]
    assert "steps=2" in json.loads((tmp_path / "out" / "runs" / "correct" / "summary.json").read_text())
    assert "rebuilding run correct" in capsys.readouterr().out

    more_docs = dataclasses.replace(more_steps, docs=2)
    lessons.train(more_docs, lessons.prepare_data(more_docs), "correct")
    assert calls[3:] == ["pipelines.tokenize", "trainer.main"]      # new data, so the run is redone too
    assert len((tmp_path / "out" / "src" / "prose.jsonl").read_text().splitlines()) == 2


def test_a_run_folder_without_recorded_settings_is_refused_and_left_alone(tmp_path, monkeypatch):
    calls = _record_runs(monkeypatch)
    manifest = tmp_path / "manifest.json"
    manifest.write_text("{}")
    theirs = tmp_path / "runs" / "correct"
    theirs.mkdir(parents=True)
    (theirs / "summary.json").write_text("{}")
    with pytest.raises(SystemExit, match="no recorded settings"):
        lessons.train(lessons.LessonsConfig(out=str(tmp_path)), str(manifest), "correct")
    assert calls == [] and (theirs / "summary.json").read_text() == "{}"
