"""End-to-end audit: a clean sample passes every check; each kind of damage fails the RIGHT
check (and only the checks it should) with a message naming what is wrong."""

from __future__ import annotations

import json
import shutil

import pytest

from audit import AuditConfig, run_audit
from audit.__main__ import main
from audit.runner import DEFAULT_GLOBAL_BATCH, NO_EVAL_TASKS, _settings, default_hosts
from contract import data_log_name
from contract.rundir import RunDir
from tests.audit import audit_fixtures as fx
from tests.pipelines.leak_plants import TINY as TINY_TASKS

G, H, STEPS = 8, 4, 80  # the fixture plan has 286 slots: 80 steps of 8 span 2.2 epochs


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    root = tmp_path_factory.mktemp("clean")
    manifest = fx.write_sample(str(root / "data"))
    fx.write_run_logs(str(root / "run"), manifest, hosts=H, steps=STEPS, global_batch_size=G)
    return root


@pytest.fixture
def copy(clean, tmp_path):
    shutil.copytree(clean, tmp_path / "c")
    return tmp_path / "c"


def audit(root, **kw):
    cfg = AuditConfig(
        data=str(root / "data" / "manifest.json"), out=str(root / "report"), run=RunDir(root / "run"), **kw
    )
    results, _ = run_audit(cfg)
    return {r.name: r for r in results}


def verdicts(res):
    return {k: r.passed for k, r in res.items()}


ALL_PASS = {
    "integrity": True,
    "accounting": True,
    "mixture": True,
    "sharding": True,
    "run": True,
    "contamination": True,
    "statistics": True,
    "task_contamination": None,  # eval leakage: not run without --eval-tasks (listed in not_run)
}


def test_clean_sample_passes_every_check_and_exits_zero(clean, tmp_path, capsys):
    res = audit(clean)
    assert verdicts(res) == ALL_PASS, {k: r.summary for k, r in res.items() if not r.passed}
    assert res["run"].figures["steps_logged"] == STEPS
    assert res["run"].figures["positions_verified_against_plan"] == STEPS * G
    assert res["sharding"].figures["brute_force"]["shared_slots"] == 0
    assert res["mixture"].figures["measured_from"] == "the run's data logs"
    out = tmp_path / "report"
    rc = main(["--data", str(clean / "data" / "manifest.json"), "--run", str(clean / "run"), "--out", str(out)])
    assert rc == 0
    doc = json.loads((out / "audit.json").read_text())
    assert doc["passed"] is True and set(doc["checks"]) == set(ALL_PASS)
    assert doc["inputs"]["global_batch_size"] == G and doc["inputs"]["hosts"] == H  # read from the run
    assert doc["inputs"]["hosts_from"] == f"the run's {H} hosts"
    facts = doc["inputs"]["run_facts"]
    assert facts["command"].startswith("python -m audit --data ") and facts["duration_s"] >= 0
    printed = capsys.readouterr().out
    assert "report.html" in printed
    # the 13-gram rate is reported, not gated (no --max-ngram-rate): the console says so
    rate = doc["checks"]["contamination"]["figures"]["ngram_contaminated_rate"]
    assert f"[   info] Held-out 13-gram overlap: {rate:.1%} of " in printed and "not gated" in printed


def test_tampered_shard_fails_integrity_naming_the_shard(copy):
    shard = "web/train-00001-of-00002.arrayrecord"
    fx.tamper_one_byte(str(copy / "data" / shard))
    res = audit(copy)
    assert res["integrity"].passed is False
    assert shard in res["integrity"].summary and "sha256" in res["integrity"].summary
    assert res["accounting"].passed and res["sharding"].passed and res["run"].passed
    rc = main(["--data", str(copy / "data" / "manifest.json"), "--out", str(copy / "r")])
    assert rc == 1


def test_counts_that_do_not_add_up_fail_accounting(copy):
    fx.edit_manifest(
        str(copy / "data" / "manifest.json"),
        lambda m: m["sources"]["code"]["counts"].__setitem__("duplicates", 5),
        run_dir=str(copy / "run"),
    )
    res = audit(copy)
    assert verdicts(res) == {**ALL_PASS, "accounting": False}
    msg = res["accounting"].summary
    assert "source code" in msg and "off by -3" in msg, msg


