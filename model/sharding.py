"""Logical axes → mesh axes ``("data", "fsdp", "tensor")``, via Flax's logical partitioning.

Every parameter is created with ``nn.with_logical_partitioning`` (logical names below) and
every large activation passes through ``nn.with_logical_constraint``; a ``ShardingConfig``
only says which mesh axis each logical name maps to. Nothing here allocates parameters.

Logical parameter axes:
  ``layers`` (scanned block axis), ``vocab``, ``embed`` (d_model), ``heads`` (query heads),
  ``kv_heads``, ``head_dim``, ``mlp`` (SwiGLU hidden).
Logical activation axes:
  ``act_batch``, ``act_length``, ``act_embed``, ``act_heads``, ``act_kv_heads``, ``act_mlp``,
  ``act_vocab``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
from jax.sharding import PartitionSpec

from model.config import ModelConfig

MESH_AXES = ("data", "fsdp", "tensor")

MeshAxes = str | tuple[str, ...] | None


@dataclasses.dataclass(frozen=True)
class ShardingConfig:
    """Which mesh axis (or axes, or None = replicated) each logical axis is laid on.

    Defaults: FSDP shards every weight along ``embed`` over ``fsdp``; tensor parallelism
    splits heads, MLP width and vocabulary over ``tensor``; the batch is split over
    ``data`` and ``fsdp``. The scanned ``layers`` axis and ``head_dim`` are never sharded.
    """

    layers: MeshAxes = None
    vocab: MeshAxes = "tensor"
    embed: MeshAxes = "fsdp"
    heads: MeshAxes = "tensor"
    kv_heads: MeshAxes = "tensor"
    head_dim: MeshAxes = None
    mlp: MeshAxes = "tensor"
    act_batch: MeshAxes = ("data", "fsdp")
    act_length: MeshAxes = None
    act_embed: MeshAxes = None
    act_heads: MeshAxes = "tensor"
    act_kv_heads: MeshAxes = "tensor"
    act_mlp: MeshAxes = "tensor"
    act_vocab: MeshAxes = "tensor"

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            axes = (value,) if isinstance(value, str) else (value or ())
            if isinstance(value, list):
                object.__setattr__(self, f.name, tuple(value))
            for axis in axes:
                if axis not in MESH_AXES:
                    raise ValueError(f"ShardingConfig.{f.name}: unknown mesh axis {axis!r}; mesh axes are {MESH_AXES}")

    @property
    def rules(self) -> tuple[tuple[str, MeshAxes], ...]:
        """Flax logical-axis rules, e.g. for ``nn.logical_axis_rules``."""
        return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))


def logical_param_axes(cfg: ModelConfig) -> Any:
    """Pytree (matching ``init``) of tuples of logical axis names, one per array dimension."""
    from model.transformer import abstract_boxed_params  # local import: avoids a cycle

    boxed = abstract_boxed_params(cfg)
    return jax.tree.map(
        lambda x: tuple(x.names), boxed, is_leaf=lambda x: isinstance(x, nn.Partitioned)
    )


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
    from model.transformer import abstract_params  # local import: avoids a cycle

    specs = param_partition_specs(cfg, sharding)
    is_spec = lambda x: isinstance(x, PartitionSpec)  # noqa: E731
    flat_specs = jax.tree_util.tree_flatten_with_path(specs, is_leaf=is_spec)[0]
    for (path, spec), shape in zip(flat_specs, jax.tree.leaves(abstract_params(cfg))):
        for dim, entry in zip(shape.shape, spec):
            ways = _ways(entry, mesh_shape)
            if dim % ways:
                hint = (" (set vocab_pad_multiple=128 in the model config)"
                        if dim == cfg.vocab_size else "")
                raise ValueError(f"parameter {jax.tree_util.keystr(path)} {shape.shape}: dimension {dim} "
                                 f"does not split {ways} ways over mesh axes {entry}{hint}")


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
