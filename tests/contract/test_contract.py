"""The data contract (contract): a leaf, one fingerprint, one naming, one run record."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import contract as c


def test_contract_is_a_leaf_that_imports_nothing_else_from_the_project():
    code = (
        "import sys, contract; print(sorted(m for m in sys.modules "
        "if m.split('.')[0] in ('pipelines', 'dataloader', 'trainer', 'model', 'audit', 'bench')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert json.loads(out.replace("'", '"')) == []


def _manifest(shard_path: str = "a/t", **extra) -> dict:
    """A minimal valid manifest: one source with one training shard at `shard_path`."""
    return c.with_fingerprint(
        {
            "format_version": c.FORMAT_VERSION,
            "record_format": c.RECORD_FORMAT,
            "seq_len": 4,
            "tokenizer": {"name": "t", "vocab_size": 10, "eos_id": 8, "pad_id": 9, "ranks_sha256": "r"},
            "mixture": {"name": "m", "sources": [{"name": "a", "paths": ["/x/a.jsonl"], "weight": 1.0}]},
            "sources": {
                "a": {
                    "counts": {"documents": 1, "train": 1, "heldout": 0, "duplicates": 0, "rejected": {}},
                    "tokens": {"train": 3, "heldout": 0, "padding": 1},
                    "splits": {
                        "train": {"examples": 1, "shards": [{"path": shard_path, "records": 1, "sha256": "s"}]},
                        "heldout": {"examples": 0, "shards": []},
                    },
                }
            },
            **extra,
        }
    )


def test_fingerprint_excludes_build_provenance_and_input_paths_but_pins_everything_else():
    m = _manifest()
    fp = m["fingerprint"]
    assert c.fingerprint({**m, "build": {"tokenizer_engine": "x", "version": "1"}}) == fp
    moved = json.loads(json.dumps(m))
    moved["mixture"]["sources"][0]["paths"] = ["gs://elsewhere"]
    assert c.fingerprint(moved) == fp
    reordered = json.loads(json.dumps(m))
    reordered["sources"]["a"]["splits"]["train"]["shards"][0]["sha256"] = "t"
    assert c.fingerprint(reordered) != fp


def test_manifest_whose_fingerprint_does_not_match_is_refused(tmp_path):
    m = _manifest()
    path = tmp_path / "manifest.json"
    path.write_bytes(c.dumps(m))
    assert c.Manifest.load(str(path)).fingerprint == m["fingerprint"]
    m["seq_len"] = 8
    path.write_bytes(c.dumps(m))
    with pytest.raises(c.ManifestError, match="fingerprint .* does not match the manifest's content"):
        c.Manifest.load(str(path))


def test_a_manifest_whose_sources_were_reordered_is_refused_though_its_fingerprint_matches(tmp_path):
    """The data order follows the `sources` object's key order, which the fingerprint (sorted keys)
    does not see: validation checks it against the mixture's source list, which it does."""
    m = json.loads(json.dumps(_manifest()))
    entry = m["sources"]["a"]
    m["mixture"]["sources"].append({"name": "b", "paths": ["/x/b.npy"], "weight": 1.0})
    m["sources"] = {"a": entry, "b": json.loads(json.dumps(entry))}
    m = c.with_fingerprint(m)
    path = tmp_path / "manifest.json"
    path.write_bytes(c.dumps(m))
    assert c.Manifest.load(str(path)).source_names == ("a", "b")
    swapped = {**m, "sources": {"b": m["sources"]["b"], "a": m["sources"]["a"]}}
    assert swapped["fingerprint"] == c.fingerprint(swapped)  # the fingerprint cannot tell
    path.write_bytes(c.dumps(swapped))
    with pytest.raises(
        c.ManifestError,
        match=r"sources are in the order \['b', 'a'\] but the mixture lists "
        r"\['a', 'b'\].*fingerprint \(sorted keys\) does not cover",
    ):
        c.Manifest.load(str(path))


def test_manifest_validation_names_every_missing_field():
    with pytest.raises(c.ManifestError) as e:
        c.validate({"seq_len": 8}, "x.json")
    for key in ("format_version", "tokenizer", "sources", "record_format", "fingerprint"):
        assert f"x.json: missing required field {key!r}" in str(e.value)


def test_data_log_names_round_trip_and_foreign_names_are_not_logs():
    for h, H in [(0, 1), (3, 4), (12345, 99999)]:
        assert c.parse_data_log_name(c.data_log_name(h, H)) == (h, H)
    for bad in [
        "host-00004-of-00004.jsonl",
        "host-1-of-2.jsonl",
        "host-00000-of-00002.json",
        "x.jsonl",
        "host-00000-of-00001.jsonl\n",
        "a/host-00000-of-00001.jsonl",
        "host-00000-of-00001.jsonl.tmp",
    ]:
        assert c.parse_data_log_name(bad) is None
    with pytest.raises(ValueError):
        c.data_log_name(2, 2)


