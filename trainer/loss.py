"""Next-token cross-entropy with z-loss, in float32, over the loader's ``loss_mask``.

Position t predicts token t+1: logits ``[:, :-1]`` are scored against ``tokens[:, 1:]`` where
``loss_mask[:, 1:]`` is 1 (a PAD target never counts; the token after an EOS is a normal target,
as in OLMo's packed training).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class LossSums(NamedTuple):
    """Sums over the masked target tokens of a batch (float32 scalars)."""

    ce: jax.Array      # sum of cross-entropy
    z: jax.Array       # sum of logsumexp**2
    tokens: jax.Array  # number of target tokens counted


def loss_sums(logits: jax.Array, tokens: jax.Array, loss_mask: jax.Array) -> LossSums:
    """Sums for logits [B, T, V], tokens [B, T] int32 and loss_mask [B, T] (0/1)."""
    logits = logits[:, :-1].astype(jnp.float32)          # [B, T-1, V]
    targets = tokens[:, 1:]                              # [B, T-1]
    mask = loss_mask[:, 1:].astype(jnp.float32)          # [B, T-1]
    lse = jax.nn.logsumexp(logits, axis=-1)              # [B, T-1]
    target_logit = jnp.take_along_axis(logits, targets[..., None], axis=-1)[..., 0]
    ce = lse - target_logit
    return LossSums(ce=(ce * mask).sum(), z=(jnp.square(lse) * mask).sum(), tokens=mask.sum())


def objective(sums: LossSums, z_loss: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean (cross-entropy + z_loss * logsumexp²) per target token, and its parts for logging."""
    n = jnp.maximum(sums.tokens, 1.0)
    ce, z = sums.ce / n, sums.z / n
    return ce + z_loss * z, {"loss": ce, "z_loss": z_loss * z, "target_tokens": sums.tokens}