def test_reject_reason_the_pipeline_never_writes_fails_accounting(copy):
    def invent(m):
        m["sources"]["web"]["counts"]["rejected"] = {"empty_text": 1, "too_long": 1}

    fx.edit_manifest(str(copy / "data" / "manifest.json"), invent, run_dir=str(copy / "run"))
    res = audit(copy)
    assert verdicts(res) == {**ALL_PASS, "accounting": False}
    msg = res["accounting"].summary
    assert "source web: unknown reject reasons ['too_long']" in msg, msg


def test_log_copied_between_two_hosts_fails_the_run_check_naming_step_and_hosts(copy):
    logs = copy / "run" / "data_log"
    shutil.copy(logs / "host-00000-of-00004.jsonl", logs / "host-00002-of-00004.jsonl")
    res = audit(copy)
    assert verdicts(res) == {**ALL_PASS, "run": False}
    run = res["run"]
    assert run.figures["first_double_sharding"] == {"step": 0, "hosts": [0, 2], "what": "read the same positions"}
    assert run.summary.startswith("double sharding: from step 0, hosts [0, 2] read the same positions")


def test_heldout_document_injected_into_train_fails_contamination(tmp_path):
    manifest = fx.write_sample(str(tmp_path / "data"), inject_heldout_into_train=True)
    fx.write_run_logs(str(tmp_path / "run"), manifest, hosts=H, steps=STEPS, global_batch_size=G)
    res = audit(tmp_path)
    assert verdicts(res) == {**ALL_PASS, "contamination": False}
    c = res["contamination"]
    assert c.figures["exact_overlap"] == 1
    assert "exact cop" in c.summary and "held-out document 0 of web/heldout" in c.summary
    # the 13-gram scan sees it too, and only it: 1 of the 9 held-out documents long enough to scan
    assert (c.figures["ngram_contaminated_heldout"], c.figures["ngram_heldout_sampled"]) == (1, 9)


def test_example_returning_before_its_epoch_ends_fails(copy):
    path = copy / "run" / "data_log" / "host-00001-of-00004.jsonl"
    lines = fx.read_log(str(path))
    lines[3]["example"][0] = lines[0]["example"][0]  # step 3 re-reads an example of step 0
    fx.write_log(str(path), lines)
    res = audit(copy)
    assert verdicts(res) == {**ALL_PASS, "run": False}
    run = res["run"]
    text = " ".join(run.failures)
    assert "step 3, host 1: position" in text and "the plan (seed 0) says" in text
    assert f"step 3, host 1: example {lines[0]['example'][0]}" in text
    assert "returns before epoch 0 ends: read 2× (first at step 0 by host 1)" in text
    assert run.figures["first_double_sharding"]["step"] == 3 and run.figures["first_double_sharding"]["hosts"] == [1]
    assert run.summary.startswith(
        f"double sharding: from step 3, hosts [1] re-read example "
        f"{lines[0]['example'][0]} before its epoch ended (first read at step 0)"
    )


def test_gap_in_a_host_log_fails(copy):
    path = copy / "run" / "data_log" / "host-00003-of-00004.jsonl"
    lines = fx.read_log(str(path))
    fx.write_log(str(path), lines[:10] + lines[11:])
    res = audit(copy)
    assert res["run"].passed is False
    assert "step 10: 3 of 4 hosts logged it; missing hosts [3] (a gap)" in res["run"].failures


def test_missing_first_and_last_steps_are_gaps(copy):
    for h in range(H):
        path = copy / "run" / "data_log" / f"host-{h:05d}-of-{H:05d}.jsonl"
        fx.write_log(str(path), fx.read_log(str(path))[2:-1])  # steps 0, 1 and the last one lost
    res = audit(copy)
    assert res["run"].passed is False
    assert res["run"].failures[:1] == ["steps 0..1 are missing from every host's log (a gap)"]
    assert any(
        f"summary.json says the run trained {STEPS} steps but the logs end at step {STEPS - 2}" in x
        for x in res["run"].failures
    )


