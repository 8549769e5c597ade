"""Context parallelism in the trainer: ``mesh.context`` (config refusals, the mesh) and the
training objective's loss and gradients at context 1, 2, 4, 8 (8 CPU devices in a subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import jax
import pytest

from tests import fast_compile
from tests.trainer.conftest import ROOT
from trainer import mesh as mesh_lib
from trainer.config.loading import ConfigError
from trainer.config.schema import MeshConfig, load_config

TINY = str(ROOT / "trainer/configs/tiny.yaml")


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["mesh.context=8", "seq_len=72"], "needs seq_len divisible by 2 x context = 16"),
        (["mesh.context=2", "seq_len=64", "loss_chunk=0"], "loss_chunk=0"),
        (["mesh.context=2", "seq_len=64", "model_overrides={seq_chunk: 16}"], "seq_chunk"),
        (["mesh.context=2", "model_overrides={splash_kernel: tokamax, splash_fused_bwd: true}"], "JAX's splash kernel"),
        (["mesh.context=0"], "mesh.context"),
    ],
)
def test_what_context_parallelism_cannot_run_is_refused_at_load(overrides, message):
    with pytest.raises(ConfigError, match=message) as e:
        load_config(TINY, overrides)
    assert "\n" not in str(e.value)


def test_context_1_is_not_recorded_and_adds_no_mesh_axis():
    """The default leaves the recorded config and the mesh as they were (so the program too)."""
    cfg = load_config(TINY)
    assert "context" not in cfg.to_dict()["mesh"]
    assert mesh_lib.resolve_context_shape(cfg.mesh, 8) == (1, 8, 1)
    assert mesh_lib.make_mesh(cfg.mesh, jax.devices()[:1]).axis_names == ("data", "fsdp", "tensor")
    assert load_config(TINY, ["mesh.context=2", "seq_len=64"]).to_dict()["mesh"]["context"] == 2


def test_context_axis_sits_between_the_batch_axes_and_tensor():
    assert mesh_lib.resolve_context_shape(MeshConfig(context=4, tensor=2), 64) == (1, 8, 4, 2)
    with pytest.raises(mesh_lib.MeshError, match="does not divide 6 devices"):
        mesh_lib.resolve_context_shape(MeshConfig(context=4), 6)


@pytest.mark.ci_extra  # 40 s of make test's 12 min (715.9 s with it): CI runs it in make test-extra
@pytest.mark.slow
def test_context_1_2_4_8_give_the_same_loss_and_gradients():
    """The tiny OLMo 3 (a sliding and a full layer, window 8, packed documents and PAD tails, fp32)
    on the same 8 CPU devices as fsdp 8, 4 x context 2, 2 x 4, 1 x 8: the training objective and
    its gradient (the fused chunked backward the train step runs; at context 8 the autodiff one
    too) within 1e-6 relative of context 1's (the loss; each gradient leaf's ||Δ|| / ||g||); also
    with microbatches=2 (the train step's logged loss too) and without document masking (positions 0..T-1, laid out with their tokens). A
    checkpoint's params and optimizer state saved at context 1 restore onto context 2 unchanged."""
    env = fast_compile.env(
        {
            **os.environ,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
            "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": str(ROOT),
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.trainer.context_parallel_worker"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    runs = result["runs"]
    assert [r["mesh"].get("context") for r in runs.values()] == [2, 4, 8, 2, 4]
    assert runs["context=2 microbatches=2"]["microbatches"] == 2
    assert "grad_autodiff" in runs["context=8"] and "step_loss" in runs["context=2 microbatches=2"]
    assert result["resume"]["equal"] and result["resume"]["context_2_shardings"] and result["resume"]["arrays"] > 10
    for name, r in runs.items():
        diffs = {k: v for k, v in r.items() if k not in ("mesh", "microbatches")}
        assert all(v <= 1e-6 for v in diffs.values()), (name, diffs)
