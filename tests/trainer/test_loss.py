"""The chunked cross-entropy: the same sums as the full logits, over no more positions than it must."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from trainer import loss as loss_lib

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

    got = loss_lib.chunked_loss_sums(hidden, head, V, tokens, mask, chunk)
    want = loss_lib.loss_sums(hidden @ w, tokens, mask)
    np.testing.assert_allclose(got.ce, want.ce, rtol=1e-5)
    np.testing.assert_allclose(got.z, want.z, rtol=1e-5)
    assert float(got.tokens) == float(want.tokens)
    # the LM head runs on chunks of the planned size, never on a chunk padded far past T
    assert {s[1] for s in seen} == {loss_lib.chunk_plan(T, chunk)[1]}
