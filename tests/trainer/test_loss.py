"""The chunked cross-entropy: the same sums as the full logits, over no more positions than it must."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests import fast_compile
from trainer import loss as loss_lib

FAST = fast_compile.OPTIONS

B, D, V = 2, 8, 37


@pytest.mark.parametrize(
    ("T", "chunk", "plan"),
    [(32, 1024, (1, 32)), (8192, 1024, (8, 1024)), (1500, 1024, (2, 750)), (33, 8, (5, 7)), (5, 1, (5, 1))],
)
def test_chunks_are_the_fewest_that_fit_and_as_short_as_they_can_be(T, chunk, plan):
    n, size = loss_lib.chunk_plan(T, chunk)
    assert (n, size) == plan
    assert size <= chunk and n * size >= T and n * size - T < n


@pytest.mark.parametrize(("T", "chunk"), [(32, 1024), (33, 8), (12, 12), (12, 5)])
def test_chunked_sums_equal_the_full_logits_and_the_head_sees_only_the_planned_positions(T, chunk):
    rng = np.random.default_rng(T * 1000 + chunk)
    hidden = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((D, V)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    mask = jnp.asarray(rng.integers(0, 2, (B, T)), jnp.int32)
    seen: list[tuple[int, ...]] = []

    def head(x):
        seen.append(tuple(x.shape))
        return x @ w

    # both sides one program each, compiled alike (tests/fast_compile.py)
    got = jax.jit(lambda h: loss_lib.chunked_loss_sums(h, head, V, tokens, mask, chunk), compiler_options=FAST)(hidden)
    want = jax.jit(lambda h: loss_lib.loss_sums(h @ w, tokens, mask), compiler_options=FAST)(hidden)
    np.testing.assert_allclose(got.ce, want.ce, rtol=1e-5)
    np.testing.assert_allclose(got.z, want.z, rtol=1e-5)
    assert float(got.tokens) == float(want.tokens)
    # the LM head runs on chunks of the planned size, never on a chunk padded far past T
    assert {s[1] for s in seen} == {loss_lib.chunk_plan(T, chunk)[1]}


def _head(w, dtype=jnp.float32):
    from model.layers import Constrain
    from model.transformer import Head

    return Head(w, dtype, Constrain(None, None))


@pytest.mark.parametrize(("T", "chunk", "Vp"), [(32, 8, V), (37, 8, 40), (12, 1024, V)])
def test_the_fused_backward_gives_autodiffs_value_and_gradient(T, chunk, Vp):
    """fused_chunked_objective (the gradient formed in the forward pass) against autodiff through
    chunked_loss_sums, float32: the objective, both gradients (hidden and head kernel) and the
    logged sums; with a padded vocabulary (Vp > V) and a padded last chunk (37 = 5 x 8 - 3)."""
    rng = np.random.default_rng(T * 7 + chunk)
    hidden = jnp.asarray(rng.standard_normal((B, T, D)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((D, Vp)) * 0.5, jnp.float32)
    tokens = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    mask = jnp.asarray(rng.integers(0, 2, (B, T)), jnp.int32)
    ce_w, z_w = 1 / 41.0, 1e-2 / 41.0

    def autodiff(h, k):
        s = loss_lib.chunked_loss_sums(h, _head(k), V, tokens, mask, chunk)
        return ce_w * s.ce + z_w * s.z, s

    def fused(h, k):
        return loss_lib.fused_chunked_objective(h, _head(k), V, tokens, mask, chunk, ce_w, z_w)

    # both compiled alike (tests/fast_compile.py)
    (want, want_sums), want_g = jax.jit(
        jax.value_and_grad(autodiff, argnums=(0, 1), has_aux=True), compiler_options=FAST
    )(hidden, w)
    (got, got_sums), got_g = jax.jit(jax.value_and_grad(fused, argnums=(0, 1), has_aux=True), compiler_options=FAST)(
        hidden, w
    )
    np.testing.assert_allclose(got, want, rtol=1e-6)
    for g, f in zip(got_g, want_g):
        np.testing.assert_allclose(g, f, rtol=2e-5, atol=2e-7)
    for name in ("ce", "z", "tokens"):
        np.testing.assert_allclose(getattr(got_sums, name), getattr(want_sums, name), rtol=1e-6)


def test_the_fused_backward_scales_with_the_objectives_cotangent_and_ignores_the_logged_sums():
    """d(3·objective) = 3·d(objective); a loss built on the logged sums gets no gradient from them."""
    rng = np.random.default_rng(5)
    hidden = jnp.asarray(rng.standard_normal((B, 16, D)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((D, V)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, V, (B, 16)), jnp.int32)
    mask = jnp.ones((B, 16), jnp.int32)
    run = lambda h: loss_lib.fused_chunked_objective(h, _head(w), V, tokens, mask, 8, 0.5, 0.1)
    g1 = jax.jit(jax.grad(lambda h: run(h)[0]), compiler_options=FAST)(hidden)  # both alike (tests/fast_compile.py)
    g3 = jax.jit(jax.grad(lambda h: 3.0 * run(h)[0] + run(h)[1].ce), compiler_options=FAST)(hidden)
    np.testing.assert_allclose(g3, 3.0 * g1, rtol=1e-6)
