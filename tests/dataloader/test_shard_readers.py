"""Shards at open and while reading: every shard checked at once on a bounded pool, the error
naming the first bad shard in reading order whatever the threads' timing; at most
`max_open_shards` readers open per source, opened only when read, the stream unchanged."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time

import numpy as np
import pytest

import dataloader.source as source
from contract import with_fingerprint
from dataloader import LoaderConfig, make_loader
from tests.dataloader.conftest import two_sources, write_dataset


@pytest.fixture(scope="module")
def many_shards(tmp_path_factory) -> str:
    return write_dataset(str(tmp_path_factory.mktemp("many")), two_sources(np.random.default_rng(7)), shards=8)


def _miscount(manifest_path, tmp_path, bad: list[tuple[str, int]]) -> str:
    """A copy whose manifest gives the listed (source, shard) one record too many (refingerprinted)."""
    data = tmp_path / "data"
    shutil.copytree(os.path.dirname(manifest_path), data)
    m = json.loads((data / "manifest.json").read_text())
    for name, k in bad:
        m["sources"][name]["splits"]["train"]["shards"][k]["records"] += 1
        m["sources"][name]["splits"]["train"]["examples"] += 1
    (data / "manifest.json").write_text(json.dumps(with_fingerprint(m)))
    return str(data / "manifest.json")


@pytest.mark.parametrize("slow", ["web/train-00002", "code/train-00005", None])
def test_shards_are_checked_concurrently_and_the_first_bad_one_in_reading_order_is_named(
    many_shards, tmp_path, monkeypatch, slow
):
    """web is read before code: web's shard 2 is the first bad one, however long its check takes
    (`slow`: that shard's check waits, so the later bad shards fail first)."""
    path = _miscount(many_shards, tmp_path, [("code", 5), ("web", 6), ("web", 2)])
    real, lock, state = source.check_shard, threading.Lock(), {"now": 0, "most": 0}

    def watched(p, n, want):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            time.sleep(0.3 if slow and slow in p else 0.02)
            real(p, n, want)
        finally:
            with lock:
                state["now"] -= 1

    monkeypatch.setattr(source, "check_shard", watched)
    with pytest.raises(ValueError) as e:
        make_loader(LoaderConfig(data=[path], global_batch_size=8), 0, 1)
    msg = str(e.value)
    assert "\n" not in msg and "web/train-00002-of-00008.arrayrecord: " in msg and "the manifest says" in msg
    assert state["most"] > 1  # checks overlapped


def test_a_missing_shard_is_named_before_a_later_bad_one(many_shards, tmp_path):
    path = _miscount(many_shards, tmp_path, [("code", 7)])
    os.remove(os.path.join(os.path.dirname(path), "web", "train-00004-of-00008.arrayrecord"))
    with pytest.raises(FileNotFoundError, match=r"shard missing: .*web/train-00004-of-00008.arrayrecord$"):
        make_loader(LoaderConfig(data=[path], global_batch_size=8), 0, 1)


def test_at_most_max_open_shards_readers_are_open_and_the_stream_is_unchanged(many_shards):
    def run(max_open):
        it = make_loader(
            LoaderConfig(data=[many_shards], global_batch_size=8, seed=5, prefetch=0, max_open_shards=max_open), 0, 1
        )
        assert [s.open_shards for s in it._sources] == [0, 0]  # the checks leave nothing open
        batches, most = [], 0
        for _ in range(40):
            batches.append(next(it))
            most = max(most, *(s.open_shards for s in it._sources))
        it.close()
        return batches, most

    unbounded, most_unbounded = run(None)
    bounded, most_bounded = run(2)
    assert most_bounded == 2 and most_unbounded == 8  # 40 batches of 8 read from every shard
    for a, b in zip(unbounded, bounded):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def test_the_bound_holds_with_prefetch_threads_and_the_stream_is_unchanged(many_shards):
    cfg = dict(data=[many_shards], global_batch_size=8, seed=2)
    with make_loader(LoaderConfig(**cfg, prefetch=4, read_threads=3, max_open_shards=1), 0, 1) as it:
        threaded = [next(it) for _ in range(30)]
        # a reader in use by another thread is not closed under it: at most one per reading thread
        assert all(s.open_shards <= 3 for s in it._sources)
    with make_loader(LoaderConfig(**cfg, prefetch=0, max_open_shards=None), 0, 1) as it:
        plain = [next(it) for _ in range(30)]
    for a, b in zip(threaded, plain):
        assert all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("bad", [0, -1, True, 1.5])
def test_max_open_shards_must_be_a_positive_int_or_none(bad):
    with pytest.raises(ValueError, match="max_open_shards"):
        LoaderConfig(data=["m.json"], global_batch_size=8, max_open_shards=bad)


def stage1_shaped_manifest(shards: int = 40_000, records: int = 2_500):
    """A manifest of 10^8 records in 40,000 shards (no files: the reader memory needs none)."""
    from contract import Manifest
    from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE
    from tests.dataloader.conftest import SEQ_LEN

    n = shards * records
    raw = {
        "format_version": 1,
        "record_format": "uint32-le[seq_len]",
        "seq_len": SEQ_LEN,
        "tokenizer": {
            "name": "dolma2",
            "ranks_sha256": "x",
            "vocab_size": VOCAB_SIZE,
            "eos_id": EOS_ID,
            "pad_id": PAD_ID,
        },
        "mixture": {"name": "stage1", "sources": [{"name": "web", "paths": ["x"], "weight": 1.0}]},
        "sources": {
            "web": {
                "counts": {"documents": n, "train": n, "heldout": 0, "duplicates": 0, "rejected": {}},
                "tokens": {"train": n * SEQ_LEN, "heldout": 0, "padding": 0},
                "splits": {
                    "train": {
                        "examples": n,
                        "shards": [
                            {"path": f"web/train-{k:05d}.arrayrecord", "records": records, "sha256": "s"}
                            for k in range(shards)
                        ],
                    },
                    "heldout": {"examples": 0, "shards": []},
                },
            }
        },
    }
    return Manifest.from_json(with_fingerprint(raw))


def test_reader_memory_of_a_stage1_shaped_manifest_is_what_the_bound_allows():
    from dataloader.loader import reader_host_bytes

    m = stage1_shaped_manifest()
    every = reader_host_bytes(LoaderConfig(data=["m"], global_batch_size=512, max_open_shards=None), [m])
    bounded = reader_host_bytes(LoaderConfig(data=["m"], global_batch_size=512), [m])
    assert every == 10**8 * source.READER_INDEX_BYTES_PER_RECORD + 40_000 * source.READER_BYTES_PER_SHARD
    assert bounded == source.DEFAULT_MAX_OPEN_SHARDS * (
        source.READER_BYTES_PER_SHARD + 2_500 * source.READER_INDEX_BYTES_PER_RECORD
    )
    assert every > 0.8 * 2**30 > 10 * bounded


def _bytes_read() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's per-process I/O counters")
def test_opening_a_shard_reads_its_footer_not_a_megabyte_and_a_record_costs_its_own_bytes(tmp_path):
    from array_record.python.array_record_module import ArrayRecordWriter

    path, record = str(tmp_path / "s.arrayrecord"), os.urandom(32768)
    writer = ArrayRecordWriter(path, "group_size:1")
    for _ in range(2000):
        writer.write(record)
    writer.close()
    before = _bytes_read()
    source.check_shard(path, 2000, len(record))  # the start-up check: footer, index, 2 records
    checked = _bytes_read() - before
    shards = source._OpenShards([path], [2000], max_open=1)
    before = _bytes_read()
    assert shards.read(0, 1234) == record
    first = _bytes_read() - before
    before = _bytes_read()
    assert shards.read(0, 77) == record
    second = _bytes_read() - before
    shards.close()
    assert checked < 2**18 and first < 2**18  # ArrayRecord's default prefetches 1 MiB at every open
    assert second < 2 * len(record)  # an open reader: the record's own bytes
