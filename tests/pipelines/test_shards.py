"""Shards appear under their final name only when complete (their clean-up: test_outdir)."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordReader

from pipelines.shards import shard_name, write_array_record, write_jsonl


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
