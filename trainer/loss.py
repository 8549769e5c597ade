"""Next-token cross-entropy with z-loss, in float32, over the loader's ``loss_mask``.

Position t predicts token t+1: logits ``[:, :-1]`` are scored against ``tokens[:, 1:]`` where
``loss_mask[:, 1:]`` is 1 (a PAD target never counts; the token after an EOS is a normal target,
as in OLMo's packed training).

Two ways to the same sums: ``loss_sums`` from the full float32 logits ``[B, T, V]``, and
``chunked_loss_sums`` from the final hidden states, running the LM head over ``chunk``
positions at a time so that only ``[B, chunk, V]`` logits exist at once (Levanter's blockwise
cross-entropy, MaxText's vocab tiling); same value and gradient up to float rounding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp


class LossSums(NamedTuple):
    """Sums over the masked target tokens of a batch (float32 scalars)."""

    ce: jax.Array  # sum of cross-entropy
    z: jax.Array  # sum of logsumexp**2
    tokens: jax.Array  # number of target tokens counted


def loss_sums(logits: jax.Array, tokens: jax.Array, loss_mask: jax.Array) -> LossSums:
    """Sums for logits [B, T, V], tokens [B, T] int32 and loss_mask [B, T] (0/1)."""
    logits = logits[:, :-1].astype(jnp.float32)  # [B, T-1, V]
    targets = tokens[:, 1:]  # [B, T-1]
    mask = loss_mask[:, 1:].astype(jnp.float32)  # [B, T-1]
    lse = jax.nn.logsumexp(logits, axis=-1)  # [B, T-1]
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    ce = lse - target_logit
    return LossSums(ce=(ce * mask).sum(), z=(jnp.square(lse) * mask).sum(), tokens=mask.sum())


def target_tokens(loss_mask: jax.Array) -> jax.Array:
    """The ``tokens`` of ``loss_sums`` for this mask, without any logits (float32 [])."""
    return loss_mask[:, 1:].astype(jnp.float32).sum()


def _chunks(x: jax.Array, n: int) -> jax.Array:
    """[B, n·C, ...] → [n, B, C, ...] (the batch axis, the sharded one, stays in place)."""
    return jnp.moveaxis(x.reshape(x.shape[0], n, x.shape[1] // n, *x.shape[2:]), 1, 0)


def chunk_plan(T: int, chunk: int) -> tuple[int, int]:
    """(n, size): the fewest chunks of at most ``chunk`` positions that cover ``T``, each as short as
    that allows (``size = ceil(T / n)``), so the padding is under ``n`` positions. Cutting T = 32 into
    one 1,024-position chunk would run the LM head over 32x the positions; T = 8192 at 1,024 is
    8 x 1,024 either way."""
    n = -(-T // chunk)
    return n, -(-T // n)


def chunked_loss_sums(
    hidden: jax.Array,
    head: Callable[[jax.Array], jax.Array],
    vocab_size: int,
    tokens: jax.Array,
    loss_mask: jax.Array,
    chunk: int,
) -> LossSums:
    """``loss_sums(head(hidden)[..., :vocab_size], tokens, loss_mask)`` without the full logits.

    hidden ``[B, T, D]``; ``head(x [B, C, D]) -> float32 [B, C, Vp]`` (Vp ≥ vocab_size: columns from
    vocab_size on are padding and never count); tokens, loss_mask ``[B, T]``. The T positions
    (the last one, which predicts nothing, masked out) run through ``lax.scan`` in the fewest
    chunks of at most ``chunk`` positions (``chunk_plan``; the last padded with masked positions); each chunk is
    ``jax.checkpoint``-ed, so the backward pass recomputes its logits instead of keeping them:
    the largest loss buffers are ``[B, chunk, Vp]``, not ``[B, T, Vp]``.
    """
    B, T = tokens.shape
    targets = jnp.concatenate([tokens[:, 1:], jnp.zeros_like(tokens[:, :1])], axis=1)
    mask = jnp.concatenate([loss_mask[:, 1:], jnp.zeros_like(loss_mask[:, :1])], axis=1).astype(jnp.float32)
    n, chunk = chunk_plan(T, chunk)
    pad = n * chunk - T
    if pad:
        hidden = jnp.pad(hidden, ((0, 0), (0, pad), (0, 0)))
        targets, mask = jnp.pad(targets, ((0, 0), (0, pad))), jnp.pad(mask, ((0, 0), (0, pad)))

    @jax.checkpoint
    def one_chunk(x, t, m):
        logits = head(x).astype(jnp.float32)  # [B, C, Vp]
        if logits.shape[-1] != vocab_size:
            logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, -jnp.inf)
        lse = jax.nn.logsumexp(logits, axis=-1)  # [B, C]
        target_logit = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        return ((lse - target_logit) * m).sum(), (jnp.square(lse) * m).sum()

    def body(carry, xs):
        ce, z = one_chunk(*xs)
        return (carry[0] + ce, carry[1] + z), None

    zero = jnp.zeros([], jnp.float32)
    (ce, z), _ = jax.lax.scan(body, (zero, zero), (_chunks(hidden, n), _chunks(targets, n), _chunks(mask, n)))
    return LossSums(ce=ce, z=z, tokens=mask.sum())


def objective(sums: LossSums, z_loss: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean (cross-entropy + z_loss * logsumexp²) per target token, and its parts for logging."""
    n = jnp.maximum(sums.tokens, 1.0)
    ce, z = sums.ce / n, sums.z / n
    return ce + z_loss * z, {"loss": ce, "z_loss": z_loss * z, "target_tokens": sums.tokens}
