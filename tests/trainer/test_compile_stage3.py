"""The OLMo 3 7B stage-3 step (trainer/configs/olmo3-7b-stage3.yaml: 65,536 tokens a sequence, YaRN,
document masking) compiled for v5p-128 (4x4x4, 64 chips, one sequence each) WITHOUT context
parallelism. Not in `make test`: one compile took 40 min of wall time on a loaded 2-core box
(2026-12-07); `make compile-check` runs it."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.trainer.conftest import ROOT, trainer_env

STAGE3 = str(ROOT / "trainer/configs/olmo3-7b-stage3.yaml")


@pytest.mark.compile_check
def test_the_stage3_step_fits_64_v5p_chips_one_65536_token_sequence_each(tmp_path):
    out = tmp_path / "compile.json"
    cmd = [sys.executable, "-m", "trainer.compile", "--config", STAGE3, "--topology", "v5p:4x4x4", "--out", str(out)]
    proc = subprocess.run(
        [*cmd, "--skip_eval"], cwd=ROOT, env=trainer_env(), capture_output=True, text=True, timeout=3600
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    r = json.loads(out.read_text())
    assert r["fits"] and r["seq_len"] == 65536 and r["global_batch_size"] == 64 and r["rows_per_device"] == 1
    assert r["remat"] == "full"
