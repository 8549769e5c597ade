"""The trainer refuses (exit 2, one line, nothing written) a manifest whose shard paths point
outside its folder, instead of training on whatever files those paths name."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from contract import with_fingerprint
from tests.trainer.conftest import ROOT, trainer_cmd, trainer_env


@pytest.mark.slow
def test_trainer_exits_2_on_a_manifest_with_a_shard_outside_its_folder(data_manifest, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(data_manifest.parent, data)
    m = json.loads((data / "manifest.json").read_text())
    shard = m["sources"]["prose"]["splits"]["train"]["shards"][0]
    shutil.copy(data / shard["path"], tmp_path / "stray.arrayrecord")
    shard["path"] = str(tmp_path / "stray.arrayrecord")  # absolute, outside the folder
    (data / "manifest.json").write_text(json.dumps(with_fingerprint(m)))
    proc = subprocess.run(
        trainer_cmd(data / "manifest.json", tmp_path / "run", "steps=2"),
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [ln for ln in proc.stderr.splitlines() if "resolves outside" in ln]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert str(data / "manifest.json") in lines[0] and str(tmp_path / "stray.arrayrecord") in lines[0]
    assert not (tmp_path / "run" / "checkpoints").exists()
