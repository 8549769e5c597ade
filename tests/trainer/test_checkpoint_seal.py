"""The seal reads no host's files back on one host: each process hashes the files it wrote, the
primary merges them and hashes only what orbax wrote at finalization; the step is still sealed
before its commit, and its checksums equal a full re-hash."""

from __future__ import annotations

import json
import os

import pytest

from tests.processes import outputs_ok, workers
from trainer.checkpointing import files, rules


def test_a_file_is_attributed_to_the_process_orbax_names_it_for():
    assert files.writer("params/ocdbt.process_3/d/abc") == 3
    assert files.writer("opt_state/array_metadatas/process_12") == 12
    assert files.writer("params/ocdbt.process_0/manifest.ocdbt") == 0
    for primary in ("params/manifest.ocdbt", "params/d/abc", "_CHECKPOINT_METADATA", "meta/metadata", "x/process_1x"):
        assert files.writer(primary) is None


def test_the_seal_takes_each_process_share_and_hashes_only_the_rest(tmp_path, monkeypatch):
    step = tmp_path / "7.tmp"
    for rel, data in {
        "params/ocdbt.process_0/d/a": b"a" * 100,
        "params/ocdbt.process_1/d/b": b"b" * 200,
        "params/array_metadatas/process_1": b"m",
        "params/manifest.ocdbt": b"top",
    }.items():
        (step / rel).parent.mkdir(parents=True, exist_ok=True)
        (step / rel).write_bytes(data)
    assert files.hash_share(step, 1) == 201
    hashed = []
    real = files._sha256
    monkeypatch.setattr(files, "_sha256", lambda p: (hashed.append(p.relative_to(step).as_posix()), real(p))[1])
    assert files.seal(step) == 103  # process 0 recorded no share: the primary hashes its files too
    assert sorted(hashed) == ["params/manifest.ocdbt", "params/ocdbt.process_0/d/a"]
    recorded = json.loads((step / rules.CHECKSUMS).read_text())["files"]
    assert recorded == dict(zip(files.step_files(step), [real(step / r).hex() for r in files.step_files(step)]))
    assert not list(step.glob(f"{files.SHARE}*"))  # merged into the one checksum file


def test_a_share_naming_another_process_file_is_never_sealed(tmp_path):
    step = tmp_path / "7.tmp"
    (step / "params/ocdbt.process_1/d").mkdir(parents=True)
    (step / "params/ocdbt.process_1/d/b").write_bytes(b"b")
    files.hash_share(step, 1)
    (step / f"{files.SHARE}1").rename(step / f"{files.SHARE}0")  # process 0 claiming process 1's file
    with pytest.raises(rules.CheckpointError, match="did not write"):
        files.seal(step)
    assert not (step / rules.CHECKSUMS).exists()


def test_two_processes_each_hash_their_own_files_and_the_step_verifies_and_restores(tmp_path):
    with workers("tests.trainer.seal_worker", str(tmp_path)) as procs:
        outputs_ok(procs)
    step_dir = tmp_path / rules.CHECKPOINTS / "1"
    hashed = [  # as the committed step names them (written into orbax's temporary directories)
        [files._final(os.path.relpath(p, step_dir.parent).split("/", 1)[1]) for p in json.loads(path.read_text())]
        for path in (tmp_path / f"hashed-{i}.json" for i in range(2))
    ]
    process_1 = [rel for rel in files.step_files(step_dir) if files.writer(rel) == 1]
    assert process_1 and any("ocdbt.process_1/d/" in rel for rel in process_1)  # process 1 wrote array data
    assert sorted(hashed[1]) == sorted(process_1)  # process 1 hashed exactly its own files
    assert not set(hashed[0]) & set(process_1)  # the primary read none of them back
    assert set(hashed[0]) | set(hashed[1]) == set(files.step_files(step_dir))  # and together: all of them
