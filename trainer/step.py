"""The jitted train and eval steps (global arrays in, global arrays out).

batch: {"tokens", "segment_ids", "positions", "loss_mask"} int32 [G, T], sharded over
("data", "fsdp"). Params / optimizer state keep the shardings they were created with.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

import model
from trainer import loss as loss_lib
from trainer.optim import SkipStepState


def _forward(model_cfg: model.ModelConfig, sharding: model.ShardingConfig, mesh: jax.sharding.Mesh,
             document_masking: bool, params: Any, batch: dict[str, jax.Array]) -> loss_lib.LossSums:
    segment_ids, positions = (batch["segment_ids"], batch["positions"]) if document_masking else (None, None)
    logits = model.forward(model_cfg, params, batch["tokens"], segment_ids, positions,
                           sharding=sharding, mesh=mesh)  # float32 [G, T, V]
    return loss_lib.loss_sums(logits, batch["tokens"], batch["loss_mask"])


def make_train_step(model_cfg: model.ModelConfig, sharding: model.ShardingConfig, mesh: jax.sharding.Mesh,
                    tx: optax.GradientTransformationExtraArgs, schedule: optax.Schedule, z_loss: float,
                    param_shardings: Any, opt_shardings: Any, document_masking: bool = True) -> Callable:
    """``step_fn(params, opt_state, step int32 [], batch) -> (params, opt_state, metrics)``.

    metrics (replicated float32 scalars): loss (cross-entropy per target token), z_loss,
    target_tokens, grad_norm (before clipping), lr, skipped (1.0 if the skip step dropped it).
    params and opt_state are donated.
    """

    def objective(params, batch):
        sums = _forward(model_cfg, sharding, mesh, document_masking, params, batch)
        return loss_lib.objective(sums, z_loss)

    def step_fn(params, opt_state, step, batch):
        (_, parts), grads = jax.value_and_grad(objective, has_aux=True)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params, loss=parts["loss"])
        lr = schedule(step)
        params = jax.tree.map(lambda p, u: (p - lr * u).astype(p.dtype), params, updates)
        skipped = opt_state.last_skipped if isinstance(opt_state, SkipStepState) else jnp.zeros([], bool)
        metrics = {**parts, "grad_norm": optax.tree.norm(grads), "lr": jnp.asarray(lr, jnp.float32),
                   "skipped": skipped.astype(jnp.float32)}
        return params, opt_state, metrics

    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(step_fn, donate_argnums=(0, 1),
                   out_shardings=(param_shardings, opt_shardings, replicated))


def make_eval_step(model_cfg: model.ModelConfig, sharding: model.ShardingConfig,
                   mesh: jax.sharding.Mesh, document_masking: bool = True) -> Callable:
    """``eval_fn(params, batch) -> LossSums`` (replicated scalars; PAD rows count nothing)."""
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(lambda params, batch: _forward(model_cfg, sharding, mesh, document_masking, params, batch),
                   out_shardings=replicated)
