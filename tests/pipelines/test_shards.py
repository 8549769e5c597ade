"""Shards appear under their final name only when complete; leftovers of failed attempts go."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader

from pipelines.shards import remove_leftover_temps, shard_name, write_array_record, write_jsonl


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


def test_leftover_temp_files_are_removed(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "train-00000-of-00001.arrayrecord.tmp-dead").write_bytes(b"partial")
    write_jsonl([{"b": 1, "a": "é"}], str(tmp_path / "a" / "keep.jsonl"))
    (tmp_path / "manifest.json.tmp-dead").write_bytes(b"{")
    gone = remove_leftover_temps(str(tmp_path), ["a", "missing"])
    assert sorted(p.rsplit("/", 1)[1] for p in gone) == ["manifest.json.tmp-dead", "train-00000-of-00001.arrayrecord.tmp-dead"]
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["keep.jsonl"]
    assert (tmp_path / "a" / "keep.jsonl").read_text(encoding="utf-8") == '{"a": "é", "b": 1}\n'


def test_shards_not_listed_in_the_new_manifest_are_removed(tmp_path):
    from pipelines.shards import remove_stale_shards

    (tmp_path / "web").mkdir()
    for name in ("train-00000-of-00002.arrayrecord", "train-00001-of-00002.arrayrecord",
                 "train-00000-of-00001.arrayrecord"):
        (tmp_path / "web" / name).write_bytes(b"")
    (tmp_path / "web" / "notes.txt").write_text("not a shard")
    gone = remove_stale_shards(str(tmp_path), ["web", "books"], ["web/train-00000-of-00001.arrayrecord"])
    assert len(gone) == 2
    assert sorted(p.name for p in (tmp_path / "web").iterdir()) == ["notes.txt", "train-00000-of-00001.arrayrecord"]