def test_torn_json_line_error_names_file_and_line(tmp_path):
    p = tmp_path / "log.jsonl"
    p.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "ind')
    with pytest.raises(c.JsonLinesError, match=r"log.jsonl:3: not valid JSON.*torn last line"):
        list(c.iter_jsonl(str(p)))


def test_chain_hash_depends_on_order_step_and_history_not_on_int_width():
    a = c.chain_data_sha256("", 0, np.array([1, 2, 3, 4]))
    assert a == c.chain_data_sha256("", 0, np.array([1, 2, 3, 4], np.int32))
    assert a != c.chain_data_sha256("", 0, np.array([2, 1, 3, 4]))
    assert a != c.chain_data_sha256("", 1, np.array([1, 2, 3, 4]))
    assert c.chain_data_sha256(a, 1, np.array([5])) != c.chain_data_sha256("", 1, np.array([5]))


def _record(**kw) -> c.RunRecord:
    base = dict(
        global_batch_size=8,
        seed=3,
        data=("m.json",),
        manifest_fingerprints=("f",),
        loader_fingerprint="l",
        order=c.INDEX_SHUFFLE,
        seq_len=4,
        tokenizer=c.TokenizerInfo("t", 10, 8, 9, "r"),
        hosts=(c.HostRange(0, 2),),
    )
    return c.RunRecord(**{**base, **kw})


def test_run_record_round_trips_and_tracks_elastic_restarts(tmp_path):
    r = _record()
    r.write(str(tmp_path))
    assert c.RunRecord.load(str(tmp_path)) == r
    r2 = r.restarted(10, 4).restarted(10, 4).restarted(20, 4).restarted(30, 1)
    assert [(x.first_step, x.host_count) for x in r2.hosts] == [(0, 2), (10, 4), (30, 1)]
    assert [r2.host_count_at(s) for s in (0, 9, 10, 29, 30, 99)] == [2, 2, 4, 4, 1, 1]
    assert r2.restarted(5, 2).hosts == (c.HostRange(0, 2),)  # resumed from step 5: later ranges re-run
    assert r.restarted(0, 4).hosts == (c.HostRange(0, 4),)


def test_run_record_of_an_unknown_schema_version_is_refused(tmp_path):
    d = _record().to_json()
    (tmp_path / "run.json").write_text(json.dumps({**d, "schema_version": 2}))
    with pytest.raises(c.RunRecordError, match="schema_version 2 unknown"):
        c.RunRecord.load(str(tmp_path))
    del d["hosts"]
    (tmp_path / "run.json").write_text(json.dumps(d))
    with pytest.raises(c.RunRecordError, match="hosts"):
        c.RunRecord.load(str(tmp_path))


def test_unpack_recovers_documents_and_refuses_a_truncated_stream():
    recs = [np.array([1, 2, 8, 3], "<u4"), np.array([8, 4, 8, 9], "<u4")]
    assert c.unpack(recs, 8, 9) == [[1, 2], [3], [4]]
    with pytest.raises(ValueError, match="ends inside a document"):
        c.unpack([np.array([1, 2, 3], "<u4")], 8, 9)


@pytest.mark.parametrize(
    "bad", [True, False, 2.0, 1.5, float("nan"), "1", None, [0], {}, -1, 1 << 63, 1 << 64, -(1 << 63)]
)
@pytest.mark.parametrize("at", [0, 1, 300])
def test_a_data_log_row_with_one_element_that_is_not_an_int64_id_is_refused(bad, at):
    # the check is vectorised (data-log passes read ~600k rows per host); it must still refuse
    # exactly what the element-by-element rule does: bools, floats (whole ones too), strings,
    # nulls, nested values, ints outside [0, 2^63), wherever they sit in the row
    good = list(range(7, 7 + 512))
    assert c.data_log_row_problem({"step": 3, "index": good, "example": list(good)}) is None
    for key in ("index", "example"):
        row = {"step": 3, "index": list(good), "example": list(good)}
        row[key][at] = bad
        assert c.data_log_row_problem(row) == f"{key} must be a list of ints in [0, 2^63)", (key, bad, at)


def test_data_log_rows_of_edge_ids_and_empty_lists_are_accepted():
    for ids in ([], [0], [1], [0, 1, 0], [(1 << 63) - 1, 0, 1]):
        assert c.data_log_row_problem({"step": 0, "index": ids, "example": list(ids)}) is None
    assert (
        c.data_log_row_problem({"step": 0, "index": (0, 1), "example": [0, 1]}) is not None
    )  # a tuple is no JSON list
