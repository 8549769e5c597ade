"""The audit of a run that trained on several manifests (the trainer's `data` list; the AI2 recipe
keeps its held-out validation sets in a manifest of their own): every check covers all of them —
the run check's loader fingerprint is the plan over all manifests, and a held-out document in one
manifest that is a copy of a training document in another fails contamination, naming both."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from audit import AuditConfig, run_audit, runlog
from audit.__main__ import main
from contract.rundir import RunDir
from dataloader import LoaderConfig
from dataloader.loader import load_plan
from tests.audit import audit_fixtures as fx

G, H, STEPS = 8, 4, 40
VAL_SOURCES = (fx.FixtureSource("val-web", 1.0, 30), fx.FixtureSource("val-code", 1.0, 20))
ALL_PASS = {
    "integrity": True,
    "accounting": True,
    "mixture": True,
    "sharding": True,
    "run": True,
    "contamination": True,
    "statistics": True,
    "task_contamination": None,  # not run without --eval-tasks
}


def two_manifest_run(root, **val_kw):
    """A training manifest, a held-out-only one, and a run logged on both (in that order)."""
    train = fx.write_sample(str(root / "train"))
    val = fx.write_sample(str(root / "val"), sources=VAL_SOURCES, seed=1, heldout_only=True, **val_kw)
    fx.write_run_logs(str(root / "run"), [train, val], hosts=H, steps=STEPS, global_batch_size=G)
    return train, val


def audit(root, data):
    results, meta = run_audit(AuditConfig(data=data, out=str(root / "report"), run=RunDir(root / "run")))
    return {r.name: r for r in results}, meta


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("multi")
    return (root, *two_manifest_run(root))


def test_a_run_on_a_training_and_a_heldout_manifest_passes_every_check(clean):
    root, train, val = clean
    res, meta = audit(root, [train, val])
    assert {k: r.passed for k, r in res.items()} == ALL_PASS, {
        k: r.failures[:3] for k, r in res.items() if not r.passed
    }
    # the run check compared the run's loader fingerprint with the loader's plan over both manifests
    _, plan = load_plan(LoaderConfig(data=[train, val], global_batch_size=G))
    assert meta["plan_size"] == plan.size and "loader_fingerprint" not in res["run"].not_run
    assert res["run"].figures["positions_verified_against_plan"] == STEPS * G
    # contamination saw every held-out document of both manifests and every training document
    counts = [json.load(open(p))["sources"] for p in (train, val)]
    c = res["contamination"].figures
    assert c["heldout_documents"] == sum(s["counts"]["heldout"] for m in counts for s in m.values())
    assert c["train_documents"] == sum(s["counts"]["train"] for m in counts for s in m.values())
    assert {r["source"] for r in c["ngram_by_source"]} >= {"val-web", "val-code"}
    # integrity, accounting and statistics list each manifest's rows
    assert {r["manifest"] for r in res["integrity"].figures["shards"]} == {train, val}
    assert [r["source"] for r in res["accounting"].figures["sources"]] == ["web", "code", "val-web", "val-code"]
    assert meta["manifests"] == [train, val] and "manifest" not in meta


def test_the_run_check_fails_when_only_the_training_manifest_is_audited(clean):
    root, train, _ = clean
    res, _ = audit(root, [train])
    assert res["run"].passed is False and "trained on other manifests" in res["run"].failures[0]
    assert "loader fingerprint" in res["run"].failures[1]


def test_without_data_the_audit_reads_the_manifests_from_run_json(clean, tmp_path):
    root, train, val = clean
    assert main(["--run", str(root / "run"), "--out", str(tmp_path / "r")]) == 0
    doc = json.loads((tmp_path / "r" / "audit.json").read_text())
    assert doc["passed"] and doc["inputs"]["manifests"] == [train, val]
    assert doc["inputs"]["data_from"] == "the run's run.json"


def test_a_heldout_copy_of_a_training_document_in_another_manifest_fails_contamination(tmp_path):
    copied = fx.first_document(str(fx.write_sample(str(tmp_path / "probe"))), "web")  # = train's (same seed)
    train, val = two_manifest_run(tmp_path, extra_heldout=(copied,))
    res, _ = audit(tmp_path, [train, val])
    assert {k: r.passed for k, r in res.items()} == {**ALL_PASS, "contamination": False}
    c = res["contamination"]
    assert c.figures["exact_overlap"] == 1
    # val-web's 31st held-out document, the last of its shard 0 (16 of its documents: 0, 2, …, 30)
    assert c.failures == [
        f"training document 0 of web/train (ends in web/train-00000-of-00002.arrayrecord of "
        f"{train}) is an exact copy of held-out document 15 of val-web/heldout (ends in "
        f"val-web/heldout-00000-of-00002.arrayrecord of {val})"
    ]


def test_a_broken_second_manifest_exits_2_naming_it_and_a_damaged_shard_names_its_manifest(clean, tmp_path, capsys):
    root, train, val = clean
    shutil.copytree(root, tmp_path / "c")
    train, val = str(tmp_path / "c" / "train" / "manifest.json"), str(tmp_path / "c" / "val" / "manifest.json")
    shard = "val-code/heldout-00001-of-00002.arrayrecord"
    fx.tamper_one_byte(str(tmp_path / "c" / "val" / shard))
    res, _ = audit(tmp_path / "c", [train, val])
    assert res["integrity"].passed is False
    assert res["integrity"].failures[0].startswith(f"{val}: shard {shard} (val-code/heldout): sha256 ")
    assert res["accounting"].passed and res["run"].passed
    fx.edit_manifest(val, lambda m: m["sources"]["val-web"]["counts"].__setitem__("duplicates", 7), refingerprint=False)
    assert main(["--data", train, val, "--out", str(tmp_path / "r")]) == 2
    assert val in capsys.readouterr().err
    assert main(["--data", train, str(tmp_path / "nowhere.json"), "--out", str(tmp_path / "r")]) == 2
    assert "nowhere.json" in capsys.readouterr().err
    (tmp_path / "no-record").mkdir()  # no --data, and no run.json to name the manifests
    assert main(["--run", str(tmp_path / "no-record"), "--out", str(tmp_path / "r")]) == 2
    assert "run.json is missing" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--out", str(tmp_path / "r")])
    assert e.value.code == 2


def test_a_run_audited_on_other_manifests_fails_the_run_check_naming_them_and_never_crashes(tmp_path, capsys):
    # the run read 2 sources; the audited dataset has 1: its example ids name sources and records
    # the audited plan does not have
    root = tmp_path
    run_on = fx.write_sample(str(root / "ran"))
    other = fx.write_sample(str(root / "other"), sources=(fx.FixtureSource("web", 1.0, 30),), seed=3)
    fx.write_run_logs(str(root / "run"), run_on, hosts=H, steps=STEPS, global_batch_size=G)
    res, _ = audit(root, other)
    assert res["run"].passed is False
    assert any("the run trained on other manifests than the audited ones" in f for f in res["run"].failures)
    assert "logs" in res["run"].not_run
    assert main(["--run", str(root / "run"), "--data", other, "--out", str(root / "r")]) == 1
    assert "trained on other manifests" in capsys.readouterr().out
    # without run.json nothing says which manifests the run read: the logged ids themselves fail
    (root / "run" / "run.json").unlink()
    res, _ = audit(root, other)
    assert res["run"].passed is False and res["run"].failures
    plan = load_plan(LoaderConfig(other, G))[1]
    web_records = plan.sources[0].records
    ids = np.array([0, web_records - 1, web_records, 1 << 40, -1], np.int64)
    assert runlog.in_plan(plan, ids).tolist() == [True, True, False, False, False]
