"""Eval-leakage removal at tokenize time (mixture `decontaminate:`): contaminated training documents
become counted rejects `contaminated:<task>`, the manifest records the index and detector it was
decontaminated against, the audit with that index proves none is left, and the manifest is
byte-identical on one and two Beam workers."""

from __future__ import annotations

import json

import pytest
import yaml

from audit.__main__ import main as audit_main
from pipelines.leakage import index as li
from pipelines.mixture import MixtureError, parse_mixture
from pipelines.tokenize import run
from tests.pipelines import leak_plants as lp


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A jsonl source of clean sample documents and plants (2 per type, all ids known), the
    mixture decontaminating it against the plants' task folder, and the ids decon must remove."""
    root = tmp_path_factory.mktemp("decon-job")
    tasks = lp.write_tasks(root / "tasks")
    index = li.build(str(tasks))
    docs = lp.plants(index, per_type=2)[:120] + [d for d in lp.plants(index, per_type=2) if d[1] != "clean"]
    lines, want = [], {}
    for k, (text, kind, item) in enumerate(docs):
        lines.append(json.dumps({"id": f"d{k:04d}", "text": text}))
        if kind in ("verbatim", "reformatted"):
            want[f"d{k:04d}"] = f"contaminated:{item[0]}"
    for f in range(3):  # three files: two workers tokenize some each
        (root / f"web-{f}.jsonl").write_text("\n".join(lines[f::3]) + "\n")
    mixture = {
        "name": "decon",
        "tokenizer": "dolma2",
        "seq_len": 64,
        "seed": 0,
        "heldout_fraction": 0.0,
        "dedup": False,
        "decontaminate": {"tasks": str(tasks)},
        "sources": [{"name": "web", "paths": [str(root / "web-*.jsonl")], "weight": 1.0}],
    }
    (root / "mixture.yaml").write_text(yaml.safe_dump(mixture))
    return root, tasks, index, len(docs), want


@pytest.fixture(scope="module")
def one_worker(corpus):
    root = corpus[0]
    run(["--mixture", str(root / "mixture.yaml"), "--output", str(root / "out1"), "--direct_num_workers=1"])
    return root / "out1"


def test_contaminated_training_documents_are_counted_rejects_and_the_manifest_records_the_index(corpus, one_worker):
    _, _, index, n, want = corpus
    m = json.loads((one_worker / "manifest.json").read_text())
    c = m["sources"]["web"]["counts"]
    assert c["documents"] == n and c["train"] == n - len(want)
    assert {r: k for r, k in c["rejected"].items() if k} == {
        r: list(want.values()).count(r) for r in set(want.values())
    }
    assert set(c["rejected"]) >= {f"contaminated:{t}" for t in index.tasks}  # every task listed, 0 or not
    rejects = [json.loads(x) for x in (one_worker / "rejects" / "web.jsonl").read_text().splitlines()]
    assert {r["id"]: r["reason"] for r in rejects} == want and all(r["excerpt"] for r in rejects)
    rec = m["mixture"]["decontaminate"]
    assert rec["index_sha256"] == index.sha256 and rec["tasks"] == list(index.tasks)
    assert rec["detector"]["threshold"] == 0.8 and rec["detector"]["mode"] == "decon"
    assert str(corpus[1]) not in json.dumps(m)  # content-addressed: the folder's path is not recorded


def test_the_audit_proves_the_shards_hold_none_of_the_instances(corpus, one_worker, tmp_path):
    out = tmp_path / "audit"
    manifest = str(one_worker / "manifest.json")
    assert audit_main(["--data", manifest, "--out", str(out), "--eval-tasks", str(corpus[1])]) == 0
    r = json.loads((out / "audit.json").read_text())["checks"]
    assert r["accounting"]["passed"] is True  # contaminated:<task> is a reason the pipeline writes
    leak = r["task_contamination"]
    assert leak["passed"] is True and "decontaminated at tokenize time against this index" in leak["summary"]
    assert leak["figures"]["tokenize_decontamination"] == [
        {
            "manifest": 0,
            "decontaminated_at_tokenize": True,
            "index_sha256": corpus[2].sha256,
            "same_index": True,
            "same_detector": True,
        }
    ]


def test_a_bad_decontaminate_setting_is_refused():
    base = {
        "name": "x",
        "tokenizer": "dolma2",
        "seq_len": 8,
        "seed": 0,
        "heldout_fraction": 0.0,
        "dedup": False,
        "sources": [{"name": "web", "paths": ["x"], "weight": 1.0}],
    }
    for bad in (
        {"tasks": ""},
        {"tasks": "d", "threshold": 1.5},
        {"tasks": "d", "mode": "fuzzy"},
        {"tasks": "d", "x": 1},
    ):
        with pytest.raises(MixtureError, match="decontaminate"):
            parse_mixture({**base, "decontaminate": bad})
    assert parse_mixture({**base, "decontaminate": {"tasks": "d", "threshold": 0.88}}).decontaminate.threshold == 0.88


