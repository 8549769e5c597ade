"""The OLMo 3 7B stage-3 step (trainer/configs/olmo3-7b-stage3.yaml: 65,536 tokens a sequence, YaRN,
document masking) compiled for v5p-128 (4x4x4, 64 chips, one sequence each) WITHOUT context
parallelism: the recipe's own layout (context 8) is tests/trainer/test_compile_context.py; this one
is its fallback by override (mesh.context=1, one whole sequence a device, seq_chunk 8192 for the
token-wise parts). Not in `make test`: one compile took 40 min of wall time on a loaded 2-core box
(2026-12-07); `make compile-check` runs it."""

from __future__ import annotations

import pytest

from tests.trainer.test_compile_context import compile_stage3

WITHOUT_CONTEXT = ("mesh.context=1", "microbatches=1", "model_overrides.seq_chunk=8192")


@pytest.mark.compile_check
def test_the_stage3_step_fits_64_v5p_chips_one_65536_token_sequence_each(tmp_path):
    proc, r = compile_stage3(tmp_path, "v5p:4x4x4", *WITHOUT_CONTEXT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert r["mesh"] == {"data": 1, "fsdp": 64, "tensor": 1}
    assert r["fits"] and r["seq_len"] == 65536 and r["global_batch_size"] == 64 and r["rows_per_device"] == 1
    assert r["remat"] == "full"
