"""Shard contents are what the manifest pins (dataloader.verify): a shard replaced by a valid one
with as many records passes the loader's open checks but not its sha256; hashing is split among
processes within a budget and the description says exactly what was hashed; a record that cannot
be read mid-run names its shard and record."""

from __future__ import annotations

import pytest
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from contract import TRAIN, Manifest
from dataloader import LoaderConfig, make_loader, verify
from dataloader.source import ShardReadError
from tests.trainer.conftest import write_dataset


@pytest.fixture
def dataset(tmp_path):
    return write_dataset(tmp_path / "data")


def rewrite(path, fn):
    reader = ArrayRecordReader(str(path))
    records = reader.read_all()
    reader.close()
    writer = ArrayRecordWriter(str(path), "group_size:1")
    for r in fn(records):
        writer.write(r)
    writer.close()


def test_a_shard_replaced_with_as_many_valid_records_passes_the_open_checks_but_fails_its_sha256(dataset):
    shards = verify.listing([Manifest.load(str(dataset))], [TRAIN])
    assert [verify.outcome(s, hashed=True)[0] for s in shards] == [verify.HASHED] * len(shards)
    rewrite(shards[0].path, lambda records: records[::-1])  # same count, same size, other order
    it = make_loader(LoaderConfig([str(dataset)], 4), 0, 1)  # the loader's own checks pass
    it.close()
    assert verify.outcome(shards[0], hashed=False)[0] == verify.CHECKED
    code, detail = verify.outcome(shards[0], hashed=True)
    assert code == verify.MISMATCH and shards[0].sha256[:16] in detail
    results = verify.verify(shards, {0, 1}, set(), threads=2)
    assert [results[i][0] for i in (0, 1)] == [verify.MISMATCH, verify.HASHED]


def test_each_shard_is_hashed_by_one_process_within_its_budget():
    sizes = [10, 20, 30, 40, 50, 60, 70]
    parts = [verify.assign(sizes, h, 3, None) for h in range(3)]
    assert parts == [[0, 3, 6], [1, 4], [2, 5]]
    assert sorted(i for p in parts for i in p) == list(range(7))
    assert verify.assign(sizes, 0, 3, 50) == [0, 3] and verify.assign(sizes, 1, 3, 50) == [1]
    assert verify.assign(sizes, 0, 1, 0) == []


def test_the_description_names_exactly_the_shards_hashed_and_those_only_checked(dataset):
    shards = verify.listing([Manifest.load(str(dataset))], [TRAIN, "heldout"])
    codes = [verify.HASHED, verify.CHECKED, verify.HASHED, verify.HASHED]
    lines = verify.describe(shards, codes, [2**20] * 4)
    assert lines[0].startswith("shard contents: 3 of 4 shards hashed") and "3.00 MiB of 4.00 MiB" in lines[0]
    assert lines[1:] == [
        f"  {dataset} prose/train: shards 0 of 2 hashed; NOT hashed: shards 1 (their record count, "
        "writer options and record size checked only: a replaced shard with as many records would pass)"
    ]
    assert verify.ranges([0, 1, 2, 5, 7, 8]) == "0-2, 5, 7-8" and verify.ranges([]) == ""


def test_a_record_that_cannot_be_read_mid_run_names_its_shard_and_record(dataset):
    path = verify.listing([Manifest.load(str(dataset))], [TRAIN])[0].path
    data = bytearray(open(path, "rb").read())
    for off in range(1500, 20000, 300):  # the middle chunks: record 0 and the last still read (open checks pass)
        data[off] ^= 0x55
    open(path, "wb").write(bytes(data))
    it = make_loader(LoaderConfig([str(dataset)], 4), 0, 1)
    with pytest.raises(
        ShardReadError,
        match=rf"cannot read record \d+ of shard {path} \(source 'prose'; "
        r"RuntimeError: Corrupted Riegeli.*audit --data",
    ):
        for _ in range(200):
            next(it)
    it.close()
