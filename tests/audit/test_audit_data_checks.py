"""--data-checks: a run audited against a dataset that was already audited takes the shard checks
(integrity, contamination, statistics) from that audit instead of reading every shard again,
says so in audit.json and the report, and refuses an audit of other manifests."""

from __future__ import annotations

import json
import shutil

import pytest

from audit import datachecks
from audit.__main__ import main
from tests.audit import audit_fixtures as fx

G, H, STEPS = 8, 2, 12
SHARD_CHECKS = ("integrity", "contamination", "statistics")


@pytest.fixture(scope="module")
def audited(tmp_path_factory):
    """A sample, a run on it, and a data audit of the sample (no --run)."""
    root = tmp_path_factory.mktemp("audited")
    manifest = fx.write_sample(str(root / "data"))
    fx.write_run_logs(str(root / "run"), manifest, hosts=H, steps=STEPS, global_batch_size=G)
    assert main(["--data", manifest, "--out", str(root / "data-audit")]) == 0
    assert main(["--data", manifest, "--run", str(root / "run"), "--out", str(root / "full")]) == 0
    return root


@pytest.fixture
def copy(audited, tmp_path):
    shutil.copytree(audited, tmp_path / "c")
    return tmp_path / "c"


def load(path):
    return json.loads(path.read_text())


def test_reused_shard_checks_are_not_read_again_and_the_run_check_still_runs(copy):
    # a shard damaged after the data audit: reusing it does not read the shards, so integrity keeps
    # the earlier verdict, while the run check reads the run's logs now
    fx.tamper_one_byte(str(copy / "data" / "web" / "train-00001-of-00002.arrayrecord"))
    before = load(copy / "data-audit" / "audit.json")
    rc = main(
        [
            "--data",
            str(copy / "data" / "manifest.json"),
            "--run",
            str(copy / "run"),
            "--data-checks",
            f"reuse:{copy / 'data-audit'}",
            "--out",
            str(copy / "r"),
        ]
    )
    assert rc == 0
    doc = load(copy / "r" / "audit.json")
    for name in SHARD_CHECKS:
        assert doc["checks"][name]["taken_from"] == {
            "path": str(copy / "data-audit" / "audit.json"),
            "date": before["inputs"]["data_checks"]["ran_at"],
            "sha256": before["inputs"]["data_checks"]["sha256"],
        }
        assert {k: v for k, v in doc["checks"][name].items() if k != "taken_from"} == before["checks"][name]
    assert doc["checks"]["run"]["passed"] is True and "taken_from" not in doc["checks"]["run"]
    assert doc["checks"]["run"]["figures"]["steps_logged"] == STEPS
    full = load(copy / "full" / "audit.json")  # mixture, sharding and run as if the shards were read now
    for name in ("accounting", "mixture", "sharding", "run"):
        assert doc["checks"][name] == full["checks"][name], name
    record = doc["inputs"]["data_checks"]
    assert record["mode"] == "reuse" and record["taken_from_previous_audit"] == sorted(SHARD_CHECKS)
    assert record["ran_now"] == ["accounting"]
    # ... whereas reading the shards now finds the damage
    assert main(["--data", str(copy / "data" / "manifest.json"), "--out", str(copy / "now")]) == 1
    assert load(copy / "now" / "audit.json")["inputs"]["data_checks"]["ran_now"] == ["accounting", *SHARD_CHECKS]


def test_report_marks_the_reused_checks_with_the_date_of_their_audit(copy):
    assert (
        main(
            [
                "--data",
                str(copy / "data" / "manifest.json"),
                "--run",
                str(copy / "run"),
                "--data-checks",
                f"reuse:{copy / 'data-audit' / 'audit.json'}",
                "--out",
                str(copy / "r"),
            ]
        )
        == 0
    )
    date = load(copy / "data-audit" / "audit.json")["inputs"]["data_checks"]["ran_at"]
    html = (copy / "r" / "report.html").read_text()
    assert html.count(f"[taken from the audit of {date}]") == len(SHARD_CHECKS)  # one per reused check
    assert html.count("Not checked now: taken from the previous data audit") == len(SHARD_CHECKS)
    run_section = html[html.index('<section id="run">') :]
    assert "taken from" not in run_section[: run_section.index("</section>")]


