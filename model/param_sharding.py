"""Per-parameter partition specs and shardings over the mesh ``("data", "fsdp", "tensor")``.

The logical axis names and the ``ShardingConfig`` that maps them to mesh axes live in
``model.axis_rules`` (a leaf module); this module applies them to the transformer's
parameters. Nothing here allocates parameters.
"""

from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec

from model.axis_rules import MESH_AXES, MeshAxes, ShardingConfig
from model.config import ModelConfig
from model.transformer import abstract_boxed_params, abstract_params

__all__ = [
    "MESH_AXES",
    "ShardingConfig",
    "check_divisible",
    "logical_param_axes",
    "param_partition_specs",
    "param_shardings",
]


def logical_param_axes(cfg: ModelConfig) -> Any:
    """Pytree (matching ``init``) of tuples of logical axis names, one per array dimension."""
    boxed = abstract_boxed_params(cfg)
    return jax.tree.map(lambda x: tuple(x.names), boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned))


def param_partition_specs(cfg: ModelConfig, sharding: ShardingConfig | None = None) -> Any:
    """Pytree (matching ``init(cfg, rng)``) of ``PartitionSpec`` over ``MESH_AXES``.

    Built without allocating parameters (``jax.eval_shape``), so it is cheap for 7B.
    """
    sharding = sharding or ShardingConfig()
    return jax.tree.map(
        lambda names: nn.logical_to_mesh_axes(names, sharding.rules),
        logical_param_axes(cfg),
        is_leaf=lambda x: isinstance(x, tuple),
    )


def _ways(entry: MeshAxes, mesh_shape: dict[str, int]) -> int:
    axes = () if entry is None else (entry,) if isinstance(entry, str) else entry
    return math.prod(mesh_shape[a] for a in axes)


def check_divisible(cfg: ModelConfig, mesh_shape: dict[str, int], sharding: ShardingConfig | None = None) -> None:
    """Raise a clear ValueError if some parameter dimension does not split evenly over its mesh axes."""
    specs = param_partition_specs(cfg, sharding)
    is_spec = lambda x: isinstance(x, PartitionSpec)
    flat_specs = jax.tree_util.tree_flatten_with_path(specs, is_leaf=is_spec)[0]
    for (path, spec), shape in zip(flat_specs, jax.tree.leaves(abstract_params(cfg))):
        for dim, entry in zip(shape.shape, spec):
            ways = _ways(entry, mesh_shape)
            if dim % ways:
                hint = " (set vocab_pad_multiple=128 in the model config)" if dim == cfg.vocab_size else ""
                raise ValueError(
                    f"parameter {jax.tree_util.keystr(path)} {shape.shape}: dimension {dim} "
                    f"does not split {ways} ways over mesh axes {entry}{hint}"
                )


def param_shardings(cfg: ModelConfig, mesh: jax.sharding.Mesh, sharding: ShardingConfig | None = None) -> Any:
    """``NamedSharding`` per parameter, e.g. for ``jax.jit(init, out_shardings=...)``.

    Raises ValueError (naming the parameter) if a dimension does not divide over its mesh axes.
    """
    check_divisible(cfg, dict(mesh.shape), sharding)
    return jax.tree.map(
        lambda spec: jax.sharding.NamedSharding(mesh, spec),
        param_partition_specs(cfg, sharding),
        is_leaf=lambda x: isinstance(x, PartitionSpec),
    )
