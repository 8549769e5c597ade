"""`make lessons`' contamination lesson: the planted corpus, tokenized by the pipeline with and
without removal, is named by the audit, the removal rejects its plants as `contaminated:<task>`,
the planted run's clean-subset metric leaves out exactly what the audit found, and the two runs
differ in their data (and the audit they read) alone."""

from __future__ import annotations

import dataclasses
import html.parser
import json
from pathlib import Path

import numpy as np
import pytest

from contract import downstream as ds
from lessons import cli as lessons
from lessons import contamination as lc
from trainer.config.schema import load_config
from trainer.downstream import metric
from trainer.downstream.check import check_downstream
from trainer.downstream.clean import contaminated_instances
from trainer.downstream.evaluator import clean_metrics

PLAN = lc.Plan(
    out="", docs=4, heldout_fraction=0.2, steps=3, global_batch_size=2, lr=5e-3, warmup_steps=1, plant_copies=1
)


def _in_process(cmd, ok=(0,)):
    """lessons.io.run without a subprocess: the pipeline's and the audit's own entry points."""
    if cmd[2] == "pipelines.tokenize":
        from pipelines.tokenize import run

        run(cmd[3:])
        code = 0
    else:
        from audit.__main__ import main

        code = main(cmd[3:])
    assert code in ok, (cmd, code)
    return code, 0.0


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The lesson's data (4 prose documents + every second copycolors instance, once each), both
    sides tokenized and the planted side audited, in process."""
    plan = dataclasses.replace(PLAN, out=str(tmp_path_factory.mktemp("lesson") / "contamination"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(lc, "run", _in_process)
        lc.prepare_data(plan)
        lc.audit(plan, "planted")
    return plan


def _planted_docs() -> set[int]:
    from pipelines.leakage.index import open_index

    index = open_index(str(lc.TASKS))
    return {int(index.item_doc[i]) for i in lc.planted_items(index)}


def test_the_plants_are_every_second_instance_of_the_task_verbatim_and_unique(built):
    planted = _planted_docs()
    assert planted == set(range(0, 100, 2))  # copycolors' doc ids 0..99
    lines = [json.loads(x) for x in (Path(built.out) / "src" / "docs.jsonl").read_text().splitlines()]
    plants = [d for d in lines if d["id"].startswith("plant-")]
    assert len(lines) == built.docs + len(plants) and len(plants) == len(planted) * built.plant_copies
    assert len({d["text"] for d in lines}) == len(lines)  # distinct (one copy each here): dedup keeps them
    task = ds.load(lc.TASKS, [lc.PLANTED_TASK]).tasks[lc.PLANTED_TASK].arrays
    from pipelines.dolma2_tokenizer import dolma2

    q, off = task["query"], task["query_offsets"]
    first = dolma2().decode(q[off[0] : off[1]].tolist())  # doc 0's query: few-shot context + its question
    assert first.split("\n\n")[-1] in plants[0]["text"] and plants[0]["id"] == f"plant-{lc.PLANTED_TASK}-0-0"


def test_the_audit_names_the_planted_task_and_the_removal_rejects_exactly_those_documents(built):
    planted = _planted_docs()
    check = json.loads((lc.audit_dir(built, "planted") / "audit.json").read_text())["checks"]["task_contamination"]
    found = check["figures"]["instances"]
    assert check["passed"] is False and lc.PLANTED_TASK in check["summary"]
    assert set(found) == {lc.PLANTED_TASK}  # the task planted, not the other
    # the removal side: the same documents, each plant in training rejected as contaminated:<task>
    removed = json.loads(lc.manifest_path(built, "removed").read_text())
    counts = removed["sources"]["prose"]["counts"]
    rejects = [
        json.loads(x)
        for x in (lc.manifest_path(built, "removed").parent / "rejects" / "prose.jsonl").read_text().splitlines()
    ]
    assert {r["reason"] for r in rejects} == {f"contaminated:{lc.PLANTED_TASK}"}
    assert counts["rejected"][f"contaminated:{lc.PLANTED_TASK}"] == len(rejects) > len(planted) // 2
    assert removed["mixture"]["decontaminate"]["index_sha256"] == check["figures"]["index"]["sha256"]
    # the audit and the tokenize-time removal found the same instances (the plants in training)
    assert set(found[lc.PLANTED_TASK]) == {int(r["id"].split("-")[-2]) for r in rejects} <= planted
    planted_manifest = json.loads(lc.manifest_path(built, "planted").read_text())["sources"]["prose"]["counts"]
    assert planted_manifest["train"] == counts["train"] + len(rejects)  # the same split, less the plants


def test_the_planted_runs_clean_subset_metric_leaves_out_what_the_audit_found(built):
    tasks = ds.load(lc.TASKS)
    planted = json.loads(lc.manifest_path(built, "planted").read_text())["fingerprint"]  # the run's data
    found = contaminated_instances(str(lc.audit_dir(built, "planted")), tasks, [planted])
    assert found[lc.PLANTED_TASK] and not found["basic_skills_pattern_rc_5shot"]
    # a model that knows exactly the found instances: full accuracy is their share, the clean subset's 0
    a = tasks.tasks[lc.PLANTED_TASK].arrays
    gold = np.asarray(a["label_id"])
    ll = np.zeros(np.asarray(a["choices"]).shape)
    rows = np.arange(len(gold))
    knows = np.isin(np.asarray(a["doc_id"]), sorted(found[lc.PLANTED_TASK]))
    ll[rows, np.where(knows, gold, (gold + 1) % ll.shape[1])] = 1.0
    e = metric.entries(a, ll, fast_mc=True)
    assert metric.compute("acc", e)["acc_v2"] == pytest.approx(knows.mean())
    assert clean_metrics("acc", e, found[lc.PLANTED_TASK], "float32")["acc_v2"] == 0.0


def test_the_two_runs_differ_in_their_data_and_the_audit_they_read_alone(tmp_path):
    plan = dataclasses.replace(PLAN, out=str(tmp_path))
    runs = {s: load_config(lc.TINY, lc.overrides(plan, s)) for s in lc.SIDES}
    p, r = runs["planted"], runs["removed"]
    changed = {k for k, v in p.to_dict().items() if v != r.to_dict()[k]}
    assert changed == {"data", "downstream"}
    assert p.downstream.model_copy(update={"clean_from": None}) == r.downstream.model_copy(update={"clean_from": None})
    assert p.downstream.clean_from == str(lc.audit_dir(plan, "planted")) and p.downstream.every == plan.steps
    assert (p.steps, p.global_batch_size) == (plan.steps, plan.global_batch_size)
    # the task files fit the runs' data: the lesson tokenizes at their context length
    assert set(check_downstream(p.downstream, model_ctx_len=lc.model_ctx_len(), tokenizer="dolma2").labels) == set(
        p.downstream.tasks
    )
    m = {s: lc.mixture(plan, s) for s in lc.SIDES}
    assert {k: v for k, v in m["removed"].items() if k != "decontaminate"} == m["planted"]
    assert m["removed"]["decontaminate"] == {"tasks": str(lc.TASKS)}


def _fake_run(plan: lc.Plan, side: str, values: dict[str, float]) -> None:
    run_dir = Path(plan.out) / "runs" / side
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "loss": 5.0}, {"step": 1, "loss": 4.0, **values}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_lesson_reports_what_the_plants_bought_in_lessons_json_and_the_index_page(built, tmp_path):
    import shutil

    plan = dataclasses.replace(built, out=str(tmp_path / "contamination"))
    shutil.copytree(built.out, plan.out)
    shutil.copytree(lc.audit_dir(built, "planted"), lc.audit_dir(plan, "removed"))  # any audit.json will do
    key = lambda s, clean="": metric.metric_key(lc.PLANTED_TASK, s) + clean
    _fake_run(plan, "planted", {key("acc_v2"): 0.5, key("acc_v2", " clean"): 0.125, key("soft_v2"): 0.25})
    _fake_run(plan, "removed", {key("acc_v2"): 0.25, key("acc_v2", " clean"): 0.25})
    result = lc.summarize(plan, {"planted": 1.0}, sorted(_planted_docs()))
    b = result["bought"]
    assert b["acc_v2"] == {"vs_clean_subset": 0.375, "vs_removed_run": 0.25}
    assert b["soft_v2"] == {"vs_clean_subset": None, "vs_removed_run": None}  # not logged: not made up
    s = result["sides"]["planted"]
    assert s["planted_found"] == s["instances_found"][lc.PLANTED_TASK] > 0
    assert s["found_not_planted"] == [] and s["audit_passed"] is False

    cfg = lessons.LessonsConfig(out=str(tmp_path))
    lessons.summarize(cfg, None, {}, result)
    assert json.loads((tmp_path / "lessons.json").read_text())["contamination"] == json.loads(json.dumps(result))
    md = (tmp_path / "lessons.md").read_text()
    assert "| planted | FAIL | copycolors_10way_fast: " in md and "0.5000 / 0.1250" in md
    assert "accuracy +0.3750 vs its clean-subset twin, +0.2500 vs the removed run" in md
    page = (tmp_path / "index.html").read_text()

    class Links(html.parser.HTMLParser):
        urls: list[str] = []

        def handle_starttag(self, tag, attrs):
            self.urls += [v for k, v in attrs if k == "href"]

    p = Links()
    p.feed(page)
    assert p.urls == [f"contamination/audit/{s}/report.html" for s in lc.SIDES]
    assert "+0.3750 vs its clean-subset twin" in page and "Training loss against held-out loss" not in page