@pytest.mark.slow
def test_the_manifest_is_byte_identical_on_two_workers_with_removal_on(corpus, one_worker):
    root = corpus[0]
    run(
        [
            "--mixture",
            str(root / "mixture.yaml"),
            "--output",
            str(root / "out2"),
            "--direct_num_workers=2",
            "--direct_running_mode=multi_processing",
        ]
    )
    assert (root / "out2" / "manifest.json").read_bytes() == (one_worker / "manifest.json").read_bytes()
    assert (root / "out2" / "rejects" / "web.jsonl").read_bytes() == (one_worker / "rejects" / "web.jsonl").read_bytes()


def test_a_task_folder_that_cannot_be_read_is_refused_before_anything_is_written(corpus, tmp_path, capsys):
    from pipelines.tokenize import main

    root = corpus[0]
    mixture = yaml.safe_load((root / "mixture.yaml").read_text())
    mixture["decontaminate"] = {"tasks": str(tmp_path / "no-such-tasks")}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(mixture))
    assert main(["--mixture", str(tmp_path / "m.yaml"), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "no-such-tasks" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_a_task_folder_built_for_other_ids_is_refused_naming_both_fingerprints(corpus, tmp_path, capsys):
    """decontaminate.tasks: the one check the trainer and the audit make (pipelines.task_tokenizer):
    a folder of the same tokenizer name and vocabulary but another PAD (another fingerprint) would
    match nothing; refused in one line, exit 2, before anything is written."""
    from pipelines.task_tokenizer import expected_entry
    from pipelines.tokenize import main

    root, tasks = corpus[0], corpus[1]
    other = lp.with_other_pad(tasks, tmp_path / "other-tasks")
    mixture = yaml.safe_load((root / "mixture.yaml").read_text())
    mixture["decontaminate"] = {"tasks": str(other)}
    (tmp_path / "m.yaml").write_text(yaml.safe_dump(mixture))
    capsys.readouterr()
    assert main(["--mixture", str(tmp_path / "m.yaml"), "--output", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    theirs = json.loads((other / "manifest.json").read_text())["tokenizer"]["fingerprint"]
    assert err.startswith(f"error: decontaminate.tasks {other} was built with another tokenizer") and "\n" not in err
    assert theirs[:16] in err and expected_entry("dolma2")["fingerprint"][:16] in err, err
    assert "pad_id 100257 (the mixture's 100277)" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


def test_copies_whose_whitespace_is_tabs_newlines_or_no_break_spaces_are_removed_at_tokenize_time(tmp_path):
    """The tokenize job's removal uses the audit's detector: copies whose words are separated by tabs,
    newlines or no-break spaces (decon's cleaning makes each the verbatim copy) are rejected as
    contaminated:<task>, every one, and the clean documents are kept."""
    tasks = lp.write_tasks(tmp_path / "tasks")
    index = li.build(str(tasks))
    plants = lp.whitespace_plants(index, per_kind=2)
    clean = [t for t, kind, _ in lp.plants(index, per_type=1) if kind == "clean"][:20]
    lines = [json.dumps({"id": f"c{k}", "text": t}) for k, t in enumerate(clean)]
    lines += [json.dumps({"id": f"p{k}", "text": t}) for k, (t, _, _) in enumerate(plants)]
    (tmp_path / "web.jsonl").write_text("\n".join(lines) + "\n")
    mixture = {
        "name": "decon-ws", "tokenizer": "dolma2", "seq_len": 64, "seed": 0, "heldout_fraction": 0.0,
        "dedup": False, "decontaminate": {"tasks": str(tasks)},
        "sources": [{"name": "web", "paths": [str(tmp_path / "web.jsonl")], "weight": 1.0}],
    }  # fmt: skip
    (tmp_path / "mixture.yaml").write_text(yaml.safe_dump(mixture))
    run(["--mixture", str(tmp_path / "mixture.yaml"), "--output", str(tmp_path / "out"), "--direct_num_workers=1"])
    rejects = [json.loads(x) for x in (tmp_path / "out" / "rejects" / "web.jsonl").read_text().splitlines()]
    assert {r["id"]: r["reason"] for r in rejects} == {
        f"p{k}": f"contaminated:{item[0]}" for k, (_, _, item) in enumerate(plants)
    }
    counts = json.loads((tmp_path / "out" / "manifest.json").read_text())["sources"]["web"]["counts"]
    assert counts["train"] == len(clean)
