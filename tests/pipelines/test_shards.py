"""Shards appear under their final name only when complete (their clean-up: test_outdir)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader

from pipelines.shards import ShardWriter, shard_name, write_array_record, write_jsonl


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


def test_a_side_file_row_is_one_line_for_any_line_reader(tmp_path):
    # JSON allows U+0085, U+2028 and U+2029 raw inside strings, but str.splitlines (and other
    # readers) break lines there: a rejected line's excerpt or an id holding one must not split its row
    from pipelines.shards import jsonl_line

    row = {"id": "a\u2028b", "excerpt": "x\x85y\u2029z\n\x0b\x1c", "kept": {"id": "é🙂\x00"}}
    dest = tmp_path / "rows.jsonl"
    assert write_jsonl([row, row], str(dest))[0] == 2
    text = dest.read_text(encoding="utf-8")
    assert [json.loads(x) for x in text.splitlines()] == [row, row]
    assert jsonl_line({"a": "é"}) == '{"a": "é"}\n'.encode()  # other text stays readable UTF-8


@pytest.mark.parametrize("compression", ["zstd:1", "snappy", "uncompressed"])
def test_a_shard_compression_changes_the_bytes_not_the_records(tmp_path, compression):
    recs = [(np.arange(i, i + 4096, dtype="<u4") % 50).tobytes() for i in range(20)]  # repetitive, as token ids are
    dest = tmp_path / f"{compression.replace(':', '')}.arrayrecord"
    write_array_record(recs, str(dest), compression)
    r = ArrayRecordReader(str(dest))
    options = r.writer_options_string()
    assert r.read_all() == recs and "group_size:1" in options and compression.split(":")[0] in options
    r.close()
    raw = sum(map(len, recs))
    # uncompressed holds every byte; the compressed ones hold far fewer of these regular ids
    assert (dest.stat().st_size > raw) == (compression == "uncompressed")


def test_an_unknown_shard_compression_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="shard compression"):
        write_array_record([b"x"], str(tmp_path / "a.arrayrecord"), "zstd:9")
    with pytest.raises(ValueError, match="shard compression"):
        ShardWriter(8, 1, 0, compression="brotli")
    assert list(tmp_path.iterdir()) == []
