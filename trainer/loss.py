"""Next-token cross-entropy with z-loss, in float32, over the loader's ``loss_mask``.

Position t predicts token t+1: logits ``[:, :-1]`` are scored against ``tokens[:, 1:]`` where
``loss_mask[:, 1:]`` is 1 (a PAD target never counts; the token after an EOS is a normal target,
as in OLMo's packed training).

Two ways to the same sums: ``loss_sums`` from the full float32 logits ``[B, T, V]``, and
``chunked_loss_sums`` from the final hidden states, running the LM head over ``chunk``
positions at a time so that only ``[B, chunk, V]`` logits exist at once (Levanter's blockwise
cross-entropy, MaxText's vocab tiling); same value and gradient up to float rounding.

``fused_chunked_objective`` is the training step's form of the chunked one: the objective
``ce_weight · Σ ce + z_weight · Σ z`` whose gradient with respect to the hidden states and the LM
head's kernel is computed *in the forward pass*, chunk by chunk, from the softmax the loss already
holds (a ``jax.custom_vjp``; the backward pass only scales it). Autodiff through
``chunked_loss_sums`` must recompute each chunk's logits in the backward pass (the chunk is
checkpointed) and runs the head's two gradient matmuls on float32 cotangents; the fused form runs
the head 3 times per chunk instead of 4, its gradient matmuls in the compute dtype. Written here
because no library computes it with OLMo's z-loss and a loss mask: tokamax's
``linear_softmax_cross_entropy_loss`` (the fused TPU kernel) takes neither.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp

if TYPE_CHECKING:
    from model.transformer import Head


Array = jax.Array  # (short names for the chunked passes' signatures)
Arrays3 = tuple[Array, Array, Array]
Arrays4 = tuple[Array, Array, Array, Array]


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
    shifted: bool = False,
) -> LossSums:
    """``loss_sums(head(hidden)[..., :vocab_size], tokens, loss_mask)`` without the full logits.

    hidden ``[B, T, D]``; ``head(x [B, C, D]) -> float32 [B, C, Vp]`` (Vp ≥ vocab_size: columns from
    vocab_size on are padding and never count); tokens, loss_mask ``[B, T]``. The T positions
    (the last one, which predicts nothing, masked out) run through ``lax.scan`` in the fewest
    chunks of at most ``chunk`` positions (``chunk_plan``; the last padded with masked positions); each chunk is
    ``jax.checkpoint``-ed, so the backward pass recomputes its logits instead of keeping them:
    the largest loss buffers are ``[B, chunk, Vp]``, not ``[B, T, Vp]``.

    ``shifted``: tokens and loss_mask are already each position's target and whether it counts
    (the last position's too: context parallelism takes them before reordering the positions).
    """
    n, chunk = chunk_plan(tokens.shape[1], chunk)
    targets, mask = _targets(tokens, loss_mask, n, chunk, shifted)
    hidden = _pad_positions(hidden, n, chunk)

    @jax.checkpoint
    def one_chunk(x: jax.Array, t: jax.Array, m: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = head(x).astype(jnp.float32)  # [B, C, Vp]
        if logits.shape[-1] != vocab_size:
            logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, -jnp.inf)
        lse = jax.nn.logsumexp(logits, axis=-1)  # [B, C]
        target_logit = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        return ((lse - target_logit) * m).sum(), (jnp.square(lse) * m).sum()

    def body(carry: tuple[jax.Array, jax.Array], xs: tuple[jax.Array, ...]) -> tuple[tuple[jax.Array, jax.Array], None]:
        ce, z = one_chunk(*xs)
        return (carry[0] + ce, carry[1] + z), None

    zero = jnp.zeros([], jnp.float32)
    (ce, z), _ = jax.lax.scan(body, (zero, zero), (_chunks(hidden, n), _chunks(targets, n), _chunks(mask, n)))
    return LossSums(ce=ce, z=z, tokens=mask.sum())


def _targets(
    tokens: jax.Array, loss_mask: jax.Array, n: int, size: int, shifted: bool = False
) -> tuple[jax.Array, jax.Array]:
    """(targets int, mask float32), each ``[B, n·size]``: position t's target is token t+1; the last
    position and the padding up to ``n·size`` are masked out. ``shifted``: the two are given per
    position already (only the padding is added)."""
    if shifted:
        widths = ((0, 0), (0, n * size - tokens.shape[1]))
        return jnp.pad(tokens, widths), jnp.pad(loss_mask, widths).astype(jnp.float32)
    pad = n * size - tokens.shape[1] + 1
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, pad)))
    return targets, jnp.pad(loss_mask[:, 1:], ((0, 0), (0, pad))).astype(jnp.float32)


def _pad_positions(x: jax.Array, n: int, size: int) -> jax.Array:
    """[B, T, ...] → [B, n·size, ...] (zeros after T)."""
    pad = n * size - x.shape[1]
    return jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2)) if pad else x


def fused_chunked_objective(
    hidden: jax.Array,
    head: Head,
    vocab_size: int,
    tokens: jax.Array,
    loss_mask: jax.Array,
    chunk: int,
    ce_weight: jax.Array,
    z_weight: jax.Array,
    shifted: bool = False,
) -> tuple[jax.Array, LossSums]:
    """(``ce_weight · ce + z_weight · z``, the ``LossSums``) of ``chunked_loss_sums``, differentiable
    in ``hidden [B, T, D]`` and ``head.kernel [D, Vp]`` only (``model.Head``; the sums are for
    logging: no gradient flows through them, nor through the weights).

    Per chunk, with ``p = softmax(logits)`` and ``lse`` its log-normaliser, the objective's gradient
    with respect to the logits is ``m · (ce_weight · (p − onehot(target)) + z_weight · 2 · lse · p)``
    (``d lse / d logits = p``); it is cast to the compute dtype (as a bf16 matmul's operands are) and
    the head's two gradient matmuls run at once: ``dx = dlogits @ Wᵀ`` (kept, compute dtype) and
    ``dW += xᵀ @ dlogits`` (accumulated in float32 over the chunks). The backward pass multiplies
    both by the objective's cotangent. ``shifted``: as ``chunked_loss_sums``'.
    """
    B, T = tokens.shape
    n, size = chunk_plan(T, chunk)
    ts, ms = (_chunks(a, n) for a in _targets(tokens, loss_mask, n, size, shifted))
    dtype = head.dtype

    def chunk_fwd(w: Array, x: Array, t: Array, m: Array, ce_w: Array, z_w: Array) -> Arrays4:
        logits = head.constrain(head.matmul(x, w))  # float32 [B, C, Vp]
        if logits.shape[-1] != vocab_size:
            logits = jnp.where(jnp.arange(logits.shape[-1]) < vocab_size, logits, -jnp.inf)
        lse = jax.nn.logsumexp(logits, axis=-1)  # [B, C]
        target_logit = jnp.take_along_axis(logits, t[..., None], axis=-1)[..., 0]
        p = jnp.exp(logits - lse[..., None])
        onehot = jnp.arange(logits.shape[-1]) == t[..., None]
        dlogits = (ce_w * (p - onehot) + (2.0 * z_w) * lse[..., None] * p) * m[..., None]
        dlogits = head.constrain(dlogits).astype(dtype)
        dx = jnp.einsum("btv,dv->btd", dlogits, w, preferred_element_type=jnp.float32).astype(x.dtype)
        dw = jnp.einsum("btd,btv->dv", x, dlogits, preferred_element_type=jnp.float32)
        return ((lse - target_logit) * m).sum(), (jnp.square(lse) * m).sum(), dx, dw

    def run(hidden: Array, kernel: Array, ts: Array, ms: Array, ce_w: Array, z_w: Array) -> Arrays4:
        w = kernel.astype(dtype)

        def body(carry: Arrays3, c: Arrays3) -> tuple[Arrays3, Array]:
            ce, z, dw = carry
            x, t, m = c
            ce_c, z_c, dx_c, dw_c = chunk_fwd(w, x, t, m, ce_w, z_w)
            return (ce + ce_c, z + z_c, dw + dw_c), dx_c

        zero = jnp.zeros([], jnp.float32)
        init = (zero, zero, jnp.zeros(kernel.shape, jnp.float32))
        (ce, z, dw), dx = jax.lax.scan(body, init, (_chunks(_pad_positions(hidden, n, size), n), ts, ms))
        dx = jnp.moveaxis(dx, 0, 1).reshape(B, n * size, -1)[:, :T]  # [B, T, D]
        return ce, z, dx, dw

    @jax.custom_vjp
    def obj(hidden: Array, kernel: Array, ts: Array, ms: Array, ce_w: Array, z_w: Array) -> Arrays3:
        ce, z, _, _ = run(hidden, kernel, ts, ms, ce_w, z_w)
        return ce_w * ce + z_w * z, ce, z

    def obj_fwd(hidden: Array, kernel: Array, ts: Array, ms: Array, ce_w: Array, z_w: Array) -> tuple[Arrays3, Arrays4]:
        ce, z, dx, dw = run(hidden, kernel, ts, ms, ce_w, z_w)
        return (ce_w * ce + z_w * z, ce, z), (dx, dw, ce_w, z_w)

    def obj_bwd(res: Arrays4, cts: Arrays3) -> tuple[Array | None, ...]:
        dx, dw, ce_w, z_w = res
        g = cts[0]  # the sums' cotangents are ignored: they are logged, never differentiated
        return (g * dx).astype(dx.dtype), g * dw, None, None, jnp.zeros_like(ce_w), jnp.zeros_like(z_w)

    obj.defvjp(obj_fwd, obj_bwd)
    ce_w, z_w = jnp.asarray(ce_weight, jnp.float32), jnp.asarray(z_weight, jnp.float32)
    value, ce, z = obj(hidden, head.kernel, ts, ms, ce_w, z_w)
    sums = LossSums(ce=jax.lax.stop_gradient(ce), z=jax.lax.stop_gradient(z), tokens=ms.sum())
    return value, sums


def objective(sums: LossSums, z_loss: float) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Mean (cross-entropy + z_loss * logsumexp²) per target token, and its parts for logging."""
    n = jnp.maximum(sums.tokens, 1.0)
    ce, z = sums.ce / n, sums.z / n
    return ce + z_loss * z, {"loss": ce, "z_loss": z_loss * z, "target_tokens": sums.tokens}
