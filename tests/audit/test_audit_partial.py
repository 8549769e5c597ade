"""A check whose input included a shard that failed integrity is never a plain pass (audit.partial):
it is UNKNOWN ("not verified: N of M shards failed integrity …; on what was read: …"), a FAIL says
the damage may be why, and the report and the command line give the next command to run."""

from __future__ import annotations

import json
import re
from html import unescape

import pytest

from audit import partial
from audit.__main__ import main
from audit.checks import CheckResult
from tests.audit import audit_fixtures as fx
from tests.pipelines.leak_plants import TINY

SHARD = "web/train-00001-of-00002.arrayrecord"


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """The fixture sample and a run on it, one training shard with a byte flipped; audited with
    the run and eval tasks, so that every check that reads shard data runs."""
    root = tmp_path_factory.mktemp("damaged")
    manifest = fx.write_sample(str(root / "data"))
    fx.write_run_logs(str(root / "run"), manifest, hosts=4, steps=80, global_batch_size=8)
    fx.tamper_one_byte(str(root / "data" / SHARD))
    argv = ["--data", manifest, "--run", str(root / "run"), "--out", str(root / "out"), "--eval-tasks", str(TINY)]
    return root, argv


def test_a_check_that_read_a_shard_which_failed_integrity_is_unknown_never_pass(damaged, capsys):
    root, argv = damaged
    assert main(argv) == 1
    printed = capsys.readouterr().out
    doc = json.loads((root / "out" / "audit.json").read_text())
    checks = doc["checks"]
    assert checks["integrity"]["passed"] is False and SHARD in checks["integrity"]["summary"]
    total = len(checks["integrity"]["figures"]["shards"])
    said = f"1 of {total} shards failed integrity (check 1): {SHARD}"
    for name in partial.READS:  # every check that read the damaged training shard
        r = checks[name]
        assert r["passed"] is not True and r["partial"] == said, (name, r["summary"])
        if r["passed"] is None:
            assert r["summary"].startswith(
                f"not verified: {said} was read as it is, as far as possible; on what was read: "
            )
            assert f"[UNKNOWN] {r['title']}: not verified" in printed
        else:
            assert said in r["summary"] and "the damage may be why" in r["summary"]
    assert checks["contamination"]["passed"] is None  # it found nothing in what it read: UNKNOWN, not pass
    for name in ("accounting", "sharding", "run"):  # the manifests and the logs only: a verdict of their own
        assert "partial" not in checks[name]
    html = unescape((root / "out" / "report.html").read_text())
    assert (
        'class="badge UNKNOWN">UNKNOWN</span>' in html and html.count('class="badge pass">pass') == 2 * 3
    )  # table and section
    text = re.sub(r"<[^>]+>", "", html)  # the page's words, without its tags
    nxt = "Next: restore it from the pipeline's output, or rebuild the dataset"
    assert nxt in text and f"run this audit again: python -m audit --data {argv[1]}" in text
    # the command as code whose words never break inside (a line broke `--` / `data` apart)
    assert '<code class="cmd"><span>python</span> <span>-m</span> <span>audit</span> <span>--data</span>' in html
    # an UNKNOWN row's deciding number is the number measured on what was read, then why not a pass
    rows = re.findall(r'<tr><td><a href="#contamination">.*?</tr>', html)  # UNKNOWN above
    assert rows and f"; not verified: 1 of {total} shards failed integrity</td>" in unescape(rows[0])
    assert not unescape(rows[0]).split("<td>")[-1].startswith("not verified")
    assert nxt in printed and "run this audit again: python -m audit --data" in printed


def _r(name, passed=True, **figures):
    return CheckResult(
        name,
        name,
        passed,
        "ok",
        failures=["x"] if passed is False else [],
        failure_count=int(passed is False),
        figures=figures,
    )


def test_only_the_checks_that_read_the_split_of_the_damaged_shard_are_marked():
    rows = [
        {
            "path": "a/heldout-0.arrayrecord",
            "split": "heldout",
            "sha256_ok": False,
            "records": 3,
            "expected_records": 3,
            "bad_records": 0,
        },
        {
            "path": "a/train-0.arrayrecord",
            "split": "train",
            "sha256_ok": True,
            "records": 5,
            "expected_records": 5,
            "bad_records": 0,
        },
    ]
    results = [
        _r("integrity", False, shards=rows),
        _r("contamination"),
        _r("statistics", False),
        _r("task_contamination"),
        _r("mixture", measured_examples=10),
        _r("sharding"),
    ]
    got = {r.name: r for r in partial.apply(results)}
    assert got["contamination"].status == "UNKNOWN" and got["contamination"].passed is None
    assert got["statistics"].status == "FAIL" and "the damage may be why" in got["statistics"].summary
    for name in ("task_contamination", "mixture", "sharding"):  # training shards only, or none
        assert got[name].passed is True and got[name].partial is None
    assert partial.next_command(results, "python -m audit --data m --out o").endswith(
        "python -m audit --data m --out o"
    )
    assert partial.next_command([_r("integrity", True, shards=rows[1:])], None) is None
    again = partial.apply(list(got.values()))  # marking twice changes nothing
    assert [r.summary for r in again] == [r.summary for r in got.values()]
