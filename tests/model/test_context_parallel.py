"""model.context_parallel: the zig-zag layout, the rules, and attention under context parallelism
equal to the unsharded attention (8 CPU devices in a subprocess)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import model
from model import context_parallel as cp
from tests import fast_compile

REPO = str(Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("C", [1, 2, 4, 8])
def test_layout_round_trips_and_gives_device_i_chunks_i_and_2C_minus_1_minus_i(C):
    T = 64
    x = np.arange(3 * T).reshape(3, T)
    laid = cp.to_layout(x, C)
    assert np.array_equal(cp.from_layout(laid, C), x)
    assert sorted(laid[0]) == list(range(T))  # a permutation of each row
    L = T // (2 * C)
    for i, dev in enumerate(np.split(cp.layout_index(T, C), C)):
        assert np.array_equal(dev, np.r_[i * L : (i + 1) * L, (2 * C - 1 - i) * L : (2 * C - i) * L])


def test_layout_balances_causal_work_over_the_devices():
    """Each device's queries see the same number of causal keys (contiguous shards: the last device
    would do 2C - 1 times the first's)."""
    T, C = 256, 8
    work = [int(np.sum(dev + 1)) for dev in np.split(cp.layout_index(T, C), C)]
    assert len(set(work)) == 1
    contiguous = [int(np.sum(dev + 1)) for dev in np.split(np.arange(T), C)]
    assert contiguous[-1] > 10 * contiguous[0]


def test_rows_of_makes_each_devices_positions_a_row():
    x = np.arange(2 * 16).reshape(2, 16)
    assert np.array_equal(cp.rows_of(x, 4)[5], x[1, 4:8])


def test_context_rules_put_positions_and_weights_on_the_context_axis():
    rules = dict(cp.sharding_config().rules)
    assert rules["act_length"] == "context" and rules["embed"] == ("fsdp", "context")
    loss = dict(cp.loss_rules(cp.sharding_config()))
    assert loss["act_batch"] == ("data", "fsdp", "context") and loss["act_length"] is None


def test_a_seq_len_not_cut_into_2C_chunks_is_refused():
    cp.check(64, 8)
    with pytest.raises(ValueError, match="divisible by 2 x context = 16"):
        cp.check(72, 8)


def test_the_kernels_mask_rows_are_the_layouts_original_positions():
    """The splash kernel's mask is the unsharded causal/local mask with its rows permuted: its
    q_sequence is the layout's original positions (hashed with the mask, so kernels of different
    context sizes are different kernels)."""
    cfg = dataclasses.replace(
        model.get_config("olmo3-tiny"), splash_block_q=128, splash_block_kv=128, splash_fused_bwd=False
    )
    k2 = cp.cp_splash_kernel(cfg, 512, 100, 1, 2, 1, True)
    k4 = cp.cp_splash_kernel(cfg, 512, 100, 1, 4, 1, True)
    assert np.array_equal(np.asarray(k2.fwd_mask_info.q_sequence), cp.layout_index(512, 2))
    assert np.array_equal(np.asarray(k4.fwd_mask_info.q_sequence), cp.layout_index(512, 4))


@pytest.mark.slow
def test_context_parallel_attention_equals_unsharded_attention_with_windows_and_documents():
    """Outputs and q/k/v gradients of the all-gather attention at context 2, 4, 8 (XLA path, chunked
    queries, sliding windows shorter and longer than a chunk, full) and splash at context 2 (Pallas
    interpret mode: each device's query shard through its slice of the kernel's mask info) equal
    the unsharded attention's, with packed documents (fp32, 1e-6 relative)."""
    env = fast_compile.env(
        {
            **os.environ,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
            "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": REPO,
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.model.context_parallel_worker"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(result) == 11 and any(k.startswith("splash") for k in result)
    assert all(v <= 1e-6 for v in result.values()), result
