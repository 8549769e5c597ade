"""The embedded sample builds offline, deterministically, and the default job runs on it."""

from __future__ import annotations

import filecmp
import json
import os

import pytest

from pipelines.read import Doc, open_lines, parse_line
from pipelines.sample import build_sample


@pytest.fixture(scope="module")
def sample_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("cache")
    return root, build_sample(root)


@pytest.mark.slow
def test_sample_is_identical_when_rebuilt_and_uses_all_three_formats(sample_cache, tmp_path):
    _, first = sample_cache
    second = build_sample(tmp_path)
    files = sorted(os.path.relpath(os.path.join(d, f), first) for d, _, fs in os.walk(first) for f in fs)
    assert {f.split(".", 1)[1] for f in files if "." in f} == {"jsonl", "jsonl.gz", "jsonl.zst"}
    _, mismatch, errors = filecmp.cmpfiles(first, second, files, shallow=False)
    assert mismatch == [] and errors == []
    total = sum(os.path.getsize(os.path.join(first, f)) for f in files)
    assert 500_000 < total < 20_000_000
    for f in files:
        if f != "DONE":
            for n, line in enumerate(open_lines(os.path.join(first, f)), 1):
                assert isinstance(parse_line("s", f, n, line), Doc)


@pytest.mark.slow
def test_default_job_runs_on_the_sample_and_prints_a_summary(sample_cache, tmp_path, monkeypatch, capsys):
    from pipelines.tokenize import main

    monkeypatch.setenv("OLMAX_CACHE", str(sample_cache[0]))
    monkeypatch.chdir(tmp_path)
    assert main([]) == 0  # no arguments: sample mixture → out/sample
    out = capsys.readouterr().out
    assert "out/sample/manifest.json" in out and "fingerprint" in out
    m = json.loads((tmp_path / "out/sample/manifest.json").read_text())
    assert list(m["sources"]) == ["code", "prose", "math"]
    # one row per source; "train tok" and "train ex" both count the training split; no Beam counters
    head = next(x for x in out.splitlines() if x.startswith("source "))
    assert head.split()[-4:] == ["tok", "train", "ex", "shards"] and "beam metrics" not in out
    rows = {x.split()[0]: x.split() for x in out.splitlines() if x.split() and x.split()[0] in m["sources"]}
    for name, entry in m["sources"].items():
        assert (
            int(rows[name][-3]) == entry["tokens"]["train"]
            and int(rows[name][-2]) == entry["splits"]["train"]["examples"]
        )
    for entry in m["sources"].values():
        c = entry["counts"]
        assert c["train"] > 0 and c["heldout"] > 0
        assert c["documents"] == c["train"] + c["heldout"] + c["duplicates"] + sum(c["rejected"].values())
        assert len(entry["splits"]["train"]["shards"]) > 1
