"""The OLMo 3 7B stage-1 step compiled for TPU slices, each compile minutes of one core (the TPU
compiler's time hardly depends on the layer count: 4 layers cost what 32 do). None is in `make test`:
CI runs the v5p-64 one in its own step after it (`make compile-7b`: `pytest -m compile_7b`);
`make compile-check` runs all of them.

Measured results of the same commands over more slices: bench/RESULTS.md (python -m bench.compile_table).
"""

from __future__ import annotations

import pytest

from tests.trainer.conftest import ROOT
from tests.trainer.test_compile import compile_cmd
from trainer import memory_report as report

STAGE1 = str(ROOT / "trainer/configs/olmo3-7b-stage1.yaml")
ONE_PER_DEVICE = ("--skip_eval", "global_batch_size=32")  # v5p:2x4x4: 32 devices, one sequence each


def full_logits(r: dict) -> list[dict]:
    """Largest train-step buffers holding [rows, T or T-1, V] logits."""
    return [b for b in r["largest_buffers"] if ",8191,100278]" in b["shapes"] or ",8192,100278]" in b["shapes"]]


@pytest.mark.compile_7b
def test_7b_on_32_v5p_chips_holds_its_state_sharded_32_ways_and_no_full_logits(tmp_path):
    """One sequence per device on v5p-64 (2x4x4): the arguments are the fp32 params + Adam moments
    + skip step / 32, the step fits, and with the recipe's loss_chunk no [1, T, V] logits buffer is
    among the compiler's largest."""
    proc, r = compile_cmd(tmp_path, STAGE1, "v5p:2x4x4", *ONE_PER_DEVICE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    st = r["state_bytes_per_device"]
    assert r["per_device_bytes"]["arguments"] == pytest.approx(
        st["params"] + st["optimizer_state"] + st["batch"], rel=0.001
    )
    assert st["params"] == pytest.approx(7.298e9 * 4 / 32, rel=0.01) and r["loss_chunk"] == 1024
    assert r["fits"] and r["largest_buffers"] and not full_logits(r)


@pytest.mark.compile_check
def test_7b_full_float32_logits_are_among_the_largest_buffers_and_chunking_lowers_the_peak(tmp_path):
    """With loss_chunk=0 the compiler's largest buffers include the float32 [1, 8191, 100278] logits
    (3 GiB a sequence); the recipe's loss_chunk lowers the peak by more than 2 GiB per device."""
    proc, chunked = compile_cmd(tmp_path / "chunked", STAGE1, "v5p:2x4x4", *ONE_PER_DEVICE)
    assert proc.returncode == 0, proc.stderr[-4000:]
    proc, full = compile_cmd(tmp_path / "full", STAGE1, "v5p:2x4x4", *ONE_PER_DEVICE, "loss_chunk=0")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert full_logits(full) and full_logits(full)[0]["bytes"] >= 3 * report.GIB
    assert chunked["per_device_bytes"]["peak"] < full["per_device_bytes"]["peak"] - 2 * report.GIB


@pytest.mark.compile_check
def test_the_recipes_global_batch_trains_on_the_smallest_v5p_slice_with_microbatches(tmp_path):
    """512 x 8192 on v5p-8 (2x2x1, 4 chips): 128 microbatches of one sequence per chip fit (train
    and eval); without microbatches the compiler refuses it (exit 2 naming the levers)."""
    proc, r = compile_cmd(tmp_path / "mb", STAGE1, "v5p:2x2x1", "microbatches=128")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert r["fits"] and r["global_batch_size"] == 512 and r["rows_per_device"] == 128
    proc, r = compile_cmd(tmp_path / "whole", STAGE1, "v5p:2x2x1", "--skip_eval")
    assert proc.returncode == 2 and "Levers: microbatches=N" in proc.stderr and not r["fits"]
