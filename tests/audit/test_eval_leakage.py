"""Check 8, eval leakage, in the audit's shard pass: planted task instances in the training shards
(one of them across a shard boundary) are found by the same Beam pass as the other data checks,
reported per task and per source with escaped examples, reused by `--data-checks reuse:` only with
the same index and detector settings, and the audit is the same on one and two Beam workers."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from audit.__main__ import main
from audit.shard_reader import iter_record_chunks, load_manifest
from pipelines.dolma2_tokenizer import dolma2
from pipelines.leakage import index as li
from tests.audit import audit_fixtures as fx
from tests.pipelines import leak_plants as lp

SEQ = 16
FOUND_BY_DECON = ("verbatim", "reformatted")


@pytest.fixture(scope="module")
def planted(tmp_path_factory):
    """A sample whose web/train split ends with planted documents (2 of each plant type), cut into
    two shards at a record boundary inside the first verbatim plant. Returns (root, manifest,
    tasks dir, [(web/train ordinal, type, item)])."""
    root = tmp_path_factory.mktemp("planted")
    tasks = lp.write_tasks(root / "tasks")
    index = li.build(str(tasks))
    plants = [d for d in lp.plants(index, per_type=2) if d[1] != "clean"]
    p0, q0, a0 = (dolma2().decode(index.part(p, 0).tolist()) for p in ("passage", "question", "answer"))
    item0 = (index.tasks[int(index.item_task[0])], int(index.item_doc[0]))
    plants.insert(0, (f"<b>Is <script>alert(1)</script> escaped?</b> {p0}{q0}{a0}", "verbatim", item0))
    enc = dolma2()
    manifest = fx.write_sample(
        str(root / "data"), shards=1, seq_len=SEQ, extra_train=tuple(enc.encode_ordinary(t) for t, _, _ in plants)
    )
    m = load_manifest(manifest)
    first = int(m.source("web")["counts"]["train"]) - len(plants)
    (ref,) = m.shards("train", "web")
    records = np.concatenate([np.frombuffer(b"".join(c), "<u4") for c in iter_record_chunks(ref.abspath)])
    ends = np.flatnonzero(records == fx.EOS_ID)
    k = first + next(j for j, (_, kind, _) in enumerate(plants) if kind == "verbatim")
    start = int(ends[k - 1]) + 1
    cut = start // SEQ + 1  # the first record boundary inside that plant
    assert cut * SEQ < int(ends[k]), "the plant must cross the boundary"
    recs = records.reshape(-1, SEQ)
    os.remove(ref.abspath)
    entries = [
        {
            "path": f"web/train-0000{i}-of-00002.arrayrecord",
            **fx.write_shard(os.path.join(str(root / "data"), f"web/train-0000{i}-of-00002.arrayrecord"), part),
        }
        for i, part in enumerate((recs[:cut], recs[cut:]))
    ]
    fx.edit_manifest(manifest, lambda raw: raw["sources"]["web"]["splits"]["train"].update(shards=entries))
    return root, manifest, tasks, [(first + j, kind, item) for j, (_, kind, item) in enumerate(plants)], k


def _audit(root, manifest, tasks, out, *extra):
    return main(
        [
            "--data",
            manifest,
            "--out",
            str(root / out),
            "--eval-tasks",
            str(tasks),
            "--eval-leakage-mode",
            "both",
            *extra,
        ]
    )


@pytest.fixture(scope="module")
def one_worker(planted):
    """The audit on one worker, with a --temp_location: the workers read the index from a file
    there, as on Dataflow (a local folder here)."""
    root, manifest, tasks, _, _ = planted
    (root / "temp").mkdir()
    assert _audit(root, manifest, tasks, "one", f"--temp_location={root / 'temp'}") == 1  # contaminated: fails
    return json.loads((root / "one" / "audit.json").read_text())


def _flagged(failures_or_doc) -> set[int]:
    return {int(f.split("training document ")[1].split(" ")[0]) for f in failures_or_doc}


def test_the_shard_pass_finds_the_planted_instances_and_only_those(planted, one_worker):
    _, _, _, plants, across = planted
    r = one_worker["checks"]["task_contamination"]
    assert r["passed"] is False and one_worker["passed"] is False
    want = {o for o, kind, _ in plants if kind in FOUND_BY_DECON}
    flagged = _flagged(r["failures"])  # "both": what either detector found, each document once
    assert r["failure_count"] == len(flagged) == len(r["failures"])
    by_decon = _flagged(f for f in r["failures"] if "(decon, score" in f)
    assert across in want and by_decon == want  # the plant across the shard boundary is rebuilt and found
    fig = r["figures"]
    by_task = {row["task"]: row for row in fig["per_task"]}
    planted_items = {item for o, kind, item in plants if kind in FOUND_BY_DECON}
    assert {(t, d) for t, ds in fig["instances"].items() for d in ds} == planted_items
    assert sum(row["instances_contaminated"] for row in by_task.values()) == len(planted_items)
    web = next(row for row in fig["per_source"] if row["source"] == "web")
    assert web["contaminated_docs"] == len(want) and web["contaminated_tokens"] > 0
    assert next(row for row in fig["per_source"] if row["source"] == "code")["contaminated_docs"] == 0
    assert sum(fig["score_hist"]["documents"][16:]) >= len(want)  # every flagged one scored >= 0.8
    assert fig["index"]["items"] == 140 and fig["index"]["bytes_per_worker"] > 0
    # the 13-gram cross-check also flags the question-only, passage-only and split plants
    ngram = {row["task"]: row["contaminated_docs_ngram13"] for row in fig["per_task"]}
    assert sum(ngram.values()) > len(want)
    inputs = one_worker["inputs"]["data_checks"]
    assert inputs["task_contamination"]["index_sha256"] == fig["index"]["sha256"]
    assert "task_contamination" in inputs["ran_now"]


def test_the_report_shows_the_check_with_escaped_examples(planted, one_worker):
    root = planted[0]
    html = (root / "one" / "report.html").read_text()
    assert 'id="task_contamination"' in html and "Best decon score of each scored training document" in html
    assert "Examples: the training span beside the task instance it contains" in html
    examples = one_worker["checks"]["task_contamination"]["figures"]["examples"]
    assert examples and all(x["training_text"] for x in examples)
    # the planted span is shown as the document has it: its markup escaped, never live
    assert any("<script>alert(1)</script>" in x["training_text"] for x in examples)
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    import re
    import xml.etree.ElementTree as ET

    for svg in re.findall(r"<svg.*?</svg>", html, flags=re.S):  # every figure well-formed, the histogram too
        assert ET.fromstring(svg).tag == "{http://www.w3.org/2000/svg}svg"


def test_reuse_takes_the_check_only_with_the_same_index_and_settings(planted, one_worker, capsys):
    root, manifest, tasks, _, _ = planted
    assert _audit(root, manifest, tasks, "reused", f"--data-checks=reuse:{root / 'one'}") == 1
    doc = json.loads((root / "reused" / "audit.json").read_text())
    r = doc["checks"]["task_contamination"]
    assert r["taken_from"]["path"] == str(root / "one" / "audit.json")
    assert {k: v for k, v in r.items() if k != "taken_from"} == one_worker["checks"]["task_contamination"]
    assert "task_contamination" in doc["inputs"]["data_checks"]["taken_from_previous_audit"]
    capsys.readouterr()
    assert (
        _audit(root, manifest, tasks, "other", f"--data-checks=reuse:{root / 'one'}", "--eval-leakage-threshold=0.88")
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        err.endswith(
            "it checked eval leakage with other detector settings: threshold 0.8 (now 0.88): read the "
            "shards again (--data-checks all)"
        )
        and "\n" not in err
    ), err


def test_reuse_without_eval_tasks_takes_the_three_data_checks_and_lists_check_8_as_not_run(planted, one_worker, capsys):
    """The demo's audit ran check 8; reusing it without --eval-tasks takes integrity, contamination
    and statistics and says check 8 did not run and how to take it too (it used to be refused with
    a 629-character dump of the detector settings)."""
    root, manifest, _, _, _ = planted
    out = root / "reused-no-tasks"
    assert main(["--data", manifest, "--out", str(out), f"--data-checks=reuse:{root / 'one'}"]) == 0
    doc = json.loads((out / "audit.json").read_text())
    for name in ("integrity", "contamination", "statistics"):
        assert doc["checks"][name]["taken_from"]["path"] == str(root / "one" / "audit.json")
        assert doc["checks"][name] == {**one_worker["checks"][name], "taken_from": doc["checks"][name]["taken_from"]}
    r = doc["checks"]["task_contamination"]
    sha = one_worker["checks"]["task_contamination"]["figures"]["index"]["sha256"]
    assert r["passed"] is None and "taken_from" not in r
    assert f"the reused audit ran it (index {sha[:12]}…): add --eval-tasks DIR" in r["summary"]
    assert doc["inputs"]["data_checks"]["taken_from_previous_audit"] == ["contamination", "integrity", "statistics"]
    assert {"check": "task_contamination", "part": "task_contamination", "why": r["summary"]} in doc["not_run"]
    out_text = capsys.readouterr().out
    assert "[skipped] 8. Eval leakage" in out_text and "add --eval-tasks DIR" in out_text


def test_a_task_folder_of_another_tokenizer_or_a_bad_threshold_exits_2(planted, tmp_path, capsys):
    root, manifest, tasks, _, _ = planted
    with pytest.raises(SystemExit) as e:
        _audit(root, manifest, tasks, "bad", "--eval-leakage-threshold=nan")
    assert e.value.code == 2
    assert main(["--data", manifest, "--out", str(tmp_path / "x"), "--eval-tasks", str(tmp_path / "nothing")]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_a_task_folder_or_index_built_for_other_ids_is_refused_naming_both_fingerprints(planted, tmp_path, capsys):
    """--eval-tasks: the one check the trainer and the tokenize job make (pipelines.task_tokenizer):
    same tokenizer name and vocabulary, another PAD (so another fingerprint) is refused in one
    line, exit 2, for a folder and for the index file built from it."""
    from pipelines.task_tokenizer import expected_entry

    root, manifest, tasks, _, _ = planted
    other = lp.with_other_pad(tasks, tmp_path / "other-tasks")
    li.build(str(other)).save(str(tmp_path / "other.npz"))
    theirs = json.loads((other / "manifest.json").read_text())["tokenizer"]["fingerprint"]
    mine = expected_entry("dolma2")["fingerprint"]
    capsys.readouterr()
    for given in (other, tmp_path / "other.npz"):
        out = tmp_path / f"out-{given.name}"
        assert main(["--data", manifest, "--out", str(out), "--eval-tasks", str(given)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --eval-tasks {given} was built with another tokenizer") and "\n" not in err
        assert theirs[:16] in err and mine[:16] in err and "rebuild it with" in err, err
        assert ("pad_id 100257 (the data's 100277)" in err) == (given == other)  # a folder's entry has PAD
        assert not (out / "audit.json").exists()


@pytest.mark.slow
def test_two_worker_processes_give_the_same_audit_json_as_one(planted, one_worker):
    root, manifest, tasks, _, _ = planted
    flags = ("--direct_num_workers=2", "--direct_running_mode=multi_processing", f"--temp_location={root / 'temp'}")
    assert _audit(root, manifest, tasks, "two", *flags) == 1
    two = json.loads((root / "two" / "audit.json").read_text())
    one = json.loads(json.dumps(one_worker))
    from audit.datachecks import SHA256, results_digest

    # the only difference is when each ran (and with which command line, for how long: run_facts),
    # and the digest of what a reuse takes, which covers that date
    two["inputs"]["data_checks"]["ran_at"] = one["inputs"]["data_checks"]["ran_at"]
    assert results_digest(two) == results_digest(one) == one["inputs"]["data_checks"][SHA256]
    for doc in (one, two):
        doc["inputs"]["data_checks"].pop("ran_at")
        doc["inputs"]["data_checks"].pop(SHA256)
        doc["inputs"].pop("run_facts")
    assert json.dumps(one, sort_keys=True) == json.dumps(two, sort_keys=True)


def test_the_13gram_mode_alone_gates_on_its_own_finds(planted, tmp_path):
    root, manifest, tasks, plants, _ = planted
    out = tmp_path / "ngram13"
    assert (
        main(["--data", manifest, "--out", str(out), "--eval-tasks", str(tasks), "--eval-leakage-mode", "ngram13"]) == 1
    )
    r = json.loads((out / "audit.json").read_text())["checks"]["task_contamination"]
    flagged = _flagged(r["failures"])
    kinds = {kind for o, kind, _ in plants if o in flagged}
    assert {"verbatim", "reformatted", "question_only", "passage_only", "split"} <= kinds
    assert "answer_only" not in kinds and r["figures"]["instances"] is None and r["figures"]["instances_ngram13"]


def test_both_modes_fail_on_what_the_13gram_detector_alone_finds_and_the_clean_subset_holds_it(tmp_path):
    """--eval-leakage-mode both gates on either detector: training documents holding only task
    questions (decon, which needs the answer too, finds none of them; the 13-gram cross-check finds
    them) fail the check, the line says what each detector found, and the instances
    `downstream.clean_from` leaves out are the cross-check's (not none because decon found none)."""
    from contract import downstream as ds
    from trainer.downstream.clean import contaminated_instances

    tasks = lp.write_tasks(tmp_path / "tasks")
    index = li.build(str(tasks))
    plants = [d for d in lp.plants(index, per_type=3) if d[1] == "question_only"]
    enc = dolma2()
    manifest = fx.write_sample(
        str(tmp_path / "data"), shards=1, seq_len=SEQ, extra_train=tuple(enc.encode_ordinary(t) for t, _, _ in plants)
    )
    out = tmp_path / "audit"
    assert _audit(tmp_path, manifest, tasks, "audit") == 1
    r = json.loads((out / "audit.json").read_text())["checks"]["task_contamination"]
    fig = r["figures"]
    decon_docs = sum(row["contaminated_docs"] for row in fig["per_source"])
    ngram_docs = sum(row["contaminated_docs_ngram13"] for row in fig["per_source"])
    assert decon_docs == 0 and ngram_docs >= 2 and not fig["instances"]
    assert r["passed"] is False and r["failure_count"] == ngram_docs == fig["contaminated_documents"]
    assert "decon: 0 documents, 0 instances" in r["summary"] and f"ngram13: {ngram_docs} documents" in r["summary"]
    assert all("(ngram13, score" in f for f in r["failures"])
    run_data = [json.loads(open(manifest).read())["fingerprint"]]  # the audited manifest is the run's data
    found = contaminated_instances(str(out), ds.load(tasks), run_data)
    want = {t: set(d) for t, d in fig["instances_ngram13"].items()}
    assert {t: v for t, v in found.items() if v} == want and want


