"""`make lessons`: the three runs differ from the correct one in exactly their one setting, and data
or runs already in the output folder are reused only under equal recorded settings."""

import dataclasses
import gzip
import json
from pathlib import Path

import pytest

from lessons import cli as lessons
from lessons import contamination
from trainer.config.schema import load_config
from trainer.downstream.check import check_downstream


def test_each_lesson_run_differs_from_the_correct_run_in_its_one_setting():
    cfg = lessons.LessonsConfig()
    runs = {name: load_config(lessons.TINY, lessons.overrides(cfg, "m/manifest.json", name)) for name in lessons.RUNS}
    correct = runs["correct"]
    assert correct.UNSAFE_double_sharding_experiment_hosts == 0
    assert (correct.optimizer.mu_dtype, correct.optimizer.nu_dtype) == ("float32", "float32")
    assert not correct.allow_low_precision_optimizer_state
    assert (correct.steps, correct.global_batch_size, correct.data) == (
        cfg.steps,
        cfg.global_batch_size,
        ("m/manifest.json",),
    )
    # the tiny recipe's task files are built for seq_len 512: the 128-token runs score no downstream tasks
    # (with them on, the trainer's start-up refuses the run)
    assert check_downstream(correct.downstream, model_ctx_len=cfg.seq_len, tokenizer="dolma2") is None
    changed = {name: {k for k, v in c.to_dict().items() if v != correct.to_dict()[k]} for name, c in runs.items()}
    assert changed == {
        "correct": set(),
        "double_sharding": {"UNSAFE_double_sharding_experiment_hosts"},
        "bf16_moments": {"optimizer", "allow_low_precision_optimizer_state"},
    }
    assert runs["bf16_moments"].optimizer == correct.optimizer.model_copy(
        update=dict(mu_dtype="bfloat16", nu_dtype="bfloat16")
    )


def test_bf16_moments_without_the_opt_in_are_refused():
    from trainer.config.schema import check_state_precision

    cfg = lessons.LessonsConfig()
    bad = [
        o for o in lessons.overrides(cfg, "m/manifest.json", "bf16_moments") if not o.startswith("allow_low_precision")
    ]
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
    for side in contamination.SIDES:  # the contamination lesson's manifests
        contamination.manifest_path(lessons.contamination_plan(base), side).parent.mkdir(parents=True)
        contamination.manifest_path(lessons.contamination_plan(base), side).write_text("{}")
    recorded = lambda c: (
        lessons.data_settings(c, tmp_path),
        [lessons.run_settings(c, str(manifest), n) for n in lessons.RUNS],
        contamination.data_settings(lessons.contamination_plan(c)),
        [contamination.run_settings(lessons.contamination_plan(c), s) for s in contamination.SIDES],
    )
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
    assert calls == ["pipelines.tokenize", "trainer.main"]  # equal settings: reused

    more_steps = dataclasses.replace(cfg, steps=2)
    assert lessons.prepare_data(more_steps) == manifest  # data do not depend on steps
    lessons.train(more_steps, manifest, "correct")
    assert calls[2:] == ["trainer.main"]
    assert "steps=2" in json.loads((tmp_path / "out" / "runs" / "correct" / "summary.json").read_text())
    assert "rebuilding run correct" in capsys.readouterr().out

    more_docs = dataclasses.replace(more_steps, docs=2)
    lessons.train(more_docs, lessons.prepare_data(more_docs), "correct")
    assert calls[3:] == ["pipelines.tokenize", "trainer.main"]  # new data, so the run is redone too
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


# fake outputs of the three runs, as the trainer, compare and audit write them:
# (train losses, held-out losses at steps 9 and 19, compare verdict, audit run check or None)
FAKE = {
    "correct": ([5.0 - 0.01 * s for s in range(25)], [7.0, 6.5], True, {"passed": True, "summary": "ok"}),
    "double_sharding": (
        [5.2 - 0.01 * s for s in range(25)],
        [7.2, 6.9],
        False,
        {"passed": False, "summary": "double sharding: from step 0 <hosts>"},
    ),
    "bf16_moments": ([5.1 - 0.01 * s for s in range(25)], [6.96, 6.46], False, None),  # no run check: "not run"
}