def test_an_audit_of_other_manifests_is_refused_with_one_line(copy, capsys):
    manifest = str(copy / "data" / "manifest.json")
    fx.edit_manifest(manifest, lambda m: m["sources"]["web"]["counts"].update(duplicates=3))  # a new fingerprint
    capsys.readouterr()
    rc = main(["--data", manifest, "--data-checks", f"reuse:{copy / 'data-audit'}", "--out", str(copy / "r")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --data-checks reuse:") and "fingerprints" in err and "\n" not in err
    assert not (copy / "r" / "audit.json").exists()


@pytest.mark.parametrize("which", ["no shards read", "not an audit"])
def test_something_other_than_a_data_audit_is_refused(copy, capsys, which):
    manifest = str(copy / "data" / "manifest.json")
    if which == "no shards read":
        assert main(["--data", manifest, "--data-checks", "none", "--out", str(copy / "prev")]) == 0
        prev = copy / "prev" / "audit.json"
    else:
        prev = copy / "run" / "run.json"
    capsys.readouterr()
    assert main(["--data", manifest, "--data-checks", f"reuse:{prev}", "--out", str(copy / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert "not" in err and "data audit" in err and "\n" not in err


def test_none_lists_the_shard_checks_as_not_run(copy):
    assert (
        main(
            [
                "--data",
                str(copy / "data" / "manifest.json"),
                "--run",
                str(copy / "run"),
                "--data-checks",
                "none",
                "--out",
                str(copy / "r"),
            ]
        )
        == 0
    )
    doc = load(copy / "r" / "audit.json")
    # the shard checks (eval leakage too: it reads them), and the mixture's measured shares (they
    # need the PAD in each record)
    assert {(n["check"], n["part"]) for n in doc["not_run"] if n["check"] != "mixture"} == {
        (c, c) for c in (*SHARD_CHECKS, "task_contamination")
    }
    assert [n["part"] for n in doc["not_run"] if n["check"] == "mixture"] == ["measured_shares"]
    assert all(doc["checks"][n]["passed"] is None for n in (*SHARD_CHECKS, "task_contamination"))
    assert doc["checks"]["run"]["passed"] is True


def test_other_contamination_settings_are_refused_naming_only_what_differs_and_what_to_run(copy, capsys):
    """Before: both settings dicts in full, and no word of what to do."""
    capsys.readouterr()
    assert (
        main(
            [
                "--data",
                str(copy / "data" / "manifest.json"),
                "--max-ngram-rate",
                "0.5",
                "--data-checks",
                f"reuse:{copy / 'data-audit'}",
                "--out",
                str(copy / "r"),
            ]
        )
        == 2
    )
    assert capsys.readouterr().err == (
        f"error: --data-checks reuse:{copy / 'data-audit' / 'audit.json'}: it used other contamination settings: "
        "max_ngram_rate None (now 0.5): read the shards again (--data-checks all)\n"
    )


def test_a_bad_data_checks_value_is_refused_by_the_parser(copy):
    with pytest.raises(SystemExit) as e:
        main(["--data", str(copy / "data" / "manifest.json"), "--data-checks", "some", "--out", str(copy / "r")])
    assert e.value.code == 2


@pytest.mark.parametrize(
    "damage",
    [
        lambda d: d["checks"].update(integrity="PASS"),  # a check that is not an object
        lambda d: d["checks"].update(integrity={}),  # a check without its fields
        lambda d: d.update(train_padding=[{"web": {"first": 1}}]),  # a record number that is not one
        lambda d: d.update(train_padding=[5]),
        lambda d: d["inputs"].update(fingerprint=None, fingerprints=5),
        lambda d: d["checks"]["integrity"].update(passed="yes"),  # a verdict that is not true, false or null
        lambda d: d["checks"]["statistics"].update(failures="none"),
        lambda d: d["checks"]["contamination"].update(failure_count=1.5),
        lambda d: d["checks"]["integrity"].update(not_run={"part": 3}),
        lambda d: d.update(train_padding=[{"web": {"0": -4}}]),  # a negative PAD count
        lambda d: d.update(train_padding=[{"web": {"0": 2.5}}]),
    ],
    ids=[
        "check-not-object",
        "check-without-fields",
        "padding-record-not-int",
        "padding-not-object",
        "fingerprints-not-list",
        "verdict-not-bool",
        "failures-not-list",
        "count-not-int",
        "not-run-reason-not-text",
        "padding-negative",
        "padding-fractional",
    ],
)
def test_a_malformed_previous_audit_is_refused_with_one_line(copy, capsys, damage):
    prev = copy / "data-audit" / "audit.json"
    doc = load(prev)
    damage(doc)
    # re-sealed, as a forger would: what refuses it is the field's check, not the digest
    doc["inputs"]["data_checks"]["sha256"] = datachecks.results_digest(doc)
    prev.write_text(json.dumps(doc))
    capsys.readouterr()
    rc = main(
        ["--data", str(copy / "data" / "manifest.json"), "--data-checks", f"reuse:{prev}", "--out", str(copy / "r")]
    )
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --data-checks reuse:") and "\n" not in err
    assert not (copy / "r" / "audit.json").exists()


def test_none_never_gives_measured_shares_that_count_padding(copy):
    # without the shards, the PAD in each training record is not known: the mixture's measured
    # shares (non-PAD tokens at the audited positions, every position of this small plan) are
    # either the ones a full audit gives or listed as not run, never shares that count PAD
    assert (
        main(["--data", str(copy / "data" / "manifest.json"), "--data-checks", "none", "--out", str(copy / "r")]) == 0
    )
    mix = load(copy / "r" / "audit.json")["checks"]["mixture"]
    full = load(copy / "data-audit" / "audit.json")["checks"]["mixture"]
    assert full["figures"]["measured_from"] == "the audited positions" and not full["not_run"]
    if mix != full:
        assert "measured_shares" in mix["not_run"] and "--data-checks none" in mix["not_run"]["measured_shares"]
        assert all(row["measured"] is None for row in mix["figures"]["sources"])


def reuse(copy, prev, *extra):
    return main(
        ["--data", str(copy / "data" / "manifest.json"), "--data-checks", f"reuse:{prev}", "--out", str(copy / "r")]
        + list(extra)
    )


@pytest.mark.parametrize("resealed", [False, True], ids=["edited", "edited-and-resealed"])
def test_a_forged_previous_audit_cannot_turn_a_fail_into_a_pass(copy, capsys, resealed):
    """A data audit of a manifest with a damaged shard FAILs; its audit.json edited to passed: true
    (failures untouched) is refused, with or without --run: by the digest it recorded, or (digest
    recomputed too) because the verdict disagrees with its own findings. Before: exit 0."""
    fx.tamper_one_byte(str(copy / "data" / "web" / "train-00001-of-00002.arrayrecord"))
    manifest = str(copy / "data" / "manifest.json")
    assert main(["--data", manifest, "--out", str(copy / "bad")]) == 1
    prev = copy / "bad" / "audit.json"
    doc = load(prev)
    assert doc["checks"]["integrity"]["failure_count"] >= 1
    doc["passed"] = True
    for name in SHARD_CHECKS:  # every failing check made a pass (the flipped byte fails statistics too)
        if doc["checks"][name]["passed"] is False:
            doc["checks"][name]["passed"] = True
    if resealed:
        doc["inputs"]["data_checks"]["sha256"] = datachecks.results_digest(doc)
    prev.write_text(json.dumps(doc))
    for extra in ([], ["--run", str(copy / "run")]):
        capsys.readouterr()
        assert reuse(copy, prev, *extra) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --data-checks reuse:") and "\n" not in err
        assert ("disagrees with its own findings" if resealed else "does not match the digest it recorded") in err
        assert not (copy / "r" / "audit.json").exists()


def test_a_data_audit_records_and_prints_its_digest_and_a_reuse_is_bound_to_it(copy, capsys):
    prev = copy / "data-audit" / "audit.json"
    doc = load(prev)
    sha = doc["inputs"]["data_checks"]["sha256"]
    assert sha == datachecks.results_digest(doc) and len(sha) == 64
    assert f"Data checks sha256: <code>{sha}</code>" in (copy / "data-audit" / "report.html").read_text()
    capsys.readouterr()
    assert reuse(copy, f"{prev}@{sha[:16].upper()}") == 0  # pinned to the digest the data audit printed
    out = capsys.readouterr().out
    assert f"data checks taken from {prev} (sha256 {sha})" in out
    r = load(copy / "r" / "audit.json")
    assert r["inputs"]["data_checks"]["reused_from"]["sha256"] == sha
    assert f"sha256 <code>{sha}</code>" in (copy / "r" / "report.html").read_text()
    assert reuse(copy, f"{copy / 'data-audit'}@{'0' * 16}") == 2  # another pin
    assert "not the pinned 0000000000000000" in capsys.readouterr().err
    del doc["inputs"]["data_checks"]["sha256"]  # an audit.json that records none (older, or hand-made)
    prev.write_text(json.dumps(doc))
    assert reuse(copy, prev) == 2 and "records no digest" in capsys.readouterr().err


def test_a_reused_check_keeps_the_expected_name_and_title(copy):
    """A name or title in the file is never the reused check's: a renamed check would vanish from
    the new audit.json, and its name was written unescaped into report.html."""
    prev = copy / "data-audit" / "audit.json"
    doc = load(prev)
    doc["checks"]["integrity"]["name"] = '"><script>alert(1)</script>'
    doc["checks"]["statistics"]["name"] = "renamed"
    doc["checks"]["contamination"]["title"] = "<script>x</script>"
    doc["inputs"]["data_checks"]["sha256"] = datachecks.results_digest(doc)
    prev.write_text(json.dumps(doc))
    assert reuse(copy, prev) == 0
    checks = load(copy / "r" / "audit.json")["checks"]
    assert {"integrity", "contamination", "statistics"} <= set(checks) and "renamed" not in checks
    assert (
        checks["integrity"]["name"] == "integrity" and checks["contamination"]["title"] == "6. Held-out contamination"
    )
    assert "<script" not in (copy / "r" / "report.html").read_text()
