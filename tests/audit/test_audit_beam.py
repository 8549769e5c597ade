"""The data side's shard pass on Beam: shards are scanned independently (in any order, by any
worker) and replayed in reading order, so a document that crosses a shard boundary is rebuilt
and checked like any other, several worker processes give the same audit as one, and the pass
builds for Dataflow with the tokenize job's options."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from audit.__main__ import main
from audit.contamination import ContaminationConfig
from audit.engine import DryRun
from audit.scan import scan
from audit.shard_reader import iter_record_chunks, load_manifest
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID
from tests.audit import audit_fixtures as fx
from tests.pipelines.test_dataflow_dry_run import DATAFLOW_FLAGS

SEQ = 4


def _docs(tokens: np.ndarray) -> list[list[int]]:
    out, cur = [], []
    for t in tokens.tolist():
        if t == EOS_ID:
            out.append(cur)
            cur = []
        elif t != PAD_ID:
            cur.append(t)
    return out


@pytest.fixture(scope="module")
def across(tmp_path_factory):
    """A sample whose web/train split is one packing stream cut into two shards at a record
    boundary inside the held-out document that was copied into training. Returns (manifest,
    the copy's ordinal among web/train documents)."""
    root = tmp_path_factory.mktemp("across")
    manifest = fx.write_sample(str(root), inject_heldout_into_train=True, shards=1, seq_len=SEQ)
    copied = fx.first_document(manifest, "web", "heldout")
    m = load_manifest(manifest)
    (ref,) = m.shards("train", "web")
    records = np.concatenate([np.frombuffer(b"".join(c), "<u4") for c in iter_record_chunks(ref.abspath)])
    docs = _docs(records)
    k = docs.index(copied)
    start = sum(len(d) + 1 for d in docs[:k])
    cut = start // SEQ + 1  # the first record boundary after the copy's first token
    assert cut * SEQ < start + len(copied), "the copy must cross the boundary"
    recs = records.reshape(-1, SEQ)
    os.remove(ref.abspath)
    entries = [
        {
            "path": f"web/train-0000{i}-of-00002.arrayrecord",
            **fx.write_shard(os.path.join(str(root), f"web/train-0000{i}-of-00002.arrayrecord"), part),
        }
        for i, part in enumerate((recs[:cut], recs[cut:]))
    ]
    fx.edit_manifest(manifest, lambda raw: raw["sources"]["web"]["splits"]["train"].update(shards=entries))
    return manifest, k


def test_a_document_across_a_shard_boundary_is_rebuilt_and_checked(across):
    manifest, k = across
    r = scan(load_manifest(manifest), ContaminationConfig())
    assert r.integrity.passed and r.statistics.passed, (r.integrity.summary, r.statistics.summary)
    assert r.contamination.passed is False and r.contamination.failure_count == 1
    assert r.contamination.failures[0].startswith(
        f"training document {k} of web/train (ends in web/train-00001-of-00002.arrayrecord) is an exact copy "
        "of held-out document 0 of web/heldout"
    )
    web = next(row for row in r.statistics.figures["splits"] if (row["source"], row["split"]) == ("web", "train"))
    assert web["documents"] == web["eos"] == web["manifest_documents"]


@pytest.mark.slow
def test_two_worker_processes_give_the_same_results_as_one(across):
    manifest, _ = across
    one = scan(load_manifest(manifest), ContaminationConfig())
    two = scan(
        load_manifest(manifest),
        ContaminationConfig(),
        beam_args=("--direct_num_workers=2", "--direct_running_mode=multi_processing"),
    )
    for name in ("integrity", "contamination", "statistics"):
        a, b = getattr(one, name).to_json(), getattr(two, name).to_json()
        assert json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str), name


def test_the_data_pass_builds_for_dataflow_without_submitting(across, tmp_path, capsys):
    manifest, _ = across
    with pytest.raises(DryRun) as e:
        scan(load_manifest(manifest), ContaminationConfig(), beam_args=tuple(DATAFLOW_FLAGS))
    job = e.value.result.job  # the Dataflow job request that would have been sent
    labels = {t.unique_name for t in job.proto_pipeline.components.transforms.values()}
    for step in ("ScanHeldout", "HeldoutIndex", "ScanTrain", "CollectTrain", "WriteScans"):
        assert step in labels, step
    assert main(["--data", manifest, "--out", str(tmp_path / "r"), *DATAFLOW_FLAGS]) == 0
    assert "dry run" in capsys.readouterr().out and not (tmp_path / "r" / "audit.json").exists()


def test_an_unknown_flag_is_refused_before_any_shard_is_read(across, tmp_path, capsys):
    manifest, _ = across
    with pytest.raises(SystemExit) as e:
        main(["--data", manifest, "--out", str(tmp_path / "r"), "--direct_num_wrokers=2"])
    assert e.value.code == 2 and "direct_num_wrokers" in capsys.readouterr().err


def test_a_negative_worker_count_is_refused_before_any_shard_is_read(across, tmp_path, capsys):
    manifest, _ = across
    with pytest.raises(SystemExit) as e:
        main(["--data", manifest, "--out", str(tmp_path / "r"), "--direct_num_workers=-1"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "direct_num_workers" in err and "Traceback" not in err
    assert not (tmp_path / "r").exists()


def test_a_shard_that_cannot_be_read_at_all_exits_2_with_one_line(tmp_path, capsys):
    manifest = fx.write_sample(str(tmp_path / "data"))
    shard = tmp_path / "data" / "web" / "train-00001-of-00002.arrayrecord"
    shard.unlink()
    shard.mkdir()  # a directory where the shard belongs: no bytes to check, as when one process reads it
    assert main(["--data", manifest, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: cannot read the input: [Errno 21] Is a directory: '{shard}'"


def test_the_workers_index_finds_every_copy_in_fewer_bytes_and_the_driver_names_it():
    """The held-out index copied to every worker keeps only what finds copies (16 of the 32 bytes
    per held-out document; the 13-gram filter is a fixed size); a copy is carried as its position
    in the index, which the driver's whole index (built from the same scans) names."""
    import pickle

    from audit.shardscan import HeldoutIndex

    rng = np.random.default_rng(0)
    digests = rng.integers(0, 256, (1000, 16), dtype=np.uint8).view("S16").ravel()
    whole = HeldoutIndex.build(digests, np.arange(1000), np.zeros(1000, np.int64), ["web/heldout"], [])
    lite = whole.for_lookups()
    probe = np.concatenate([digests[::7], rng.integers(0, 256, (50, 16), dtype=np.uint8).view("S16").ravel()])
    found = lite.find(probe)
    assert np.array_equal(found, whole.find(probe)) and (found[:143] >= 0).all() and (found[143:] < 0).all()
    assert whole.where(int(lite.find(digests[14:15])[0])) == "document 14 of web/heldout"
    assert len(pickle.dumps(whole)) - len(pickle.dumps(lite)) >= 16 * 1000