def test_with_a_temp_location_the_workers_read_the_index_from_a_file_there(planted, one_worker):
    sha = one_worker["checks"]["task_contamination"]["figures"]["index"]["sha256"]
    assert (planted[0] / "temp" / f"eval-leakage-index-{sha}.npz").is_file()  # and found the plants above


def test_a_dataflow_job_carries_the_index_as_a_file_not_in_its_graph(planted):
    """Dataflow's job request must stay small: with --temp_location the DoFn holds a path."""
    from audit.contamination import ContaminationConfig
    from audit.engine import DryRun
    from audit.eval_leakage import EvalLeakageConfig
    from audit.scan import scan
    from tests.pipelines.test_dataflow_dry_run import DATAFLOW_FLAGS

    _, manifest, tasks, _, _ = planted
    m, index = load_manifest(manifest), li.build(str(tasks))
    sizes = []
    for leak in (None, (EvalLeakageConfig(str(tasks)), index)):
        with pytest.raises(DryRun) as e:
            scan(m, ContaminationConfig(), beam_args=tuple(DATAFLOW_FLAGS), leak=leak)
        sizes.append(e.value.result.job.proto_pipeline.ByteSize())
    assert index.bytes_per_worker() > 400_000 and sizes[1] - sizes[0] < 20_000, sizes