def _write_fake_lessons(out: Path) -> str:
    ref_train, ref_held = FAKE["correct"][0], FAKE["correct"][1]
    for name, (train, held, passed, run_check) in FAKE.items():
        rows = [{"step": s, "loss": x, "step_time_s": 0.5} for s, x in enumerate(train)]
        rows[9]["heldout_loss"], rows[19]["heldout_loss"] = held
        (out / "runs" / name).mkdir(parents=True)
        (out / "runs" / name / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        d_train = [a - b for a, b in zip(train, ref_train)]
        d_held = [a - b for a, b in zip(held, ref_held)]
        comp = {
            "verdict": {
                "passed": passed,
                "summary": f"{name}: held-out <&> summary",
                "tolerance": 0.01,
                "train_loss_gap": {"final": d_train[-1]},
            },
            "aligned": {
                "heldout_loss": {"tokens": [10.0, 20.0], "diff": d_held},
                "loss_smoothed": {"tokens": [float(s + 1) for s in range(25)], "diff": d_train},
            },
            "data": {"summary": "identical batches"},
        }
        (out / "compare" / name).mkdir(parents=True)
        (out / "compare" / name / "compare.json").write_text(json.dumps(comp))
        checks = {"plan": {"passed": True}, **({"run": run_check} if run_check else {})}
        (out / "audit" / name).mkdir(parents=True)
        (out / "audit" / name / "audit.json").write_text(json.dumps({"passed": passed, "checks": checks}))
    manifest = out / "manifest.json"
    manifest.write_text(json.dumps({"counts": {"train": 72}}))
    return str(manifest)


def test_the_summary_tabulates_train_against_heldout_loss_of_each_run_vs_the_correct_one(tmp_path):
    import html.parser
    import re
    import xml.etree.ElementTree as ET

    manifest = _write_fake_lessons(tmp_path)
    lessons.summarize(lessons.LessonsConfig(out=str(tmp_path)), manifest, {"correct": 12.5})

    runs = json.loads((tmp_path / "lessons.json").read_text())["runs"]
    ds = runs["double_sharding"]
    assert ds["train_loss_last20_mean"] == pytest.approx(sum(FAKE["double_sharding"][0][-20:]) / 20)
    assert ds["heldout_loss_final"] == 6.9 and ds["heldout_gap_vs_correct_final"] == pytest.approx(0.4)
    assert ds["train_gap_vs_correct_final_smoothed"] == pytest.approx(0.2)
    assert ds["compare_verdict"] == "FAIL" and ds["audit_run_passed"] is False
    assert runs["bf16_moments"]["audit_run_passed"] is None and runs["correct"]["train_wall_seconds"] == 12.5
    assert runs["correct"]["step_seconds_sum"] == pytest.approx(12.5)

    md = (tmp_path / "lessons.md").read_text().splitlines()
    assert len(md) == 5 and md[0].startswith("| run | train loss")
    assert md[2] == "| correct | 4.8550 | 6.5000 | +0.0000 | +0.0000 | pass | pass |"
    assert md[3] == "| double_sharding | 5.0550 | 6.9000 | +0.2000 | +0.4000 | FAIL | FAIL |"
    assert md[4] == "| bf16_moments | 4.9550 | 6.4600 | +0.1000 | -0.0400 | FAIL | not run |"  # not "FAIL"

    page = (tmp_path / "index.html").read_text()

    class Cells(html.parser.HTMLParser):
        def __init__(self):
            super().__init__()
            self.cells, self.urls, self.tags, self._in = [], [], [], False

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            self.urls += [v for k, v in attrs if k in ("src", "href")]
            self._in = tag == "td"

        def handle_endtag(self, tag):
            self._in = False

        def handle_data(self, data):
            if self._in:
                self.cells.append(data)

    p = Cells()
    p.feed(page)
    # the same table as lessons.md, cell for cell
    assert p.cells == [c.strip() for line in md[2:] for c in line.strip("|").split("|")]
    assert "held-out &lt;&amp;&gt; summary" in page and "from step 0 &lt;hosts&gt;" in page  # escaped
    assert "<hosts>" not in page and "audit: run check not run" in page
    # one figure, inline and well-formed, with the runs' gap curves; nothing fetched
    svgs = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    assert len(svgs) == 1 and ET.fromstring(svgs[0]).tag == "{http://www.w3.org/2000/svg}svg"
    assert all(n in svgs[0] for n in FAKE) and "Δ held-out loss" in svgs[0]
    assert "script" not in p.tags and "img" not in p.tags
    assert sorted(p.urls) == sorted(
        [f"compare/{n}/compare.html" for n in FAKE] + [f"audit/{n}/report.html" for n in FAKE]
    )


# --- every number refused before any stage runs (issue 55, finding 12) --------------------------


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--plant_copies", "0"),
        ("--plant_copies", "-3"),
        ("--docs", "0"),
        ("--steps", "0"),
        ("--lr", "nan"),
        ("--lr", "0"),
        ("--lr", "inf"),
        ("--seq_len", "1"),
        ("--heldout_fraction", "0"),
        ("--heldout_fraction", "1"),
        ("--global_batch_size", "0"),
        ("--eval_every", "0"),
        ("--warmup_steps", "-1"),
        ("--plant_batch_size", "0"),
        ("--steps", "2.5"),
    ],
)
def test_a_bad_number_is_one_error_line_and_exit_2_before_any_stage(tmp_path, monkeypatch, capsys, flag, value):
    def stage(*_a, **_k):
        raise AssertionError("a stage ran before the numbers were checked")

    for name in ("prepare_data", "train", "_loss_lessons", "_main"):
        monkeypatch.setattr(lessons, name, stage)
    monkeypatch.setattr(lessons.contamination, "lesson", stage)
    out = tmp_path / "lessons"
    with pytest.raises(SystemExit) as e:
        lessons.main(["--out", str(out), flag, value])
    err = capsys.readouterr()
    lines = err.err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1 and lines[0].startswith("error:") and flag in lines[0]
    assert err.out == "" and not out.exists()


def test_every_lessons_setting_has_a_checked_parser():
    """A field added to LessonsConfig without a parser that checks it would fail here (and in main)."""
    assert set(lessons.FLAG_TYPES) == {f.name for f in dataclasses.fields(lessons.LessonsConfig)}
    for f in dataclasses.fields(lessons.LessonsConfig):
        if f.name != "out":
            assert lessons.FLAG_TYPES[f.name] not in (int, float), f.name
