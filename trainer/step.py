"""The jitted train and eval steps (global arrays in, global arrays out).

batch: {"tokens", "segment_ids", "positions", "loss_mask"} int32 [G, T], sharded over
("data", "fsdp"). Params / optimizer state keep the shardings they were created with.

With a ``context`` mesh axis (context parallelism, ``model.context_parallel``) the batch arrives
with whole rows per device (``mesh.batch_axes``) and is laid out on the device first, before any
microbatch split (``_laid_out``; an all-to-all of int32 arrays): the next-token
targets and their mask are taken in natural order, then tokens, positions, segment ids, targets
and mask are put in the zig-zag order together and split over ``context``; the chunked loss runs
over each device's own positions (``_context_hidden``). Loss sums are sums over positions, so the
order changes nothing but rounding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import model
from model import context_parallel as cp
from model.layers import Constrain
from model.transformer import Head
from trainer import loss as loss_lib
from trainer import mesh as mesh_lib
from trainer.mesh import PyTree
from trainer.optim import SkipStepState

# Name scopes of the step's phases (what bench.phases reads back from a profile's op names)
LOSS_SCOPE, ACCUMULATE_SCOPE, UPDATE_SCOPE = "lm_head_loss", "grad_accumulate", "optimizer_update"


def _forward(
    model_cfg: model.ModelConfig,
    sharding: model.ShardingConfig,
    mesh: jax.sharding.Mesh,
    document_masking: bool,
    loss_chunk: int,
    params: PyTree,
    batch: dict[str, jax.Array],
) -> loss_lib.LossSums:
    """The batch's loss sums: through ``loss_chunk``-position chunks of the LM head (0: full logits)."""
    if cp.context_size(mesh) > 1:  # the batch is laid out (_laid_out); the config refuses loss_chunk=0
        hidden, head, (targets, mask) = _context_hidden(model_cfg, sharding, mesh, params, batch)
        with jax.named_scope(LOSS_SCOPE):
            vocab = model_cfg.scored_vocab_size
            return loss_lib.chunked_loss_sums(hidden, head, vocab, targets, mask, loss_chunk, shifted=True)
    if loss_chunk:
        hidden, head = _final_hidden(model_cfg, sharding, mesh, document_masking, params, batch)
        with jax.named_scope(LOSS_SCOPE):
            return loss_lib.chunked_loss_sums(
                hidden, head, model_cfg.scored_vocab_size, batch["tokens"], batch["loss_mask"], loss_chunk
            )
    segment_ids, positions = _document_inputs(batch, document_masking)
    logits = model.forward(
        model_cfg, params, batch["tokens"], segment_ids, positions, sharding=sharding, mesh=mesh
    )  # float32 [G, T, V]
    return loss_lib.loss_sums(logits, batch["tokens"], batch["loss_mask"])


def _document_inputs(
    batch: dict[str, jax.Array], document_masking: bool
) -> tuple[jax.Array, jax.Array] | tuple[None, None]:
    """(segment_ids, positions) the model sees: the loader's, or none (attention across documents)."""
    return (batch["segment_ids"], batch["positions"]) if document_masking else (None, None)


def _final_hidden(
    model_cfg: model.ModelConfig,
    sharding: model.ShardingConfig,
    mesh: jax.sharding.Mesh,
    document_masking: bool,
    params: PyTree,
    batch: dict[str, jax.Array],
) -> tuple[jax.Array, Head]:
    """(final hidden states [G, T, D], the LM head): ``model.final_hidden`` of the batch."""
    segment_ids, positions = _document_inputs(batch, document_masking)
    return model.final_hidden(model_cfg, params, batch["tokens"], segment_ids, positions, sharding=sharding, mesh=mesh)


