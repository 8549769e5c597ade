"""bench.tokenize_stages: the per-stage CPU of the job's DoFn, per engine, in a fresh process."""

from __future__ import annotations

import gzip
import json
from importlib import resources

import zstandard

from bench import tokenize_stages as ts
from pipelines import dolma2_tokenizer as tk
from pipelines.split import text_digest


def _inputs(tmp_path) -> tuple[list[str], list[str]]:
    """Two .jsonl.zst files of the exactness fixture's documents (every kind of text): paths, texts."""
    raw = resources.files("pipelines").joinpath(tk.EXACTNESS_CORPUS).read_bytes()
    lines = [line for line in gzip.decompress(raw).split(b"\n") if line]
    paths = []
    for k in range(2):
        p = tmp_path / f"part-{k}.jsonl.zst"
        p.write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(lines[k::2]) + b"\n"))
        paths.append(str(p))
    return paths, [json.loads(line)["text"] for line in lines]


def test_the_stages_fit_inside_the_dofn_and_every_token_and_sampled_document_is_counted(tmp_path):
    paths, texts = _inputs(tmp_path)
    lines = ts.run_child("quicktok", paths, str(tmp_path / "out"), 1)
    start, (one,) = lines[0], lines[1:]
    enc = tk.dolma2()
    assert one["tokens"] == sum(len(enc.encode_ordinary(t)) for t in texts)
    assert one["checked"] == sum(tk.is_crosschecked(text_digest(t), tk.crosscheck_threshold(0.01)) for t in texts)
    assert set(one["stages"]) <= set(ts.STAGES) and one["stages"]["engine"] > 0
    assert 0 < sum(one["stages"].values()) <= one["dofn"] <= one["user"] + one["sys"] + 0.05
    assert start["imports"] > 0 and start["setup"] > 0 and start["builds"] == 0  # quicktok builds no gigatoken
    (row,) = ts.stage_rows("quicktok", lines)
    assert row.startswith("| quicktok | 1 | ") and row.count("|") == 10 + len(ts.STAGES) + 1


def test_a_recycling_limit_rebuilds_gigatokens_encoder_in_the_dofn(tmp_path):
    paths, texts = _inputs(tmp_path)
    chars = sum(map(len, texts))
    lines = ts.run_child("gigatoken", paths, str(tmp_path / "out"), 2, recycle_chars=chars // 4)
    start, passes = lines[0], lines[1:]
    assert start["builds"] == 1  # setup's encoder
    # one engine call per file (and split): each after the first finds the limit passed and rebuilds
    assert passes[0]["builds"] >= 1 and passes[1]["builds"] >= 2
    assert passes[0]["tokens"] == passes[1]["tokens"]


def test_rows_show_each_stage_and_its_share():
    lines = [
        {"imports": 1.0, "setup": 0.5, "builds": 1},
        {
            "pass": 1,
            "tokens": 2_000_000,
            "dofn": 2.0,
            "stages": {"engine": 1.0, "shard writes": 0.5},
            "checked": 3,
            "user": 1.8,
            "sys": 0.2,
            "builds": 2,
            "rss_mb": 300.0,
        },
    ]
    (row,) = ts.stage_rows("gigatoken", lines)
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[:5] == ["gigatoken", "1", "2.0M", "1.00", "2.00"]
    assert cells[5] == "1.00 (50%)" and cells[8] == "0.50 (25%)" and cells[10] == "0.50 (25%)"  # the rest
    assert cells[-4:] == ["1.80 / 0.20", "3", "3", "300"]  # pass 1's encoders: setup's one and its two
