"""The audit refuses a manifest whose shard paths point outside its folder (the contract's rule),
instead of auditing whatever files those paths name."""

from __future__ import annotations

import shutil

from audit.__main__ import main
from tests.audit import audit_fixtures as fx


def test_audit_refuses_a_manifest_with_a_shard_outside_its_folder(tmp_path, capsys):
    manifest = fx.write_sample(str(tmp_path / "data"))
    shutil.move(str(tmp_path / "data" / "web"), str(tmp_path / "elsewhere"))

    def point_outside(m):
        for split in m["sources"]["web"]["splits"].values():
            for sh in split["shards"]:
                sh["path"] = "../elsewhere/" + sh["path"].split("/", 1)[1]

    fx.edit_manifest(manifest, point_outside)  # a consistent manifest: the fingerprint matches
    assert main(["--data", manifest, "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "resolves outside" in err and "Traceback" not in err, err
    assert manifest in err and "'../elsewhere/train-00000-of-00002.arrayrecord'" in err
    assert not (tmp_path / "r").exists()
