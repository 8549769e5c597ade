"""The device mesh and host batches → global arrays.

Mesh axes ``("data", "fsdp", "tensor")`` (``model.MESH_AXES``) over every device of every
process, devices ordered by (process, id) so that process h's devices hold the contiguous
rows ``[h·G/H, (h+1)·G/H)`` of a global batch sharded over ``("data", "fsdp")`` — exactly the
loader's host slice (``dataloader.hosts.host_slice``). ``check_host_rows`` proves that at
start-up for this process instead of trusting it. With ``mesh.context`` > 1 the axes are
``("data", "fsdp", "context", "tensor")`` (``model.CONTEXT_MESH_AXES``) and a global batch arrives
with its rows over ``("data", "fsdp", "context")`` (``batch_axes``): each device reads whole rows,
so every process still feeds the contiguous, disjoint rows of its loader slice, and the context
axis may span hosts (v5p: 4 chips a host). The step then lays each row's positions out over its
batch shard's context devices (``trainer.step``: an all-to-all of the int32 inputs).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, TypeVar

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from contract.errors import Refused
from dataloader import hosts
from model import CONTEXT, CONTEXT_MESH_AXES, MESH_AXES
from trainer.config.schema import MeshConfig

BATCH_AXES = ("data", "fsdp")
ArrayT = TypeVar("ArrayT", np.ndarray, jax.Array)  # split_microbatches reshapes either kind
# A JAX pytree: the params, optimizer state or gradients (arrays, or ShapeDtypeStructs), or their
# shardings. JAX gives a pytree no static type, so to mypy it is Any; the name says which Any it is.
PyTree = Any
# Loader fields the model consumes (index/example stay on the host, for the data log).
MODEL_INPUTS = ("tokens", "segment_ids", "positions", "loss_mask")


class MeshError(Refused, ValueError):
    """The mesh does not fit the devices, or the global batch (or its microbatches) does not fit the
    mesh: a refused config (exit 2)."""


def resolve_shape(cfg: MeshConfig, n_devices: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) with at most one -1 filled in so the product is n_devices."""
    shape = [cfg.data, cfg.fsdp, cfg.tensor]
    free = [i for i, v in enumerate(shape) if v == -1]
    if len(free) > 1 or any(v == 0 or v < -1 for v in shape):
        raise MeshError(f"mesh {dict(zip(MESH_AXES, shape))}: each axis is a positive size, at most one is -1")
    fixed = math.prod(v for v in shape if v != -1)
    if free:
        if n_devices % fixed:
            raise MeshError(f"mesh {dict(zip(MESH_AXES, shape))} does not divide {n_devices} devices")
        shape[free[0]] = n_devices // fixed
    if math.prod(shape) != n_devices:
        raise MeshError(f"mesh {dict(zip(MESH_AXES, shape))} needs {math.prod(shape)} devices, there are {n_devices}")
    return shape[0], shape[1], shape[2]


def resolve_context_shape(cfg: MeshConfig, n_devices: int) -> tuple[int, ...]:
    """``resolve_shape``, with ``context`` (> 1) placed between fsdp and tensor: the other axes share
    the ``n_devices / context`` devices left."""
    if cfg.context == 1:
        return resolve_shape(cfg, n_devices)
    if n_devices % cfg.context:
        raise MeshError(f"mesh.context={cfg.context} does not divide {n_devices} devices")
    data, fsdp, tensor = resolve_shape(cfg, n_devices // cfg.context)
    return data, fsdp, cfg.context, tensor


def make_mesh(cfg: MeshConfig, devices: list | None = None) -> Mesh:
    devices = sorted(devices or jax.devices(), key=lambda d: (d.process_index, d.id))
    shape = resolve_context_shape(cfg, len(devices))
    return Mesh(np.asarray(devices, dtype=object).reshape(shape), MESH_AXES if len(shape) == 3 else CONTEXT_MESH_AXES)


def batch_axes(mesh: Mesh) -> tuple[str, ...]:
    """The axes a host batch's rows are split over: ("data", "fsdp"), and "context" when the mesh has it."""
    return (*BATCH_AXES, CONTEXT) if CONTEXT in mesh.shape else BATCH_AXES


def batch_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
    """Rows over the batch axes (``batch_axes``), other dims replicated (and replicated over "tensor")."""
    return NamedSharding(mesh, P(batch_axes(mesh), *([None] * (ndim - 1))))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, P())


def process_rows(mesh: Mesh, global_batch_size: int, seq_len: int, process_index: int) -> tuple[int, int]:
    """[start, stop) of the global-batch rows the devices of process ``process_index`` hold (any
    process of the mesh: ``trainer.compile`` checks every host of a topology it does not run on)."""
    index_map = batch_sharding(mesh).devices_indices_map((global_batch_size, seq_len))
    rows = [idx[0] for d, idx in index_map.items() if d.process_index == process_index]  # type: ignore[attr-defined]  # jaxlib's Device is opaque to mypy
    starts = [r.start or 0 for r in rows]
    stops = [global_batch_size if r.stop is None else r.stop for r in rows]
    spans = contiguous_spans(zip(starts, stops))
    if len(spans) != 1:
        raise MeshError(f"process {process_index}'s devices hold non-contiguous batch rows {spans}")
    return spans[0]


