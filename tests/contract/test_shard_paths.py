"""Shard paths resolve inside the manifest's folder (or its gs:// prefix) unless the manifest
declares the other folders on purpose (`external_shard_roots`)."""

from __future__ import annotations

import json

import pytest

import contract as c
from contract.manifest import EXTERNAL_SHARD_ROOTS, shard_path_problem
from tests.contract.test_contract import _manifest


def _write(folder, raw) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "manifest.json"
    path.write_bytes(c.dumps(raw))
    return str(path)


@pytest.mark.parametrize("shard", ["../../etc/passwd", "/etc/passwd", "a/../../outside/t", "..", "."])
def test_a_shard_path_outside_the_manifest_folder_is_refused_naming_the_manifest_and_the_path(tmp_path, shard):
    path = _write(tmp_path / "m", _manifest(shard))
    with pytest.raises(c.ManifestError) as e:
        c.Manifest.load(path)
    msg = str(e.value)
    assert "\n" not in msg and path in msg and repr(shard) in msg and EXTERNAL_SHARD_ROOTS in msg


def test_a_shard_path_inside_the_manifest_folder_is_accepted(tmp_path):
    for shard in ("a/train-00000-of-00001.arrayrecord", "a/./b/../t", str(tmp_path / "m" / "a" / "t")):
        c.Manifest.load(_write(tmp_path / "m", _manifest(shard)))


def test_a_declared_external_root_lets_shards_live_there_and_only_there(tmp_path):
    shared = str(tmp_path / "shared")
    ok = _manifest(shared + "/a/t", **{EXTERNAL_SHARD_ROOTS: [shared]})
    m = c.Manifest.load(_write(tmp_path / "m", ok))
    assert m.shards("train")[0].abspath == shared + "/a/t"
    relative = _manifest("../shared/a/t", **{EXTERNAL_SHARD_ROOTS: ["../shared"]})
    c.Manifest.load(_write(tmp_path / "m", relative))
    sibling = _manifest(shared + "x/a/t", **{EXTERNAL_SHARD_ROOTS: [shared]})  # a prefix, not a folder
    with pytest.raises(c.ManifestError, match="resolves outside"):
        c.Manifest.load(_write(tmp_path / "m", sibling))


def test_the_declaration_is_covered_by_the_fingerprint_and_must_be_a_list_of_folders(tmp_path):
    shared = str(tmp_path / "shared")
    raw = _manifest(shared + "/t", **{EXTERNAL_SHARD_ROOTS: [shared]})
    edited = json.loads(json.dumps(raw))
    edited[EXTERNAL_SHARD_ROOTS] = ["/"]  # widened after the fact: the fingerprint no longer matches
    with pytest.raises(c.ManifestError, match="fingerprint"):
        c.Manifest.load(_write(tmp_path / "m", edited))
    with pytest.raises(c.ManifestError, match="must be a list of folder paths"):
        c.Manifest.load(_write(tmp_path / "m", _manifest("a/t", **{EXTERNAL_SHARD_ROOTS: "/"})))


def test_many_bad_shard_paths_give_one_line_naming_the_first_in_reading_order(tmp_path):
    raw = _manifest("a/t")
    raw["sources"]["a"]["splits"]["train"]["shards"] = [
        {"path": p, "records": 0, "sha256": "s"} for p in ("a/ok", "/first/bad", "../second/bad", "/third")
    ]
    with pytest.raises(c.ManifestError) as e:
        c.Manifest.load(_write(tmp_path / "m", c.with_fingerprint(raw)))
    msg = str(e.value)
    assert "'/first/bad'" in msg and "second" not in msg and "and 2 more shard paths" in msg


def test_gs_prefixes_are_folders_too():
    assert shard_path_problem("a/t", "gs://bucket/data") is None
    assert shard_path_problem("gs://bucket/data/a/t", "gs://bucket/data") is None
    assert "gs://bucket/other/t" in shard_path_problem("../other/t", "gs://bucket/data")
    assert shard_path_problem("gs://bucket/data-old/t", "gs://bucket/data") is not None
    assert shard_path_problem("gs://shared/t", "gs://bucket/data", ["gs://shared"]) is None
    assert shard_path_problem("/local/t", "gs://bucket/data") is not None


def test_an_in_memory_manifest_refuses_paths_that_climb_out_too():
    with pytest.raises(c.ManifestError, match="resolves outside"):
        c.Manifest.from_json(_manifest("../t"))
    c.Manifest.from_json(_manifest("a/t"))
