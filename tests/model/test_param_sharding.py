"""Partition specs cover every parameter, divide its shape, and a sharded forward matches."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import pytest
from jax.sharding import PartitionSpec

import model
from tests import fast_compile
from tests.model.tiny import tiny_config

TOY_MESH = {"data": 2, "fsdp": 4, "tensor": 2}
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _axes(entry):
    return () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)


@pytest.mark.parametrize(
    "cfg", [model.get_config("olmo3-7b"), model.get_config("olmo3-7b-mxu"), tiny_config()], ids=["7b", "7b-mxu", "tiny"]
)
def test_partition_specs_cover_every_leaf_and_divide_its_shape(cfg):
    shapes = model.abstract_params(cfg)
    specs = model.param_partition_specs(cfg, model.ShardingConfig())
    is_spec = lambda x: isinstance(x, PartitionSpec)
    assert jax.tree.structure(specs, is_leaf=is_spec) == jax.tree.structure(shapes)
    sharded_dims = 0
    for spec, shape in zip(jax.tree.leaves(specs, is_leaf=is_spec), jax.tree.leaves(shapes)):
        assert len(spec) == len(shape.shape), (spec, shape.shape)
        used = [a for entry in spec for a in _axes(entry)]
        assert len(used) == len(set(used)) and set(used) <= set(model.MESH_AXES), spec
        for entry, dim in zip(spec, shape.shape):
            ways = math.prod(TOY_MESH[a] for a in _axes(entry))
            assert dim % ways == 0, (spec, shape.shape)
            sharded_dims += ways > 1
    assert sharded_dims > 0
    # the stacked layer axis is never sharded; every big matrix is sharded over fsdp
    layer_specs = jax.tree.leaves(specs["layers"], is_leaf=is_spec)
    assert all(s[0] is None for s in layer_specs)
    assert specs["embed"]["embedding"] == PartitionSpec("tensor", "fsdp")
    assert specs["layers"]["mlp"]["gate_proj"] == PartitionSpec(None, "fsdp", "tensor")


def test_indivisible_layout_is_a_clear_error():
    cfg = model.get_config("olmo3-7b")  # vocab 100278 = 2 · 3 · 16713
    model.check_divisible(cfg, {"data": 1, "fsdp": 8, "tensor": 2})
    with pytest.raises(ValueError, match="vocab_pad_multiple"):
        model.check_divisible(cfg, {"data": 1, "fsdp": 8, "tensor": 4})
    model.check_divisible(model.get_config("olmo3-7b", vocab_pad_multiple=128), {"data": 1, "fsdp": 8, "tensor": 4})


def test_sharding_rules_can_be_changed_and_are_validated():
    pure_fsdp = model.ShardingConfig(vocab=None, heads=None, kv_heads=None, mlp=None)
    specs = model.param_partition_specs(tiny_config(), pure_fsdp)
    assert specs["layers"]["attn"]["q_proj"] == PartitionSpec(None, "fsdp", None, None)
    with pytest.raises(ValueError):
        model.ShardingConfig(embed="model")


@pytest.mark.slow
def test_sharded_init_and_forward_match_single_device():
    # sharded and single-device sides both computed in that one process (tests/fast_compile.py)
    env = fast_compile.env(
        {
            **os.environ,
            "XLA_FLAGS": "--xla_force_host_platform_device_count=8",
            "JAX_PLATFORMS": "cpu",
            "PYTHONPATH": REPO,
        }
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tests.model.sharded_forward"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["same_init"]  # sharded init draws the same weights as single-device init
    L, D, H, hd = result["q_shape"]
    assert result["local_q_shape"] == [L, D // 2, H // 2, hd]  # really laid out over fsdp x tensor
    assert "data" in result["out_spec"] and "fsdp" in result["out_spec"]
    assert result["max_abs_diff"] <= 1e-4 * max(1.0, result["max_abs"]), result
    # splash inside shard_map (rows over data x fsdp, kv heads over tensor) vs single-device xla
    assert result["splash_in_shard_map"]
    assert result["splash_logits_rel"] <= 1e-5 and result["splash_grads_rel"] <= 1e-5, result
