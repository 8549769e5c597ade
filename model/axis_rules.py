"""Logical partitioning rules: which mesh axis each logical axis name is laid on (a leaf module).

Every parameter is created with ``nn.with_logical_partitioning`` (logical names below) and
every large activation passes through ``nn.with_logical_constraint``; a ``ShardingConfig``
only says which mesh axis each logical name maps to. This module imports nothing from the
rest of ``model`` so that both the transformer (which takes a ``ShardingConfig``) and
``model.param_sharding`` (which derives per-parameter shardings from the transformer) can use it.

Logical parameter axes:
  ``layers`` (scanned block axis), ``vocab``, ``embed`` (d_model), ``heads`` (query heads),
  ``kv_heads``, ``head_dim``, ``mlp`` (SwiGLU hidden).
Logical activation axes:
  ``act_batch``, ``act_length``, ``act_embed``, ``act_heads``, ``act_kv_heads``, ``act_mlp``,
  ``act_vocab``.
"""

from __future__ import annotations

import dataclasses

MESH_AXES = ("data", "fsdp", "tensor")
# The sequence axis of context parallelism (model.context_parallel): in the mesh only when its size
# is above 1, between the batch axes and "tensor", so that a run without it is the program it was.
CONTEXT = "context"
CONTEXT_MESH_AXES = ("data", "fsdp", CONTEXT, "tensor")

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
                if axis not in CONTEXT_MESH_AXES:
                    raise ValueError(
                        f"ShardingConfig.{f.name}: unknown mesh axis {axis!r}; mesh axes are {CONTEXT_MESH_AXES}"
                    )

    @property
    def rules(self) -> tuple[tuple[str, MeshAxes], ...]:
        """Flax logical-axis rules, e.g. for ``nn.logical_axis_rules``."""
        return tuple((f.name, getattr(self, f.name)) for f in dataclasses.fields(self))
