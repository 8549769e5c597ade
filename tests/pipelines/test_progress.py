"""The progress line of long Beam passes (pipelines.progress): the workers' counts reach the
launching process, which prints one line every OLMAX_PROGRESS_S seconds on stderr (terminal or
not) with the count, the rate and, where the total is known, the ETA; DirectRunner worker processes
included. Through both entry points: python -m pipelines.tokenize and python -m audit."""

from __future__ import annotations

import io
import os
import re
import time

import pytest

from pipelines import progress

LINE = re.compile(r"^(?P<what>[^:]+(?:: [^:]+)?): (?P<n>[\d,]+) (?P<unit>\w+) in \d+ (s|min)")


def test_the_launcher_adds_up_every_meter_and_prints_a_line_per_interval():
    out = io.StringIO()
    reporter = progress.Reporter(
        lambda c, el: progress.rate_line("job", "records", c["records"], el, total=1000), interval=0.05, stream=out
    )
    assert reporter.folder is not None and not os.path.exists(reporter.folder)  # made on entering
    with reporter:
        a, b = progress.Meter(reporter.folder), progress.Meter(reporter.folder)  # two workers
        a.add(records=300)
        b.add(records=200)
        time.sleep(0.3)
    lines = out.getvalue().splitlines()
    assert len(lines) >= 2 and lines[-1].startswith("job: 500 records in 0 s (")
    assert ", 50% of 1,000, ETA 0 s" in lines[-1]
    assert not os.path.exists(reporter.folder)  # removed on leaving


def test_a_meter_writes_at_most_every_flush_interval_and_on_flush(tmp_path):
    m = progress.Meter(str(tmp_path))
    m.add(records=1)  # the first add writes
    m.add(records=2)  # within FLUSH_S: counted, not written
    assert progress.totals(str(tmp_path))["records"] == 1
    m.flush()  # a bundle's end
    assert progress.totals(str(tmp_path))["records"] == 3
    progress.Meter(None).add(records=5)  # no folder (a remote runner): nothing written anywhere


def test_no_lines_and_no_folder_when_off_or_remote(monkeypatch):
    monkeypatch.setenv(progress.INTERVAL_ENV, "0")
    assert progress.Reporter(lambda c, el: "x").folder is None
    monkeypatch.setenv(progress.INTERVAL_ENV, "15")
    assert progress.Reporter(lambda c, el: "x", local=False).folder is None
    assert progress.Reporter(lambda c, el: "x").interval == 15


@pytest.mark.parametrize("value", ["inf", "1e10", "nan", "-3"])
def test_an_interval_no_wait_can_take_is_off_not_a_thread_traceback(monkeypatch, value):
    """OLMAX_PROGRESS_S=inf (or 1e10, past threading.TIMEOUT_MAX) started the thread, whose first
    wait raised OverflowError: a 14-line "Exception in thread olmax-progress" traceback on stderr."""
    failed = []
    monkeypatch.setattr(progress.threading, "excepthook", failed.append)
    monkeypatch.setenv(progress.INTERVAL_ENV, value)
    reporter = progress.Reporter(lambda c, el: "x")
    with reporter:
        time.sleep(0.1)
    assert reporter.folder is None and failed == []  # off (nan and -3: off before too, kept as the reference)


def test_the_rate_line_says_the_eta_only_where_the_total_is_known():
    assert progress.rate_line("audit", "records", 250, 10.0, 1000) == (
        "audit: 250 records in 10 s (25 records/s), 25% of 1,000, ETA 30 s"
    )
    assert (
        progress.rate_line("tokenize", "documents", 90_000, 125.0)
        == "tokenize: 90,000 documents in 2 min 05 s (720 documents/s)"
    )
    assert progress.duration(7384) == "2 h 03 min"


@pytest.mark.slow
def test_the_tokenize_job_prints_progress_counted_in_its_worker_processes(tmp_path, monkeypatch, capsys):
    """Two DirectRunner worker processes (their start-up alone outlasts a few intervals): the
    documents counted in them reach the launcher's line on stderr; stdout keeps the summary only."""
    from pipelines.tokenize import main

    monkeypatch.setenv(progress.INTERVAL_ENV, "0.5")
    flags = ["--direct_num_workers=2", "--direct_running_mode=multi_processing"]
    assert main(["--output", str(tmp_path / "out"), *flags]) == 0
    cap = capsys.readouterr()
    lines = [x for x in cap.err.splitlines() if x.startswith("tokenize: ")]
    assert lines and "tokenize: " not in cap.out
    counted = [int(LINE.match(x)["n"].replace(",", "")) for x in lines]
    assert max(counted) > 0 and counted == sorted(counted)  # from the workers, never going back
    assert "of 6 text files done" in lines[-1]


def test_the_audit_prints_progress_with_the_records_of_all_and_an_eta(tmp_path, monkeypatch, capsys):
    from audit.__main__ import main
    from tests.audit import audit_fixtures as fx

    manifest = fx.write_sample(str(tmp_path / "data"), seq_len=16)
    monkeypatch.setenv(progress.INTERVAL_ENV, "0.02")
    assert main(["--data", manifest, "--out", str(tmp_path / "audit")]) == 0
    cap = capsys.readouterr()
    lines = [x for x in cap.err.splitlines() if x.startswith("audit: shard pass: ")]
    assert lines and "shard pass" not in cap.out
    from audit.shard_reader import load_manifest

    m = load_manifest(manifest)
    total = sum(r.records for split in ("train", "heldout") for r in m.shards(split))
    assert all(f"% of {total:,}" in x for x in lines), lines[-1]