def test_what_travels_from_a_shard_is_bounded_by_the_tasks_not_the_documents():
    """A contaminated dataset may hold 10^8 contaminated documents: a shard sends counts, the items
    found and its first MAX_LISTED documents per mode; the merge keeps the first MAX_LISTED in
    reading order and adds up the counts."""
    from audit.eval_leakage import MAX_LISTED, Found, Scored, Tally

    def shard(n: int) -> Tally:
        t = Tally()
        for k in range(n):
            doc = Scored(k, 10, 1.0, ((k % 3, 1.0, "decon"),), "", "")
            t.counts.setdefault("decon", [0, 0])
            t.counts["decon"][0] += 1
            t.counts["decon"][1] += 10
            t.instances.setdefault("decon", set()).add(k % 3)
            if len(t.listed.setdefault("decon", [])) < MAX_LISTED:
                t.listed["decon"].append(doc)
        return t

    found = Found()
    found.add("web", "web/train (a)", shard(1000), base=0)
    found.add("web", "web/train (b)", shard(1000), base=1000)
    assert found.source_counts[("decon", "web")] == [2000, 20000] and found.instances["decon"] == {0, 1, 2}
    listed = found.listed["decon"]
    assert len(listed) == MAX_LISTED and [d.ordinal for _, _, d in listed] == list(range(MAX_LISTED))