def test_replayed_steps_pass_only_when_identical(copy):
    path = copy / "run" / "data_log" / "host-00000-of-00004.jsonl"
    lines = fx.read_log(str(path))
    fx.write_log(str(path), lines[:20] + lines[15:])  # resumed from step 15: steps 15..19 logged twice
    res = audit(copy)
    assert res["run"].passed and res["run"].figures["replayed_steps"] == 5
    lines2 = lines[:20] + [dict(lines[16], example=lines[17]["example"])] + lines[17:]
    fx.write_log(str(path), lines2)
    res = audit(copy)
    assert res["run"].passed is False
    assert "logged step 16 twice with different examples" in res["run"].summary


def test_eos_count_that_disagrees_with_the_manifest_fails_statistics(copy):
    def bump(m):
        c = m["sources"]["web"]["counts"]
        c["train"] += 1
        c["documents"] += 1

    fx.edit_manifest(str(copy / "data" / "manifest.json"), bump)
    res = audit(copy, global_batch_size=G)
    assert res["statistics"].passed is False and res["accounting"].passed
    assert "source web/train" in res["statistics"].summary and "EOS" in res["statistics"].summary


def test_malformed_records_fail_integrity_naming_the_record(tmp_path):
    manifest = fx.write_sample(str(tmp_path / "data"))
    rel = "code/train-00000-of-00002.arrayrecord"
    recs = fx.pack([[1, 2, 3]] * 40, 32)
    recs[2, 5] = 100278  # = vocabulary size
    info = fx.write_shard(str(tmp_path / "data" / rel), recs)

    def fix(m):
        sh = m["sources"]["code"]["splits"]["train"]["shards"][0]
        m["sources"]["code"]["splits"]["train"]["examples"] += info["records"] - sh["records"]
        sh.update(info)

    fx.edit_manifest(manifest, fix)
    res = audit(tmp_path, global_batch_size=G)
    assert res["integrity"].passed is False
    assert any(
        f"shard {rel}" in x and "record 2 has token id 100278 >= vocabulary size" in x
        for x in res["integrity"].failures
    ), res["integrity"].failures


def test_unreadable_manifest_exits_2(tmp_path, capsys):
    (tmp_path / "manifest.json").write_text(json.dumps({"seq_len": 8}))
    assert main(["--data", str(tmp_path / "manifest.json"), "--out", str(tmp_path / "r")]) == 2
    assert "missing required field 'tokenizer'" in capsys.readouterr().err


def test_elastic_restart_logs_pass_and_overlapping_topologies_fail(clean, tmp_path):
    fx.write_run_logs(
        str(tmp_path / "run"),
        str(clean / "data" / "manifest.json"),
        hosts=2,
        steps=STEPS,
        global_batch_size=G,
        restart_hosts=4,
        restart_step=30,
    )
    shutil.copytree(clean / "data", tmp_path / "data")
    res = audit(tmp_path)
    assert res["run"].passed, res["run"].failures
    assert res["run"].figures["topologies"] == [[2, 0, 29], [4, 30, STEPS - 1]]
    assert res["run"].figures["data_sha256_matches_summary"] is True
    # The old topology's log was not cut back at the restart: step 30 logged by both.
    old = tmp_path / "run" / "data_log" / "host-00000-of-00002.jsonl"
    lines = fx.read_log(str(old))
    fx.write_log(str(old), lines + [dict(lines[-1], step=30)])
    res = audit(tmp_path)
    assert res["run"].passed is False
    assert "step 30 is logged by [2, 4] hosts topologies at once" in res["run"].failures[0]


def test_stream_hash_in_summary_must_match_the_logs(copy):
    summary = copy / "run" / "summary.json"
    s = json.loads(summary.read_text())
    assert audit(copy)["run"].figures["data_sha256_matches_summary"] is True
    s["data_sha256"] = "0" * 64
    summary.write_text(json.dumps(s))
    res = audit(copy)
    assert res["run"].passed is False
    assert "summary.json's data_sha256 0000000000000000… is not the hash of the logged stream" in res["run"].summary


def test_run_with_other_mixture_weights_fails_on_the_fingerprint(copy):
    rec = json.loads((copy / "run" / "run.json").read_text())
    rec["loader_fingerprint"] = "f" * 64  # as run.json carries the loader's plan fingerprint
    (copy / "run" / "run.json").write_text(json.dumps(rec))
    res = audit(copy)
    assert res["run"].passed is False and "the run read other data or other mixture weights" in res["run"].summary