def _laid_out(batch: dict[str, jax.Array], mesh: jax.sharding.Mesh, document_masking: bool) -> dict[str, jax.Array]:
    """The model's inputs and the loss's targets of a batch ``[B, T]``, in the context layout and
    split over ``context``: tokens, positions (``arange(T)`` without document masking: the real
    ones either way), segment ids (with document masking), targets (token t+1) and target_mask
    (loss_mask at t+1; 0 at the last position), the last two taken before the reordering."""
    tokens, loss_mask = batch["tokens"], batch["loss_mask"]
    B, T = tokens.shape
    fields = {
        "tokens": tokens,
        "positions": batch["positions"]
        if document_masking
        else jnp.broadcast_to(jnp.arange(T, dtype=jnp.int32), (B, T)),
        "targets": jnp.pad(tokens[:, 1:], ((0, 0), (0, 1))),
        "target_mask": jnp.pad(loss_mask[:, 1:], ((0, 0), (0, 1))),
    }
    if document_masking:
        fields["segment_ids"] = batch["segment_ids"]
    split = NamedSharding(mesh, P(mesh_lib.BATCH_AXES, model.CONTEXT))
    C = cp.context_size(mesh)
    return {k: jax.lax.with_sharding_constraint(cp.to_layout(v, C), split) for k, v in fields.items()}


def _context_hidden(
    model_cfg: model.ModelConfig,
    sharding: model.ShardingConfig,
    mesh: jax.sharding.Mesh,
    params: PyTree,
    lay: dict[str, jax.Array],
) -> tuple[jax.Array, Head, tuple[jax.Array, jax.Array]]:
    """``_final_hidden`` under context parallelism, of a laid-out batch (``_laid_out``): (hidden
    states, LM head, (targets, target mask)) as ``cp.rows_of``'s ``[B·C, T/C]`` rows, each device's
    positions a row of their own, with the head's logits constrained to those rows (``cp.loss_rules``)."""
    hidden, head = model.final_hidden(
        model_cfg, params, lay["tokens"], lay.get("segment_ids"), lay["positions"], sharding=sharding, mesh=mesh
    )
    C = cp.context_size(mesh)
    rows = (*mesh_lib.BATCH_AXES, model.CONTEXT)
    hidden = jax.lax.with_sharding_constraint(cp.rows_of(hidden, C), NamedSharding(mesh, P(rows, None, None)))
    shifted = [
        jax.lax.with_sharding_constraint(cp.rows_of(lay[k], C), NamedSharding(mesh, P(rows, None)))
        for k in ("targets", "target_mask")
    ]
    head = dataclasses.replace(head, constrain_fn=Constrain(cp.loss_rules(sharding), mesh))
    return hidden, head, (shifted[0], shifted[1])


def _objective(
    model_cfg: model.ModelConfig,
    sharding: model.ShardingConfig,
    mesh: jax.sharding.Mesh,
    document_masking: bool,
    loss_chunk: int,
    params: PyTree,
    batch: dict[str, jax.Array],
    ce_weight: jax.Array,
    z_weight: jax.Array,
) -> tuple[jax.Array, loss_lib.LossSums]:
    """(``ce_weight · Σ ce + z_weight · Σ z``, the sums) with the fused chunked backward
    (``loss_backward: fused``, ``loss_chunk`` > 0): the sums are not differentiable, the objective is."""
    if cp.context_size(mesh) > 1:  # the batch is laid out (_laid_out)
        hidden, head, (targets, mask) = _context_hidden(model_cfg, sharding, mesh, params, batch)
        with jax.named_scope(LOSS_SCOPE):
            vocab = model_cfg.scored_vocab_size
            return loss_lib.fused_chunked_objective(
                hidden, head, vocab, targets, mask, loss_chunk, ce_weight, z_weight, shifted=True
            )
    hidden, head = _final_hidden(model_cfg, sharding, mesh, document_masking, params, batch)
    with jax.named_scope(LOSS_SCOPE):
        return loss_lib.fused_chunked_objective(
            hidden,
            head,
            model_cfg.scored_vocab_size,
            batch["tokens"],
            batch["loss_mask"],
            loss_chunk,
            ce_weight,
            z_weight,
        )


