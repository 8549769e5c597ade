"""The loader reads only shards the manifest's folder holds, unless the manifest declares
another folder on purpose (contract: `external_shard_roots`)."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from contract import ManifestError, with_fingerprint
from contract.manifest import EXTERNAL_SHARD_ROOTS
from dataloader import LoaderConfig, make_loader


def _moved_out(manifest_path, tmp_path, rewrite, declare=None) -> str:
    """A copy of the fixture dataset whose 'web' shards live in a sibling folder `outside/`."""
    data, outside = tmp_path / "data", tmp_path / "outside"
    shutil.copytree(os.path.dirname(manifest_path), data)
    shutil.move(str(data / "web"), str(outside / "web"))
    m = json.loads((data / "manifest.json").read_text())
    for split in m["sources"]["web"]["splits"].values():
        for sh in split["shards"]:
            sh["path"] = rewrite(sh["path"], str(outside))
    if declare is not None:
        m[EXTERNAL_SHARD_ROOTS] = declare(str(outside))
    (data / "manifest.json").write_text(json.dumps(with_fingerprint(m)))
    return str(data / "manifest.json")


@pytest.mark.parametrize(
    "rewrite", [lambda p, out: "../outside/" + p, lambda p, out: os.path.join(out, p)], ids=["relative", "absolute"]
)
def test_loader_refuses_shards_outside_the_manifest_folder(manifest_path, tmp_path, rewrite):
    path = _moved_out(manifest_path, tmp_path, rewrite)
    with pytest.raises(ManifestError) as e:
        make_loader(LoaderConfig(data=[path], global_batch_size=8), 0, 1)
    msg = str(e.value)
    assert "\n" not in msg and path in msg and "web/train-00000-of-00003.arrayrecord'" in msg
    assert "resolves outside" in msg


def test_loader_reads_a_declared_external_folder_and_the_stream_is_unchanged(manifest_path, tmp_path):
    path = _moved_out(manifest_path, tmp_path, lambda p, out: os.path.join(out, p), declare=lambda out: [out])
    cfg = dict(global_batch_size=8, seed=3, prefetch=0)
    moved = [next(it) for it in [make_loader(LoaderConfig(data=[path], **cfg), 0, 1)] for _ in range(6)]
    here = make_loader(LoaderConfig(data=[manifest_path], **cfg), 0, 1)
    for a in moved:
        b = next(here)
        assert all(np.array_equal(a[k], b[k]) for k in b)