def contiguous_spans(intervals: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    """The union of [start, stop) intervals as sorted disjoint spans (devices that replicate a
    slice overlap): O(devices), not O(rows), so a huge global batch costs nothing to check."""
    spans: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if spans and a <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], b))
        else:
            spans.append((a, b))
    return spans


def check_host_rows(mesh: Mesh, global_batch_size: int, seq_len: int, process_index: int, process_count: int) -> None:
    """The rows process ``process_index`` feeds (the loader's host slice) are the rows its devices hold."""
    n_batch = batch_shards(mesh)
    if global_batch_size % n_batch:
        # with context parallelism each device reads whole rows (trainer.step lays them out): more
        # devices than rows (x tensor) leave some without a row
        why = "; with context parallelism every device reads whole rows: use fewer devices or more rows"
        why = why if CONTEXT in mesh.shape else ""
        raise MeshError(
            f"global_batch_size {global_batch_size} is not a multiple of the data x fsdp (x context) mesh size {n_batch}{why}"
        )
    try:
        want = hosts.host_slice(global_batch_size, process_index, process_count)  # checks the topology
    except ValueError as e:  # the process count does not divide the batch: a refusal like the others here
        raise MeshError(str(e)) from None
    have = process_rows(mesh, global_batch_size, seq_len, process_index)
    if want != have:
        raise MeshError(
            f"process {process_index}/{process_count}: the loader gives rows {want} of "
            f"each global batch but this process's devices hold rows {have}; the mesh "
            "must keep each process's devices contiguous along the batch axes"
        )


def batch_shards(mesh: Mesh) -> int:
    """D: the number of batch shards (the data x fsdp mesh size, x context when the mesh has it)."""
    return math.prod(mesh.shape[a] for a in batch_axes(mesh))


def check_microbatches(mesh: Mesh, global_batch_size: int, microbatches: int) -> None:
    """Each device's rows of the global batch split into ``microbatches`` equal parts (what
    ``split_microbatches`` needs, so that the split moves no data between devices)."""
    D = math.prod(mesh.shape[a] for a in BATCH_AXES)  # context parallelism splits after the layout (trainer.step)
    if global_batch_size % (D * microbatches):
        per_device = global_batch_size / D
        raise MeshError(
            f"global_batch_size {global_batch_size} does not split into microbatches={microbatches}: each of "
            f"the {D} batch shards (data x fsdp devices) holds {per_device:g} rows, not a multiple of "
            f"{microbatches}; choose microbatches dividing {per_device:g}, or another global_batch_size"
        )


def split_microbatches(x: ArrayT, microbatches: int, shards: int) -> ArrayT:
    """``[G, ...]`` → ``[N, G/N, ...]`` (numpy or jax): microbatch i holds, of every batch shard's
    ``G/D`` rows, the i-th run of ``m = G/(D·N)``, i.e. global rows ``d·G/D + i·m + j``
    (d < D, j < m). Each shard's rows stay on its device: ``[G] → [D, N, m] → [N, D, m] → [N, D·m]``
    with D, the sharded axis, kept major. Pure reshapes (check_microbatches first)."""
    G, rest = x.shape[0], x.shape[1:]
    m = G // (shards * microbatches)
    return x.reshape(shards, microbatches, m, *rest).swapaxes(0, 1).reshape(microbatches, shards * m, *rest)


def microbatch_sharding(mesh: Mesh, ndim: int) -> NamedSharding:
    """``[N, G/N, ...]`` microbatches: rows over the batch axes, the microbatch axis unsharded."""
    return NamedSharding(mesh, P(None, batch_axes(mesh), *([None] * (ndim - 2))))


def global_batch(
    batch: Mapping[str, np.ndarray], mesh: Mesh, global_batch_size: int, keys: tuple[str, ...] = MODEL_INPUTS
) -> dict[str, jax.Array]:
    """Host batch {key: [G/H, T]} → global jax arrays {key: [G, T]} sharded over the batch axes."""
    out = {}
    for key in keys:
        local = np.asarray(batch[key])
        shape = (global_batch_size, *local.shape[1:])
        out[key] = jax.make_array_from_process_local_data(batch_sharding(mesh, local.ndim), local, shape)
    return out


def abstract_like(tree: PyTree, shardings: PyTree) -> PyTree:
    """ShapeDtypeStructs of ``tree`` (arrays or ShapeDtypeStructs) carrying ``shardings``."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)