def test_a_copy_whose_words_are_separated_by_tabs_newlines_or_no_break_spaces_fails_the_audit(tmp_path):
    """Copies of task instances whose whitespace is tabs, newlines or no-break spaces (decon's
    cleaning makes each the verbatim copy) are found by the shard pass: the check fails and lists
    exactly those documents, each with its instance (before issue 55 the audit passed, "0 of N
    contain an instance")."""
    tasks = lp.write_tasks(tmp_path / "tasks")
    index = li.build(str(tasks))
    plants = lp.whitespace_plants(index, per_kind=2)
    enc = dolma2()
    manifest = fx.write_sample(
        str(tmp_path / "data"), shards=1, seq_len=SEQ, extra_train=tuple(enc.encode_ordinary(t) for t, _, _ in plants)
    )
    m = load_manifest(manifest)
    first = int(m.source("web")["counts"]["train"]) - len(plants)
    assert main(["--data", manifest, "--out", str(tmp_path / "out"), "--eval-tasks", str(tasks)]) == 1
    r = json.loads((tmp_path / "out" / "audit.json").read_text())["checks"]["task_contamination"]
    assert r["passed"] is False and _flagged(r["failures"]) == {first + j for j in range(len(plants))}
    found = {(t, d) for t, ds in r["figures"]["instances"].items() for d in ds}
    assert found == {item for _, _, item in plants}
    examples = r["figures"]["examples"]
    assert examples and all(
        0 <= x["training_span"][0] < x["training_span"][1] <= len(x["training_text"]) for x in examples
    )
