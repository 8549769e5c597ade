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
    _assert_same_loss_and_grads_as_whole(remat, seq_chunk=C)


def _assert_same_loss_and_grads_as_whole(remat: str, **chunking) -> None:
    """The 2-layer tiny model with ``chunking`` against the same model run whole: loss within 1e-6,
    every gradient within 2e-5 relative (fp32, XLA attention)."""
    whole = tiny_config(n_layers=2, attention_impl="xla", remat=remat)
    chunked = tiny_config(n_layers=2, attention_impl="xla", remat=remat, **chunking)
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


def _activation_values(cfg, params, tokens, seg):
    return sum(int(np.prod(s)) for s, _ in _activation_residuals(cfg, params, tokens, seg))


def test_save_attn_mlp_out_keeps_the_attention_and_mlp_outputs_and_the_chunked_block_only_the_first():
    """Against remat=full (each layer keeps its input alone), save_attn_mlp_out keeps each layer's
    attention output and MLP output more (2 x B x T x D values a layer; the XLA path has no
    logsumexp): no q/k/v projection, nothing of width F. With seq_chunk the block's tail (o_proj,
    norms, MLP) is one chunked custom_vjp whose residuals are the layer input and the attention
    output, so the MLP output is not kept (B x T x D a layer) and nothing is recomputed for it. The
    dots policy (the 8k recipes') keeps more than twice as much."""
    kw = dict(n_layers=2, attention_impl="xla")
    cfg = tiny_config(**kw, remat="save_attn_mlp_out")
    params = randomize(model.init(cfg, jax.random.key(0)), seed=1)
    tokens, seg = _batch(cfg)
    B, D, L = tokens.shape[0], cfg.d_model, cfg.n_layers
    assert cfg.n_heads * cfg.head_dim == D  # so an attention output is B x T x D values too
    full = _activation_values(tiny_config(**kw, remat="full"), params, tokens, seg)
    whole = _activation_values(cfg, params, tokens, seg)
    chunked = _activation_values(tiny_config(**kw, remat="save_attn_mlp_out", seq_chunk=C), params, tokens, seg)
    assert whole - full == L * 2 * B * T * D
    assert chunked - full == L * B * T * D
    assert not any(s[-1] == cfg.mlp_hidden for s, _ in _activation_residuals(cfg, params, tokens, seg))
    dots = tiny_config(**kw, remat="dots_with_no_batch_dims_saveable")  # the 8k recipes'
    assert _activation_values(dots, params, tokens, seg) - full > 2 * (whole - full)


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


@pytest.mark.parametrize(
    "remat, loop", [("save_attn_mlp_out", False), ("full", False), ("dots_with_no_batch_dims_saveable", True)]
)
def test_a_one_group_layer_stack_under_a_memory_policy_runs_without_the_layer_loop(remat, loop):
    """One group of layers (the 2-layer proxy) under a memory policy is called, not scanned: through
    a one-trip scan's stacked residuals XLA kept splash's lane-wide float32 logsumexp (1 GiB a layer
    at 65,536 tokens) alive until the backward pass. The dots policy (the 8k recipes) keeps its scan."""
    cfg = tiny_config(n_layers=2, attention_impl="xla", remat=remat)
    jaxpr = jax.make_jaxpr(lambda p: model.forward(cfg, p, jnp.zeros((1, T), jnp.int32)))(model.abstract_params(cfg))

    def one_trip_scans(jx):
        for eqn in jx.eqns:
            if eqn.primitive.name == "scan" and eqn.params["length"] == 1:
                yield eqn
            for sub in _subjaxprs(eqn):
                yield from one_trip_scans(sub)

    assert bool(list(one_trip_scans(jaxpr.jaxpr))) is loop


def _subjaxprs(eqn):
    for v in eqn.params.values():
        for x in v if isinstance(v, list | tuple) else [v]:
            if hasattr(x, "jaxpr") and hasattr(x.jaxpr, "eqns"):
                yield x.jaxpr
            elif hasattr(x, "eqns"):
                yield x


@pytest.mark.parametrize("remat", ["none", "save_attn_mlp_out", "save_attn_out"])
def test_keeping_the_gate_and_up_projections_computes_the_same_loss_and_gradients(remat):
    """seq_chunk_keep_gate_up (the chunked tail's backward takes the kept gate and up projections
    instead of recomputing them) against the whole sequence at once: the same loss and gradients."""
    _assert_same_loss_and_grads_as_whole(remat, seq_chunk=C, seq_chunk_keep_gate_up=True)


def test_keeping_the_gate_and_up_projections_keeps_them_and_nothing_else():
    """Under the long recipes' policy, seq_chunk_keep_gate_up adds exactly each layer's [B, T, F]
    gate and up projections to what the backward pass keeps; every other residual is as without it."""
    kw = dict(n_layers=2, attention_impl="xla", remat="save_attn_mlp_out", seq_chunk=C)
    cfg = tiny_config(**kw)
    params = randomize(model.init(cfg, jax.random.key(0)), seed=1)
    tokens, seg = _batch(cfg)
    B, F, L = tokens.shape[0], cfg.mlp_hidden, cfg.n_layers
    without = sorted(_activation_residuals(cfg, params, tokens, seg))
    with_kept = sorted(_activation_residuals(tiny_config(**kw, seq_chunk_keep_gate_up=True), params, tokens, seg))
    extra = list(with_kept)
    for r in without:
        extra.remove(r)  # every residual of the run without is still there
    assert extra == [((B, T, F), "")] * (2 * L)


def _compiled_dots(cfg, params, tokens, seg):
    """The dot ops of the compiled loss-and-gradient step whose result has the MLP's width F last
    (the gate and up projections, forward or recomputed, and the down kernel's gradient)."""
    text = jax.jit(lambda p: _loss_and_grads(cfg, p, tokens, seg)).lower(params).compile().as_text()
    F = cfg.mlp_hidden
    return [line for line in text.splitlines() if " dot(" in line and f",{F}]" in line.split(" dot(")[0]]


def test_keeping_the_gate_and_up_projections_drops_their_recomputation_and_nothing_else():
    """The compiled step with seq_chunk_keep_gate_up has exactly two [., F] matmuls fewer per layer
    (the backward loop's gate and up recomputation); without seq_chunk the knob changes nothing."""
    kw = dict(n_layers=2, attention_impl="xla", remat="save_attn_mlp_out")
    cfg = tiny_config(**kw, seq_chunk=C)
    params = randomize(model.init(cfg, jax.random.key(0)), seed=1)
    tokens, seg = _batch(cfg)
    kept = tiny_config(**kw, seq_chunk=C, seq_chunk_keep_gate_up=True)
    assert len(_compiled_dots(cfg, params, tokens, seg)) - len(_compiled_dots(kept, params, tokens, seg)) == 2 * 2
    unchunked = [tiny_config(**kw, seq_chunk_keep_gate_up=k) for k in (False, True)]
    text = [jax.jit(lambda p, c=c: _loss_and_grads(c, p, tokens, seg)).lower(params).as_text() for c in unchunked]
    assert text[0] == text[1]