def test_mixture_the_loader_cannot_plan_fails_with_its_reason(copy):
    def cap(m):  # code (30% of the weight, far fewer tokens) may no longer be repeated
        m["mixture"]["sources"][1]["max_repetition"] = 1.0

    fx.edit_manifest(str(copy / "data" / "manifest.json"), cap)
    res = audit(copy)
    assert res["mixture"].passed is False
    assert "cannot meet weight 0.3 of source 'code'" in res["mixture"].summary
    assert res["sharding"].passed is None and res["integrity"].passed


def test_measured_share_far_from_the_plan_fails_mixture(clean):
    from audit.mixture_check import MixtureConfig, check_mixture
    from dataloader.plan import plan_from_manifests

    plan = plan_from_manifests([json.loads((clean / "data" / "manifest.json").read_text())])
    per_record = [s.tokens / s.records for s in plan.sources]
    fair = check_mixture(
        plan, MixtureConfig(), {0: 700, 1: 300}, {0: int(700 * per_record[0]), 1: int(300 * per_record[1])}, "logs"
    )
    assert fair.passed, fair.failures
    skewed = check_mixture(
        plan, MixtureConfig(), {0: 950, 1: 50}, {0: int(950 * per_record[0]), 1: int(50 * per_record[1])}, "logs"
    )
    assert skewed.passed is False
    assert skewed.summary.startswith("source web: measured share 0.95")


def test_run_without_config_or_checkpoint_takes_the_global_batch_from_its_logs(clean, tmp_path):
    # a run dir without run.json (written before it existed) that stopped before its end: no
    # summary.json, and a global batch (4) that is not the audit's default (8)
    (tmp_path / "data").symlink_to(clean / "data")
    fx.write_run_logs(
        str(tmp_path / "run"), str(clean / "data" / "manifest.json"), hosts=2, steps=12, global_batch_size=4
    )
    (tmp_path / "run" / "run.json").unlink()
    (tmp_path / "run" / "summary.json").unlink()
    res, meta = run_audit(
        AuditConfig(
            data=str(tmp_path / "data" / "manifest.json"), out=str(tmp_path / "r"), run=RunDir(tmp_path / "run")
        )
    )
    res = {r.name: r for r in res}
    assert res["run"].passed is True, res["run"].summary
    assert meta["global_batch_size"] == 4 and meta["global_batch_size_from"] == "the run's data logs"
    assert res["run"].figures["positions_verified_against_plan"] == 12 * 4
    # what could not be checked without run.json and summary.json is listed, with the reason
    assert set(res["run"].not_run) == {"loader_fingerprint", "hosts_per_step_range", "data_sha256"}
    assert "run.json is missing" in res["run"].not_run["loader_fingerprint"]


def test_audit_refuses_a_manifest_whose_fingerprint_does_not_match(copy, capsys):
    # one source's shards listed in another order, the fingerprint field left as written
    fx.edit_manifest(
        str(copy / "data" / "manifest.json"),
        lambda m: m["sources"]["web"]["splits"]["train"]["shards"].reverse(),
        refingerprint=False,
    )
    assert main(["--data", str(copy / "data" / "manifest.json"), "--out", str(copy / "r")]) == 2
    err = capsys.readouterr().err
    assert "manifest.json: fingerprint" in err and "does not match the manifest's content" in err


