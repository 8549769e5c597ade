"""Data verified once per run: the first start hashes every shard and records it; a later start
hashes only what changed (plus a random sample) and opens nothing else; a shard changed after the
first start is caught at the next."""

from __future__ import annotations

import os

import pytest

from contract import TRAIN, Manifest
from dataloader import verify
from tests.dataloader.test_verify import rewrite
from tests.trainer.conftest import write_dataset
from trainer import preflight


@pytest.fixture
def manifests(tmp_path):
    return [Manifest.load(str(write_dataset(tmp_path / "data")))]


def counting(monkeypatch):
    seen: dict[str, list[str]] = {"hashed": [], "opened": []}
    real_hash, real_check = verify.hash_file, verify.check_structure
    monkeypatch.setattr(verify, "hash_file", lambda p: (seen["hashed"].append(p), real_hash(p))[1])
    monkeypatch.setattr(verify, "check_structure", lambda s: (seen["opened"].append(s.path), real_check(s))[1])
    return seen


def test_a_later_start_hashes_only_what_changed_and_catches_a_changed_shard(manifests, monkeypatch):
    shards = verify.listing(manifests, [TRAIN])
    seen = counting(monkeypatch)
    record = preflight.check_shards(manifests, [TRAIN], None, {}, sample=0)  # first start: every shard
    assert sorted(seen["hashed"]) == sorted(s.path for s in shards) and sorted(record) == sorted(seen["hashed"])
    seen["hashed"].clear()
    assert preflight.check_shards(manifests, [TRAIN], None, record, sample=0) == record
    assert seen == {"hashed": [], "opened": []}  # nothing changed: nothing read, nothing opened
    rewrite(shards[1].path, lambda records: records[::-1])  # same size, other bytes, a new mtime
    with pytest.raises(preflight.StartRefused, match=r"shard 1 .*its sha256 differs"):
        preflight.check_shards(manifests, [TRAIN], None, record, sample=0)
    assert seen["hashed"] == [shards[1].path]


def test_the_random_sample_catches_a_change_that_kept_size_and_mtime(manifests):
    shards = verify.listing(manifests, [TRAIN])
    record = preflight.check_shards(manifests, [TRAIN], None, {}, sample=0)
    st = os.stat(shards[0].path)
    rewrite(shards[0].path, lambda records: records[::-1])
    os.utime(shards[0].path, ns=(st.st_atime_ns, st.st_mtime_ns))  # mtime set back: the stamp vouches
    assert preflight.check_shards(manifests, [TRAIN], None, record, sample=0) == record  # unseen without a sample
    with pytest.raises(preflight.StartRefused, match="its sha256 differs"):
        preflight.check_shards(manifests, [TRAIN], None, record, sample=len(shards))


def test_what_to_hash_is_every_unvouched_shard_plus_a_seeded_sample(manifests):
    shards = verify.listing(manifests, [TRAIN, "heldout"])
    stamps = [(i, 7) for i in range(len(shards))]
    record = {s.path: [i, 7, s.sha256] for i, s in enumerate(shards)}
    assert verify.to_hash(shards, stamps, {}, 0, 1) == list(range(len(shards)))
    assert verify.to_hash(shards, stamps, record, 0, 1) == []
    moved = {**record, shards[0].path: [0, 8, shards[0].sha256], shards[1].path: [1, 7, "0" * 64]}
    assert verify.to_hash(shards, stamps, moved, 0, 1) == [0, 1]  # mtime changed; the manifest's sha256 changed
    picks = {tuple(verify.to_hash(shards, stamps, record, 1, seed)) for seed in range(40)}
    assert all(len(p) == 1 for p in picks) and len(picks) > 1  # one at random, drawn anew per seed
    assert verify.to_hash(shards, stamps, record, 1, 5) == verify.to_hash(shards, stamps, record, 1, 5)
    codes = [verify.HASHED, verify.RECORDED, verify.CHECKED, verify.RECORDED]
    new = verify.new_record(shards, stamps, codes, moved)
    assert sorted(new) == sorted([shards[0].path, shards[3].path])  # 1's entry no longer vouches; 2 only checked


def test_an_unreadable_record_is_no_record(tmp_path):
    path = tmp_path / verify.RECORD_NAME
    assert verify.read_record(str(path)) == {}
    path.write_text("{not json")
    assert verify.read_record(str(path)) == {}
    verify.write_record(str(path), {"a": [1, 2, "f" * 64]})
    assert verify.read_record(str(path)) == {"a": [1, 2, "f" * 64]}


def test_the_loader_does_not_reopen_a_shard_verified_at_this_start(manifests, monkeypatch):
    from dataloader import LoaderConfig, make_loader, source

    shards = verify.listing(manifests, [TRAIN])
    opened: list[str] = []
    real = source.check_shard
    monkeypatch.setattr(source, "check_shard", lambda path, *a: (opened.append(path), real(path, *a))[1])
    record = preflight.check_shards(manifests, [TRAIN], None, {}, sample=0)
    preflight.check_shards(manifests, [TRAIN], None, record, sample=0)  # a later start: all vouched for
    make_loader(LoaderConfig([manifests[0].path], 4), 0, 1).close()
    assert opened == []
    os.utime(shards[0].path)  # touched since: the loader checks it again
    make_loader(LoaderConfig([manifests[0].path], 4), 0, 1).close()
    assert opened == [shards[0].path]
