"""Owns the checks that need no run directory (data, model, plan, mesh, topology, attention), once → ``Checked``.

    checked = check(cfg)                      # every data/model/plan/mesh check, once (trainer.preflight)
    built = build(checked)                    # trainer.build: mesh, optimizer, shardings, jitted steps
    evaluators = make_evaluators(checked, built, h, H)   # trainer.evaluators: the periodic evaluations

Each step takes the one before's result and re-derives nothing: startup ← build ← evaluators ← loop.
``attention_impl: auto`` is resolved here, once, for the devices' platform (``Checked.model_cfg``;
``Checked.attention_configured`` keeps the configured value), and the hosts' topology is checked
here, once (``check_layout``: each process's loader slice is its devices' rows).

``check`` raises the refusal of the first check that fails (DataContractError, ManifestError,
MeshError, StartRefused: all ``contract.Refused``, exit 2); ``trainer.preflight.prepare``
runs it on every process and agrees on the outcome before the run directory is touched, and
``trainer.loop.train`` takes only its result (it checks nothing again).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import jax

import model
from contract.errors import Refused
from dataloader import LoaderConfig
from dataloader.plan import Plan
from trainer import data_contract
from trainer import mesh as mesh_lib
from trainer import trackers as trackers_lib
from trainer.config.schema import TrainConfig
from trainer.downstream.check import check_downstream as check_files
from trainer.downstream.clean import contaminated_instances
from trainer.downstream.evaluator import check_tasks

if TYPE_CHECKING:
    from contract import Manifest
    from contract.downstream import DownstreamTasks


class StartRefused(Refused, ValueError):
    """The run cannot start as configured here (exit 2); nothing was written."""


@dataclasses.dataclass(frozen=True)
class Checked:
    """What the start-up checks found, for everything after them (frozen: nothing re-derives it)."""

    cfg: TrainConfig
    manifests: tuple[Manifest, ...]  # loaded once, fingerprints recomputed (trainer.data_contract.load_manifests)
    loader_cfg: LoaderConfig  # the training loader's config
    plan: Plan  # its plan, built once from `manifests` (check_plan); the loader and the memory check take it
    seq_len: int  # the manifests' (equal to cfg.seq_len when set)
    model_cfg: model.ModelConfig  # cfg.model_cfg(), attention_impl resolved for `platform`
    attention_configured: str  # attention_impl as configured ("auto" before resolving)
    platform: str  # where the step runs ("tpu", "cpu", "gpu")
    mesh: jax.sharding.Mesh  # cfg.mesh over the devices; holds each process's loader rows
    eval_labels: tuple[str, ...]  # the held-out sets evaluated (empty when eval.every=0)
    downstream_tasks: DownstreamTasks | None = None  # the frozen task instances (None: downstream.every=0)
    # downstream.clean_from's instances found in this run's data, per task (None: not set)
    contaminated: dict[str, set[int]] | None = None

    @property
    def attention_impl(self) -> str:
        """ "xla" or "splash": the implementation this run computes attention with."""
        return self.model_cfg.attention_impl


def check(cfg: TrainConfig, devices: list | None = None, platform: str | None = None) -> Checked:
    """Every start-up check that needs no run directory, once: the manifests fit the model and
    each other, held-out data exists for evaluation and its sets are known, the trackers are
    installed, the loader's plan builds, the mesh fits the devices, the global batch and its
    microbatches, and the attention kernel runs the data's seq_len. devices: the mesh's (default
    ``jax.devices()``); platform: where the step runs (default: those devices')."""
    manifests = tuple(data_contract.load_manifests(cfg.data))  # the run's one read of its manifests
    devices = devices or jax.devices()
    platform = platform or devices[0].platform
    configured = cfg.model_cfg()  # the start-up's one ModelConfig: as configured, then resolved for platform
    model_cfg = model.attention.resolved(configured, platform)  # the run's one resolution of "auto"
    seq_len, _ = data_contract.check_data(manifests, model_cfg, cfg.seq_len)
    data_contract.check_heldout_for_eval(manifests, cfg.eval.every)  # before step 0, not at step eval.every
    eval_labels = tuple(data_contract.check_eval_sets(manifests, cfg.eval.sets)) if cfg.eval.every else ()
    try:
        trackers_lib.check_installed(cfg.log)
    except ValueError as e:
        raise StartRefused(str(e)) from None
    G = cfg.global_batch_size
    loader_cfg = LoaderConfig(
        data=cfg.data, global_batch_size=G, seed=cfg.seed, split="train", weights=cfg.data_weights, order=cfg.data_order
    )
    plan = data_contract.check_plan(loader_cfg, manifests)  # data_weights etc., before the run dir is written
    try:
        mesh = mesh_lib.make_mesh(cfg.mesh, devices)
        check_layout(cfg, mesh, seq_len, [jax.process_index()], jax.process_count())
    except mesh_lib.MeshError as e:
        raise mesh_lib.MeshError(f"{mesh_text(cfg, len(devices))}: {e}") from None
    check_attention(model_cfg, platform, seq_len)
    downstream_tasks = check_downstream(cfg, manifests, model_cfg, seq_len)
    contaminated = check_clean_from(cfg, manifests, downstream_tasks)
    return Checked(
        cfg,
        manifests,
        loader_cfg,
        plan,
        seq_len,
        model_cfg,
        configured.attention_impl,
        platform,
        mesh,
        eval_labels,
        downstream_tasks,
        contaminated,
    )


def check_downstream(
    cfg: TrainConfig, manifests: tuple[Manifest, ...], model_cfg: model.ModelConfig, seq_len: int
) -> DownstreamTasks | None:
    """The recipe's downstream tasks, loaded and checked against the run (its folder holds them,
    built for this seq_len, tokenizer and vocabulary); None when downstream.every is 0. A
    refusal is one line naming the folder and the command that builds it (exit 2)."""
    tasks = check_files(cfg.downstream, model_ctx_len=seq_len, tokenizer=manifests[0].tokenizer)
    if tasks is not None:
        check_tasks(tasks, model_cfg, seq_len)
    return tasks


def check_clean_from(
    cfg: TrainConfig, manifests: tuple[Manifest, ...], tasks: DownstreamTasks | None
) -> dict[str, set[int]] | None:
    """``downstream.clean_from``'s instances, read before the run directory is touched: refused
    (one line, exit 2) unless that audit ran check 8 on the run's own data (its manifests'
    fingerprints) and task files; None when it is not set or downstream evaluation is off."""
    if tasks is None or not cfg.downstream.clean_from:
        return None
    return contaminated_instances(cfg.downstream.clean_from, tasks, [m.fingerprint for m in manifests])


def check_layout(
    cfg: TrainConfig, mesh: jax.sharding.Mesh, seq_len: int, processes: list[int], process_count: int
) -> None:
    """The hosts' topology, the one place it is checked: ``process_count`` divides the global batch
    and each of ``processes``' devices hold its loader rows (``dataloader.hosts``' slice), and each
    device's rows split into the microbatches (MeshError otherwise). A run checks its own process;
    ``trainer.compile`` every host of the topology."""
    for h in processes:
        mesh_lib.check_host_rows(mesh, cfg.global_batch_size, seq_len, h, process_count)
    mesh_lib.check_microbatches(mesh, cfg.global_batch_size, cfg.microbatches)
    try:  # context parallelism's layout (checked at load when the config sets seq_len; here the data's)
        model.context_parallel.check(seq_len, model.context_parallel.context_size(mesh))
    except ValueError as e:
        raise mesh_lib.MeshError(str(e)) from None


def mesh_text(cfg: TrainConfig, device_count: int | None = None) -> str:
    """The mesh, batch and devices a mesh refusal is about (its message's start)."""
    m = cfg.mesh
    return (
        f"mesh {m.data}×{m.fsdp}×{m.tensor} (data×fsdp×tensor) with global_batch_size={cfg.global_batch_size} "
        f"on {device_count or jax.device_count()} device(s) of {jax.process_count()} process(es)"
    )


def check_attention(model_cfg: model.ModelConfig, platform: str, seq_len: int) -> None:
    """The resolved attention implementation runs on ``platform`` at the data's ``seq_len`` (splash
    block sizes, attention_chunk; splash on GPU refused): a DataContractError naming the model
    field (exit 2), before step 0."""
    try:
        # a resolved value is kept as it is: this only refuses splash on GPU
        model.attention.resolve_impl(model_cfg.attention_impl, platform)
        model.attention.check_seq_len(model_cfg, seq_len, model_cfg.attention_impl)
    except ValueError as e:
        raise data_contract.DataContractError(
            f"the model config cannot run this data (seq_len {seq_len}): {e}"
        ) from None