def test_every_audit_check_runs_or_says_why_not(copy, tmp_path):
    out = tmp_path / "full"
    full = ["--data", str(copy / "data" / "manifest.json"), "--run", str(copy / "run"), "--out", str(out)]
    assert main([*full, "--eval-tasks", str(TINY_TASKS)]) == 0
    doc = json.loads((out / "audit.json").read_text())
    assert doc["not_run"] == [] and all(c["passed"] is True for c in doc["checks"].values())
    assert doc["checks"]["run"]["figures"]["data_sha256_matches_summary"] is True
    # no --run: the run check is listed as not run, with its reason
    assert main(["--data", str(copy / "data" / "manifest.json"), "--out", str(tmp_path / "norun")]) == 0
    doc = json.loads((tmp_path / "norun" / "audit.json").read_text())
    assert {"check": "run", "part": "run", "why": "no --run given"} in doc["not_run"]
    assert {"check": "task_contamination", "part": "task_contamination", "why": NO_EVAL_TASKS} in doc["not_run"]
    assert doc["checks"]["run"]["passed"] is None
    # a run that has not finished (no summary.json): the stream hash is listed as not run
    (copy / "run" / "summary.json").unlink()
    assert (
        main(
            [
                "--data",
                str(copy / "data" / "manifest.json"),
                "--run",
                str(copy / "run"),
                "--out",
                str(tmp_path / "unfinished"),
                "--eval-tasks",
                str(TINY_TASKS),
            ]
        )
        == 0
    )
    doc = json.loads((tmp_path / "unfinished" / "audit.json").read_text())
    (entry,) = doc["not_run"]
    assert entry["check"] == "run" and entry["part"] == "data_sha256" and "summary.json" in entry["why"]
    assert doc["checks"]["run"]["figures"]["data_sha256_matches_summary"] is None


def test_torn_last_line_in_a_data_log_exits_2_naming_file_and_line(copy, capsys):
    path = copy / "run" / "data_log" / "host-00002-of-00004.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # a kill mid-write: the last line is cut short
    assert (
        main(["--data", str(copy / "data" / "manifest.json"), "--run", str(copy / "run"), "--out", str(copy / "r")])
        == 2
    )
    err = capsys.readouterr().err
    assert f"{path}:{STEPS}: not valid JSON" in err and "torn last line" in err


@pytest.mark.parametrize(
    "line, says",
    [
        (b"\xff\xfe", "not UTF-8 text"),
        (b"[]", "a data-log line is a JSON object, not list"),
        (b"{}", "missing ['step', 'index', 'example']"),
        (b'{"step": "x", "index": [0], "example": [0]}', "step must be an int"),
        (b'{"step": -1, "index": [0], "example": [0]}', "step must be an int"),
        (b'{"step": true, "index": [0], "example": [0]}', "step must be an int"),
        (b'{"step": 80, "index": [[0], 1], "example": [0, 1]}', "index must be a list of ints"),
        (b'{"step": 80, "index": [0, 1.5], "example": [0, 1]}', "index must be a list of ints"),
        (b'{"step": 80, "index": [99999999999999999999], "example": [0]}', "index must be a list of ints"),
        (b'{"step": 80, "index": [0, 1], "example": [0]}', "index and example differ in length"),
        (b'{"step": 80, "index": [0], "example": [' + b"9" * 5000 + b"]}", "not usable JSON"),
    ],
)
def test_a_malformed_data_log_line_exits_2_naming_file_and_line(copy, capsys, line, says):
    path = copy / "run" / "data_log" / "host-00001-of-00004.jsonl"
    with open(path, "ab") as f:
        f.write(line + b"\n")
    assert (
        main(["--data", str(copy / "data" / "manifest.json"), "--run", str(copy / "run"), "--out", str(copy / "r")])
        == 2
    )
    err = capsys.readouterr().err
    assert f"{path}:{STEPS + 1}: " in err and says in err


def test_a_data_log_that_is_a_folder_exits_2_naming_it(copy, capsys):
    path = copy / "run" / "data_log" / "host-00001-of-00004.jsonl"
    path.unlink()
    path.mkdir()
    assert (
        main(["--data", str(copy / "data" / "manifest.json"), "--run", str(copy / "run"), "--out", str(copy / "r")])
        == 2
    )
    assert str(path) in capsys.readouterr().err


@pytest.mark.parametrize(
    "flag, value",
    [
        ("--steps", "-1"),
        ("--steps", "0"),
        ("--hosts", "0"),
        ("--global-batch-size", "0"),
        ("--seed", "-1"),
        ("--brute-force-limit", "-1"),
        ("--weights", "[1]"),
        ("--weights", '{"a": NaN}'),
        ("--weights", '{"a": -1}'),
    ],
)
def test_an_impossible_flag_value_exits_2_before_the_audit(copy, capsys, flag, value):
    with pytest.raises(SystemExit) as e:
        main(
            [
                "--data",
                str(copy / "data" / "manifest.json"),
                "--run",
                str(copy / "run"),
                "--out",
                str(copy / "r"),
                flag,
                value,
            ]
        )
    assert e.value.code == 2 and flag in capsys.readouterr().err and not (copy / "r").exists()


