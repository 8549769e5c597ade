"""Long-context memory options of the block (model.layers, model.transformer): ``seq_chunk`` (the
q/k/v projections and the MLP over sequence chunks) computes the same function and gradients, and
keeps what it promises out of memory; the ``save_attn_mlp_out`` remat policy saves only the
attention and MLP outputs; a one-group layer scan keeps its recomputation (no CSE).

Float32 tiny models on the CPU (XLA attention), so equalities are tight."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax._src.ad_checkpoint import saved_residuals  # print_saved_residuals's list (JAX exports only the printer)

import model
from tests.model.tiny import randomize, tiny_config

T, C = 112, 28  # 4 chunks; neither length is a model width, so a shape naming one is an activation


def _batch(cfg, seed=0):
    rng = np.random.default_rng(seed)
    tokens = jnp.asarray(rng.integers(0, cfg.vocab_size, (2, T)), jnp.int32)
    seg = jnp.asarray(np.repeat([[1] * 70 + [2] * 42], 2, axis=0), jnp.int32)  # two documents per row
    return tokens, seg


def _loss_and_grads(cfg, params, tokens, seg):
    def loss(p):
        logits = model.forward(cfg, p, tokens, seg)
        return jnp.mean(jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(logits, tokens[..., None], -1)[..., 0])

    return jax.jit(jax.value_and_grad(loss))(params)


@pytest.mark.parametrize("remat", ["none", "dots_with_no_batch_dims_saveable", "save_attn_mlp_out"])
def test_seq_chunk_computes_the_same_loss_and_gradients(remat):
    """seq_chunk=16 over a 64-token sequence (4 chunks of q/k/v projections, QK-norm, RoPE and MLP,
    the MLP's custom backward) against the whole sequence at once, under each remat policy."""
    whole = tiny_config(n_layers=2, attention_impl="xla", remat=remat)
    chunked = tiny_config(n_layers=2, attention_impl="xla", remat=remat, seq_chunk=C)
    params = randomize(model.init(whole, jax.random.key(0)), seed=1)
    tokens, seg = _batch(whole)
    ref_loss, ref_grads = _loss_and_grads(whole, params, tokens, seg)
    loss, grads = _loss_and_grads(chunked, params, tokens, seg)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6)
    for path, g in jax.tree_util.tree_leaves_with_path(grads):
        ref = dict(jax.tree_util.tree_leaves_with_path(ref_grads))[path]
        np.testing.assert_allclose(g, ref, rtol=2e-5, atol=2e-6, err_msg=jax.tree_util.keystr(path))


def test_seq_chunk_leaves_shorter_and_unaligned_sequences_whole():
    """A sequence not longer than the chunk, or not a multiple of it, runs whole: the same logits."""
    cfg = tiny_config(n_layers=2, attention_impl="xla")
    params = randomize(model.init(cfg, jax.random.key(0)), seed=1)
    for length, chunk in ((28, 28), (42, 28)):
        tokens = jnp.arange(length, dtype=jnp.int32)[None] % cfg.vocab_size
        ref = model.forward(cfg, params, tokens)
        out = model.forward(tiny_config(n_layers=2, attention_impl="xla", seq_chunk=chunk), params, tokens)
        np.testing.assert_array_equal(out, ref)


def _activation_residuals(cfg, params, tokens, seg):
    """(shape, dtype) of the activations the backward pass keeps of the forward pass (the saved
    values with a sequence or chunk axis; the parameters' slices are not among them)."""

    def loss(p):
        return model.forward(cfg, p, tokens, seg).sum()

    saved = [tuple(a.shape) for a, _ in saved_residuals(loss, params)]
    return [(s, "") for s in saved if T in s or C in s]


def test_chunked_mlp_keeps_no_mlp_activation_under_the_dots_policy():
    """The 8k recipe's policy (dots_with_no_batch_dims_saveable) saves every matmul output, the
    [B, T, F] gate and up projections too; with seq_chunk the MLP (a custom_vjp whose residuals are
    its input) leaves none of width F, per chunk or stacked (a nested jax.checkpoint would not)."""
    kw = dict(n_layers=2, attention_impl="xla", remat="dots_with_no_batch_dims_saveable")
    cfg = tiny_config(**kw)
    params = randomize(model.init(cfg, jax.random.key(0)), seed=1)
    tokens, seg = _batch(cfg)
    F = cfg.mlp_hidden
    assert any(s[-1] == F for s, _ in _activation_residuals(cfg, params, tokens, seg))  # the control
    assert not any(s[-1] == F for s, _ in _activation_residuals(tiny_config(**kw, seq_chunk=C), params, tokens, seg))


def test_save_attn_mlp_out_keeps_three_sequence_activations_per_layer():
    """Under save_attn_mlp_out each layer keeps its input, its attention output and its MLP output
    (each B x T x D values; the XLA path has no logsumexp to keep): nothing of width F and no q/k/v
    projection. The dots policy keeps more than twice that. (The layer scan saves per layer along
    a leading group axis, here of length 1; the final norm's and the head's are outside it.)"""
    kw = dict(n_layers=2, attention_impl="xla", seq_chunk=C)
    cfg = tiny_config(**kw, remat="save_attn_mlp_out")
    params = randomize(model.init(cfg, jax.random.key(0)), seed=1)
    tokens, seg = _batch(cfg)
    B, D = tokens.shape[0], cfg.d_model

    def per_layer(c):
        shapes = [s for s, _ in _activation_residuals(c, params, tokens, seg) if s[:3] == (1, B, T)]
        return sum(int(np.prod(s)) for s in shapes)

    assert per_layer(cfg) == cfg.n_layers * 3 * B * T * D
    dots = tiny_config(n_layers=2, attention_impl="xla", remat="dots_with_no_batch_dims_saveable")  # the 8k recipes'
    assert per_layer(dots) > 2 * per_layer(cfg)


@pytest.mark.parametrize(
    "remat, n_layers, prevent",
    [
        ("save_attn_mlp_out", 2, True),  # the proxy: one group of (sliding, full)
        ("full", 2, True),
        ("dots_with_no_batch_dims_saveable", 2, False),  # the 8k recipes: kept as they were
        ("save_attn_mlp_out", 8, False),  # 2 groups of 4: the scan's loop keeps them apart
    ],
)
def test_a_one_group_layer_scan_keeps_the_recomputation_of_the_memory_policies(remat, n_layers, prevent):
    """XLA unrolls a one-trip layer scan; with CSE allowed it would merge the backward pass's
    recomputation with the forward pass and keep every activation (the 65k proxy's 23 GiB whatever
    the policy): the memory policies set prevent_cse there, the dots policy keeps its CSE."""
    cfg = tiny_config(n_layers=n_layers, attention_impl="xla", remat=remat)
    params = model.abstract_params(cfg)
    tokens = jnp.zeros((1, T), jnp.int32)
    jaxpr = jax.make_jaxpr(lambda p: model.forward(cfg, p, tokens))(params)

    def flags(jx):
        for eqn in jx.eqns:
            if eqn.primitive.name in ("checkpoint", "remat", "remat2"):  # jax.checkpoint's primitive
                yield eqn.params["prevent_cse"]
            for sub in _subjaxprs(eqn):
                yield from flags(sub)

    found = list(flags(jaxpr.jaxpr))
    assert found and all(f is prevent for f in found)


def _subjaxprs(eqn):
    for v in eqn.params.values():
        for x in v if isinstance(v, list | tuple) else [v]:
            if hasattr(x, "jaxpr") and hasattr(x.jaxpr, "eqns"):
                yield x.jaxpr
            elif hasattr(x, "eqns"):
                yield x