def split_batch(batch: dict[str, jax.Array], microbatches: int, mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """{key: [G, T]} → {key: [N, G/N, T]} (``mesh.split_microbatches``: no data leaves its device).
    A laid-out batch (context parallelism): its rows over data x fsdp, its positions over context."""
    if cp.context_size(mesh) > 1:
        shards = math.prod(mesh.shape[a] for a in mesh_lib.BATCH_AXES)
        spec = NamedSharding(mesh, P(None, mesh_lib.BATCH_AXES, model.CONTEXT))
        return {
            k: jax.lax.with_sharding_constraint(mesh_lib.split_microbatches(v, microbatches, shards), spec)
            for k, v in batch.items()
        }
    shards = mesh_lib.batch_shards(mesh)
    return {
        k: jax.lax.with_sharding_constraint(
            mesh_lib.split_microbatches(v, microbatches, shards), mesh_lib.microbatch_sharding(mesh, v.ndim + 1)
        )
        for k, v in batch.items()
    }


def _target_count(batch: dict[str, jax.Array]) -> jax.Array:
    """n: the batch's target tokens (``loss.target_tokens``; of a laid-out batch, its target mask's sum)."""
    if "target_mask" in batch:
        return jnp.maximum(batch["target_mask"].astype(jnp.float32).sum(), 1.0)
    return jnp.maximum(loss_lib.target_tokens(batch["loss_mask"]), 1.0)


def accumulate_gradients(
    objective_fn: Callable,
    z_loss: float,
    params: PyTree,
    batch: dict[str, jax.Array],
    microbatches: int,
    mesh: jax.sharding.Mesh,
    param_shardings: PyTree,
) -> tuple[loss_lib.LossSums, PyTree]:
    """(loss sums, gradient of the objective) of the whole batch, from ``microbatches`` parts;
    ``objective_fn(params, microbatch, n) -> (value, sums)``, value ``(Σ ce + z_loss · Σ z) / n``.

    The objective is a token-weighted mean, ``(Σ ce + z_loss · Σ z) / n`` with ``n`` the batch's
    target tokens (known from ``loss_mask`` before any forward pass), so it is the sum over
    microbatches of ``(ce_i + z_loss · z_i) / n``, and its gradient the sum of theirs: accumulated
    in float32 under ``lax.scan`` (one microbatch's activations live at a time). The split
    (``mesh.split_microbatches``) keeps every device's rows on it.
    """
    n = _target_count(batch)
    parts = split_batch(batch, microbatches, mesh)

    def scaled(p: PyTree, mb: dict[str, jax.Array]) -> tuple[jax.Array, loss_lib.LossSums]:
        return objective_fn(p, mb, n)

    def body(
        carry: tuple[PyTree, loss_lib.LossSums], mb: dict[str, jax.Array]
    ) -> tuple[tuple[PyTree, loss_lib.LossSums], None]:
        grad_acc, sums_acc = carry
        (_, sums), grads = jax.value_and_grad(scaled, has_aux=True)(params, mb)
        with jax.named_scope(ACCUMULATE_SCOPE):
            grad_acc = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_acc, grads)
            grad_acc = jax.lax.with_sharding_constraint(grad_acc, param_shardings)
        return (grad_acc, jax.tree.map(jnp.add, sums_acc, sums)), None

    zeros = jax.lax.with_sharding_constraint(
        jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params), param_shardings
    )
    zero = jnp.zeros([], jnp.float32)
    (grads, sums), _ = jax.lax.scan(body, (zeros, loss_lib.LossSums(zero, zero, zero)), parts)
    return sums, jax.tree.map(lambda g, p: g.astype(p.dtype), grads, params)