@pytest.mark.parametrize("flag", ["--max-ngram-rate", "--mixture-tolerance"])
@pytest.mark.parametrize("value", ["nan", "NaN", "inf", "-inf", "-1", "1.5", "-0.01"])
def test_a_gate_threshold_is_a_finite_share_or_the_audit_exits_2_before_it_starts(copy, capsys, flag, value):
    # NaN passes every comparison (the gate silently off); out of [0, 1] a share means nothing
    with pytest.raises(SystemExit) as e:
        main(["--data", str(copy / "data" / "manifest.json"), "--out", str(copy / "r"), flag, value])
    assert e.value.code == 2 and flag in capsys.readouterr().err and not (copy / "r").exists()


def test_gate_thresholds_are_checked_by_the_configs_themselves_too():
    from audit.contamination import ContaminationConfig
    from audit.mixture_check import MixtureConfig

    for bad in (float("nan"), float("inf"), -1.0, 2.0):
        with pytest.raises(ValueError, match="max_ngram_rate"):
            ContaminationConfig(max_ngram_rate=bad)
        with pytest.raises(ValueError, match="tolerance"):
            MixtureConfig(tolerance=bad)
    assert ContaminationConfig(max_ngram_rate=0.0).max_ngram_rate == 0.0  # the edges are shares
    assert MixtureConfig(tolerance=1.0).tolerance == 1.0


def test_malformed_run_record_exits_2_naming_the_file(copy, capsys):
    (copy / "run" / "run.json").write_text('{"schema_version": 1,\n "seed": ')
    assert (
        main(["--data", str(copy / "data" / "manifest.json"), "--run", str(copy / "run"), "--out", str(copy / "r")])
        == 2
    )
    assert f"{copy / 'run' / 'run.json'}:2: not valid JSON" in capsys.readouterr().err


@pytest.mark.parametrize(
    "text, says",
    [
        ('{"step": 10, "data_sha256": 5}', "data_sha256 must be a string, got 5"),
        ("[1, 2]", "a run summary is a JSON object, not list"),
        ('{"step": "10", "data_sha256": ""}', "step must be a non-negative integer, got '10'"),
        ('{"step": 10,\n "data_sha', ":2: not valid JSON"),
    ],
)
def test_a_damaged_run_summary_exits_2_naming_the_file(copy, capsys, text, says):
    (copy / "run" / "summary.json").write_text(text)
    assert (
        main(["--data", str(copy / "data" / "manifest.json"), "--run", str(copy / "run"), "--out", str(copy / "r")])
        == 2
    )
    err = capsys.readouterr().err
    assert str(copy / "run" / "summary.json") in err and says in err
    assert not (copy / "r").exists()


def test_logs_with_other_host_counts_than_the_run_record_fail(copy):
    rec = json.loads((copy / "run" / "run.json").read_text())
    rec["hosts"] = [{"first_step": 0, "host_count": 4}, {"first_step": 50, "host_count": 2}]
    (copy / "run" / "run.json").write_text(json.dumps(rec))
    res = audit(copy)
    assert verdicts(res) == {**ALL_PASS, "run": False}
    assert res["run"].summary.startswith("step 50 was logged by 4 hosts but run.json says 2")


def test_a_data_order_the_audit_does_not_know_fails_the_run_check(copy):
    rec = json.loads((copy / "run" / "run.json").read_text())
    rec["order"] = {"name": "grain.index_shuffle", "version": 99}
    (copy / "run" / "run.json").write_text(json.dumps(rec))
    res = audit(copy)
    assert res["run"].passed is False
    assert "data order grain.index_shuffle v99 is unknown to this audit" in res["run"].summary
    assert res["run"].figures["positions_verified_against_plan"] == 0


