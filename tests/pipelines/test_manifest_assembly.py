"""Manifest accounting and fingerprint (pure functions)."""

from __future__ import annotations

import copy

import pytest

from pipelines.manifest_assembly import AccountingError, build_manifest, tokenizer_info

MIX = {
    "name": "m",
    "tokenizer": "dolma2",
    "seq_len": 4,
    "seed": 0,
    "heldout_fraction": 0.5,
    "dedup": True,
    "sources": [{"name": "a", "paths": ["/x/a.jsonl"], "weight": 1.0, "max_repetition": None}],
}
SHARDS = [
    {
        "source": "a",
        "split": "train",
        "index": 1,
        "count": 2,
        "path": "a/train-00001-of-00002.arrayrecord",
        "records": 1,
        "sha256": "s1",
        "documents": 1,
        "tokens": 3,
        "padding": 1,
    },
    {
        "source": "a",
        "split": "train",
        "index": 0,
        "count": 2,
        "path": "a/train-00000-of-00002.arrayrecord",
        "records": 2,
        "sha256": "s0",
        "documents": 2,
        "tokens": 8,
        "padding": 0,
    },
]
TALLIES = [(("a", "documents"), 5), (("a", "duplicates"), 1), (("a", "rejected/invalid_json"), 1)]


def test_manifest_lists_shards_in_reading_order_and_counts_add_up():
    m = build_manifest(MIX, tokenizer_info("dolma2"), TALLIES, SHARDS, reasons=("invalid_json", "empty_text"))
    a = m["sources"]["a"]
    assert [s["path"] for s in a["splits"]["train"]["shards"]] == [SHARDS[1]["path"], SHARDS[0]["path"]]
    assert a["counts"] == {
        "documents": 5,
        "train": 3,
        "heldout": 0,
        "duplicates": 1,
        "rejected": {"empty_text": 0, "invalid_json": 1},
    }
    assert a["tokens"] == {"train": 11, "heldout": 0, "padding": 1} and a["splits"]["train"]["examples"] == 3
    assert a["splits"]["heldout"] == {"examples": 0, "shards": []}


def test_a_lost_document_fails_the_job():
    with pytest.raises(AccountingError, match="6 documents read but 5 placed"):
        build_manifest(MIX, tokenizer_info("dolma2"), [*TALLIES, (("a", "documents"), 1)], SHARDS)
    with pytest.raises(AccountingError, match="not 0..1"):
        build_manifest(MIX, tokenizer_info("dolma2"), TALLIES, SHARDS[:1])


def test_fingerprint_pins_content_but_not_input_location():
    m1 = build_manifest(MIX, tokenizer_info("dolma2"), TALLIES, SHARDS)
    moved = copy.deepcopy(MIX)
    moved["sources"][0]["paths"] = ["gs://elsewhere/a.jsonl"]
    assert build_manifest(moved, tokenizer_info("dolma2"), TALLIES, SHARDS)["fingerprint"] == m1["fingerprint"]
    changed = copy.deepcopy(SHARDS)
    changed[0]["sha256"] = "other"
    assert build_manifest(MIX, tokenizer_info("dolma2"), TALLIES, changed)["fingerprint"] != m1["fingerprint"]
    reseeded = {**MIX, "seed": 1}
    assert build_manifest(reseeded, tokenizer_info("dolma2"), TALLIES, SHARDS)["fingerprint"] != m1["fingerprint"]


def test_fingerprint_does_not_depend_on_the_encoder_engine():
    from pipelines.manifest_assembly import fingerprint

    m = build_manifest(MIX, tokenizer_info("dolma2"), TALLIES, SHARDS)
    quick = {
        **m,
        "build": {"tokenizer_engine": "quicktok", "tokenizer_engine_version": "0.4.0", "crosscheck": {"rate": 0.01}},
    }
    tik = {**m, "build": {"tokenizer_engine": "tiktoken", "tokenizer_engine_version": "0.12.0", "crosscheck": None}}
    assert fingerprint(quick) == fingerprint(tik) == fingerprint(m) == m["fingerprint"]
    assert fingerprint({**quick, "seq_len": 8}) != m["fingerprint"]  # the rest still counts