def make_train_step(
    model_cfg: model.ModelConfig,
    sharding: model.ShardingConfig,
    mesh: jax.sharding.Mesh,
    tx: optax.GradientTransformationExtraArgs,
    z_loss: float,
    param_shardings: PyTree,
    opt_shardings: PyTree,
    document_masking: bool = True,
    loss_chunk: int = 0,
    microbatches: int = 1,
    loss_backward: str = "recompute",
) -> Callable:
    """``step_fn(params, opt_state, lr float32 [], batch) -> (params, opt_state, metrics)``.

    lr: the update's learning rate, computed on the host (``trainer.optim.make_schedule``, OLMo-core's
    schedulers in float64) and passed in as float32: the update is ``params - lr * updates``.
    metrics (replicated float32 scalars): loss (cross-entropy per target token), z_loss,
    target_tokens, grad_norm (before clipping), skipped (1.0 if the skip step dropped it); the loop
    logs the learning rate itself (its float64 value).
    params and opt_state are donated. ``microbatches`` > 1: gradient accumulation
    (``accumulate_gradients``); the update is the whole batch's. ``loss_backward``: ``"fused"`` (with
    ``loss_chunk`` > 0) differentiates the loss by ``trainer.loss.fused_chunked_objective``,
    ``"recompute"`` by autodiff through the chunked sums (the config key's doc).
    """
    fused = loss_backward == "fused" and loss_chunk > 0

    def sums_fn(params: PyTree, batch: dict[str, jax.Array]) -> loss_lib.LossSums:
        return _forward(model_cfg, sharding, mesh, document_masking, loss_chunk, params, batch)

    def weighted_fn(params: PyTree, batch: dict[str, jax.Array], n: jax.Array) -> tuple[jax.Array, loss_lib.LossSums]:
        # (Σ ce + z_loss · Σ z) / n, and the sums
        if fused:
            args = (model_cfg, sharding, mesh, document_masking, loss_chunk, params, batch)
            return _objective(*args, 1.0 / n, z_loss / n)
        sums = sums_fn(params, batch)
        return (sums.ce + z_loss * sums.z) / n, sums

    def objective(params: PyTree, batch: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        if fused:
            value, sums = weighted_fn(params, batch, _target_count(batch))
            return value, loss_lib.objective(sums, z_loss)[1]
        return loss_lib.objective(sums_fn(params, batch), z_loss)

    def step_fn(
        params: PyTree, opt_state: PyTree, lr: jax.Array, batch: dict[str, jax.Array]
    ) -> tuple[PyTree, PyTree, dict[str, jax.Array]]:
        if cp.context_size(mesh) > 1:
            batch = _laid_out(batch, mesh, document_masking)
        if microbatches == 1:
            (_, parts), grads = jax.value_and_grad(objective, has_aux=True)(params, batch)
        else:
            sums, grads = accumulate_gradients(weighted_fn, z_loss, params, batch, microbatches, mesh, param_shardings)
            parts = loss_lib.objective(sums, z_loss)[1]
        with jax.named_scope(UPDATE_SCOPE):
            updates, opt_state = tx.update(grads, opt_state, params, loss=parts["loss"])
            lr = jnp.asarray(lr, jnp.float32)
            params = jax.tree.map(lambda p, u: (p - lr * u).astype(p.dtype), params, updates)
        skipped = opt_state.last_skipped if isinstance(opt_state, SkipStepState) else jnp.zeros([], bool)
        metrics = {
            **parts,
            "grad_norm": optax.tree.norm(grads),
            "skipped": skipped.astype(jnp.float32),
        }
        return params, opt_state, metrics

    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    return jax.jit(step_fn, donate_argnums=(0, 1), out_shardings=(param_shardings, opt_shardings, replicated))


def make_eval_step(
    model_cfg: model.ModelConfig,
    sharding: model.ShardingConfig,
    mesh: jax.sharding.Mesh,
    document_masking: bool = True,
    loss_chunk: int = 0,
    microbatches: int = 1,
) -> Callable:
    """``eval_fn(params, batch) -> LossSums`` (replicated scalars; PAD rows count nothing), summed
    over ``microbatches`` parts of the batch as the train step splits it (the same memory bound)."""

    def sums_fn(params: PyTree, batch: dict[str, jax.Array]) -> loss_lib.LossSums:
        return _forward(model_cfg, sharding, mesh, document_masking, loss_chunk, params, batch)

    def eval_fn(params: PyTree, batch: dict[str, jax.Array]) -> loss_lib.LossSums:
        if cp.context_size(mesh) > 1:
            batch = _laid_out(batch, mesh, document_masking)
        if microbatches == 1:
            return sums_fn(params, batch)
        zero = jnp.zeros([], jnp.float32)
        sums, _ = jax.lax.scan(
            lambda acc, mb: (jax.tree.map(jnp.add, acc, sums_fn(params, mb)), None),
            loss_lib.LossSums(zero, zero, zero),
            split_batch(batch, microbatches, mesh),
        )
        return sums

    return jax.jit(eval_fn, out_shardings=jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec()))