def test_parts_that_need_the_manifests_tokenizer_say_why_they_did_not_run(copy):
    fx.edit_manifest(
        str(copy / "data" / "manifest.json"),
        lambda m: m["tokenizer"].__setitem__("ranks_sha256", "0" * 64),
        run_dir=str(copy / "run"),
    )
    res = audit(copy)
    assert verdicts(res) == ALL_PASS  # the checks that need no text still run and pass
    for name, part in (("contamination", "ngram_overlap"), ("statistics", "tokens_per_byte")):
        assert "is not the manifest's (vocab 100278, ranks 000000000000…)" in res[name].not_run[part]
        assert f"(not run: {part})" in res[name].summary


def test_a_relative_manifest_path_in_run_json_read_from_another_directory_says_to_pass_data(
    copy, tmp_path, capsys, monkeypatch
):
    # run.json keeps the paths as the trainer was given them: "data/manifest.json" is relative to
    # the directory the trainer ran in (copy/), which run.json does not record
    rec = json.loads((copy / "run" / "run.json").read_text())
    rec["data"] = ["data/manifest.json"]
    (copy / "run" / "run.json").write_text(json.dumps(rec))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert main(["--run", str(copy / "run"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "'data/manifest.json'" in err and "relative to the directory the trainer ran in" in err and "--data" in err
    # another out/ there with a different manifest of the same name: refused too, not audited instead
    shutil.copytree(copy / "data", elsewhere / "data")
    fx.edit_manifest(str(elsewhere / "data" / "manifest.json"), lambda m: m["mixture"].update(name="other"))
    assert main(["--run", str(copy / "run"), "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "the run trained on" in err and "relative to the directory the trainer ran in" in err
    monkeypatch.chdir(copy)  # from the trainer's directory the recorded path is the run's manifest
    assert load_manifests_from_run(copy)[0].fingerprint == rec["manifest_fingerprints"][0]


def load_manifests_from_run(root):
    from audit.runner import data_paths, load_manifests, read_run

    rec = read_run(RunDir(root / "run")).record
    return load_manifests(data_paths(None, rec, RunDir(root / "run")), rec, from_record=True)


def test_a_reversed_host_log_is_reported_out_of_order_not_as_a_missing_host(copy):
    """Host 0's lines in reverse order: before, every line after the first was dropped silently and
    the run check said 'missing hosts [0] (a gap)' at each of those steps."""
    from audit.datachecks import DataChecks

    log = copy / "run" / "data_log" / data_log_name(0, H)
    lines = log.read_text().splitlines(keepends=True)
    log.write_text("".join(reversed(lines)))
    run = audit(copy, data_checks=DataChecks("none"))["run"]
    assert run.passed is False
    assert f"host 0's log goes back to step {len(lines) - 2} after step {len(lines) - 1} ({log}:2)" in run.failures[0]
    assert not any("missing hosts" in f for f in run.failures)


def test_the_audits_settings_come_from_the_flag_else_the_run_else_the_default(clean):
    """runner._settings, the audit's first step: G, the seed and H each from its flag, else the run
    (here its data logs: no run.json), else the default, and audit.json says which."""
    data, run = str(clean / "data" / "manifest.json"), RunDir(clean / "run")
    s, said = _settings(AuditConfig(data=data, out="unused", run=run), None)
    assert (s.global_batch_size, s.seed, s.hosts, s.weights) == (G, 0, H, None)
    assert said == {
        "hosts_from": f"the run's {H} hosts",
        "global_batch_size_from": "the run's data logs",
        "seed_from": "the default",
    }
    flags = AuditConfig(data=data, out="unused", run=run, global_batch_size=16, seed=3, hosts=2)
    s, said = _settings(flags, None)
    assert (s.global_batch_size, s.seed, s.hosts) == (16, 3, 2)
    assert said == {"hosts_from": "--hosts", "global_batch_size_from": "--global-batch-size", "seed_from": "--seed"}
    s, said = _settings(AuditConfig(data=data, out="unused"), None)  # no run: the defaults
    assert (s.global_batch_size, s.hosts) == (DEFAULT_GLOBAL_BATCH, default_hosts(DEFAULT_GLOBAL_BATCH))
    assert said["global_batch_size_from"] == "the default" and "a 1-host proof is vacuous" in said["hosts_from"]
