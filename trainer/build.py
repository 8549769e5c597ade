"""What a run builds from its config and devices: the model config, mesh, optimizer, shardings and
the jitted train and eval steps. Nothing is allocated here.

One builder for both users: ``trainer.loop.train`` (``build(checked)``: the start-up's
``trainer.startup.Checked``, its model config and mesh) and ``trainer.compile`` and the benches
(``build(cfg, devices, platform)``: compile-only devices of a TPU topology description, on any
machine), so the step a topology is checked for is the step a run executes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import optax

import model
from trainer import mesh as mesh_lib
from trainer import optim
from trainer.config.schema import TrainConfig
from trainer.mesh import PyTree
from trainer.startup import Checked
from trainer.step import make_eval_step, make_train_step


@dataclasses.dataclass(frozen=True)
class Built:
    """Everything derived from the config and the devices (no parameters allocated)."""

    model_cfg: model.ModelConfig
    mesh: jax.sharding.Mesh
    tx: optax.GradientTransformationExtraArgs
    schedule: optim.Schedule  # update step (0-based) -> its learning rate, a Python float
    param_shardings: PyTree
    opt_shardings: PyTree
    train_step: Any  # jitted (params, opt_state, lr float32 [], batch) -> (params, opt_state, metrics)
    eval_step: Any  # jitted (params, batch) -> LossSums

    def abstract_state(self) -> tuple[PyTree, PyTree]:
        """ShapeDtypeStructs (with shardings) of params and optimizer state."""
        params = mesh_lib.abstract_like(model.abstract_params(self.model_cfg), self.param_shardings)
        return params, mesh_lib.abstract_like(jax.eval_shape(self.tx.init, params), self.opt_shardings)

    def init_state(self, rng: jax.Array) -> tuple[PyTree, PyTree]:
        """Fresh params and optimizer state, created sharded (a fresh run; bench.mfu)."""
        params = jax.jit(lambda k: model.init(self.model_cfg, k), out_shardings=self.param_shardings)(rng)
        return params, jax.jit(self.tx.init, out_shardings=self.opt_shardings)(params)

    def abstract_batch(self, global_batch_size: int, seq_len: int) -> dict[str, jax.ShapeDtypeStruct]:
        """The model inputs of one global batch, int32 ``[G, T]`` sharded over the batch axes, as
        ``mesh.global_batch`` makes them."""
        sharding = mesh_lib.batch_sharding(self.mesh)
        return {
            k: jax.ShapeDtypeStruct((global_batch_size, seq_len), jnp.int32, sharding=sharding)
            for k in mesh_lib.MODEL_INPUTS
        }


def build(source: TrainConfig | Checked, devices: list | None = None, platform: str | None = None) -> Built:
    """source: a run's ``Checked`` (its resolved model config and mesh, as the start-up checked
    them), or a config alone (no data: ``trainer.compile``, the benches). devices: the mesh's
    devices (default: ``jax.devices()``); platform: where the step will run (default: those
    devices' platform); both for a config only."""
    if isinstance(source, Checked):
        cfg, model_cfg, mesh = source.cfg, source.model_cfg, source.mesh
    else:
        devices = devices or jax.devices()
        cfg = source  # no start-up: "auto" attention resolved here, once, for `platform`
        model_cfg = model.attention.resolved(cfg.model_cfg(), platform or devices[0].platform)
        mesh = mesh_lib.make_mesh(cfg.mesh, devices)
    # context parallelism's rules only with its axis: without it, the rules (and program) as before
    sharding = model.ShardingConfig() if cfg.mesh.context == 1 else model.context_parallel.sharding_config()
    tx, schedule = optim.make_optimizer(cfg), optim.make_schedule(cfg)
    param_sh = model.param_shardings(model_cfg, mesh, sharding)
    opt_sh = optax_shardings(tx, jax.eval_shape(tx.init, model.abstract_params(model_cfg)), param_sh, mesh)
    return Built(
        model_cfg,
        mesh,
        tx,
        schedule,
        param_sh,
        opt_sh,
        make_train_step(
            model_cfg,
            sharding,
            mesh,
            tx,
            cfg.z_loss,
            param_sh,
            opt_sh,
            cfg.document_masking,
            cfg.loss_chunk,
            cfg.microbatches,
            loss_backward=cfg.loss_backward,
        ),
        make_eval_step(model_cfg, sharding, mesh, cfg.document_masking, cfg.loss_chunk, cfg.microbatches),
    )


def optax_shardings(
    tx: optax.GradientTransformation, abstract_opt: PyTree, param_sh: PyTree, mesh: jax.sharding.Mesh
) -> PyTree:
    """Shardings of the optimizer state: param-shaped subtrees follow the params, the rest
    (counts, skip-step buffers) is replicated."""
    replicated = mesh_lib.replicated(mesh)
    return optax.tree_map_params(tx, lambda _, s: s, abstract_opt, param_sh, transform_non_params=lambda _: replicated)
