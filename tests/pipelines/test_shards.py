"""Shards appear under their final name only when complete (their clean-up: test_outdir)."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader

from pipelines.shards import shard_name, write_array_record


def test_shard_is_written_complete_with_its_sha256(tmp_path):
    dest = tmp_path / "src" / shard_name("train", 3, 12)
    assert dest.name == "train-00003-of-00012.arrayrecord"
    recs = [np.arange(i, i + 8, dtype="<u4").tobytes() for i in range(5)]
    n, sha = write_array_record(recs, str(dest))
    assert n == 5 and sha == hashlib.sha256(dest.read_bytes()).hexdigest()
    r = ArrayRecordReader(str(dest))
    assert r.num_records() == 5 and r.read([4])[0] == recs[4]
    assert sorted(p.name for p in dest.parent.iterdir()) == [dest.name]
    # a retry rewrites the same name with the same bytes
    assert write_array_record(recs, str(dest)) == (n, sha)


def test_a_failing_writer_leaves_no_shard_under_its_final_name(tmp_path):
    dest = tmp_path / "src" / "train-00000-of-00001.arrayrecord"

    def records():
        yield b"x" * 32
        raise RuntimeError("worker died")

    with pytest.raises(RuntimeError):
        write_array_record(records(), str(dest))
    assert not dest.exists()
