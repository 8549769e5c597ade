"""The step's kernel options compute the default's function: splash's q/k/v layouts, tokamax's splash
kernel, and the fused q/k/v and gate/up projections (same parameters, one matmul each).

Splash runs in Pallas interpret mode on the CPU (as in test_attention); float32 throughout.
"""

from __future__ import annotations

import importlib.util
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import model
from model import attention
from tests import fast_compile
from tests.model.test_attention import BLOCKS, SEGMENTS, SPLASH_RTOL, T, dense_reference, qkv
from tests.model.tiny import randomize, tiny_config

LAYOUT_FIELDS = ("splash_q_layout", "splash_k_layout", "splash_v_layout")
HAS_TOKAMAX = importlib.util.find_spec("tokamax") is not None


def _attend_and_grads(cfg, q, k, v, window):
    """attend_splash's output and its q/k/v gradients under one random cotangent (jitted)."""
    seg = jnp.asarray(SEGMENTS[: q.shape[0]])
    ct = jnp.asarray(np.random.default_rng(7).standard_normal(q.shape), jnp.float32)

    @jax.jit
    def run(q, k, v):
        out, vjp = jax.vjp(lambda *a: attention.attend_splash(*a, seg, window, cfg, interpret=True), q, k, v)
        return out, vjp(ct)

    out, grads = run(q, k, v)
    return np.asarray(out), [np.asarray(g) for g in grads]


def _close(got, want):
    assert np.abs(got - want).max() <= SPLASH_RTOL * np.abs(want).max()


def _program(cfg, q, k, v):
    return str(jax.make_jaxpr(lambda *a: attention.attend_splash(*a, None, 48, cfg, True))(q, k, v))


def test_seq_minor_layouts_give_the_default_layouts_attention_and_gradients():
    """q, k and v sequence-minor: the same values and q/k/v gradients as the default, in a sliding
    layer crossing a block edge, with documents; and each layout option reaches the kernel (a
    different program; MaxText's OLMo 3 recipe sets q and k)."""
    q, k, v = qkv((1, T, 2, 2, 16), seed=3)
    default = tiny_config(**BLOCKS, splash_fused_bwd=True)
    seq_minor = tiny_config(
        **BLOCKS,
        splash_fused_bwd=True,
        splash_q_layout="seq_minor",
        splash_k_layout="seq_minor",
        splash_v_layout="seq_minor",
    )
    want, want_grads = _attend_and_grads(default, q, k, v, 48)
    got, grads = _attend_and_grads(seq_minor, q, k, v, 48)
    _close(got, want)
    for g, w in zip(grads, want_grads):
        _close(g, w)
    programs = {_program(tiny_config(**BLOCKS, **{f: "seq_minor"}), q, k, v) for f in LAYOUT_FIELDS}
    assert len(programs | {_program(default, q, k, v)}) == 4


@pytest.mark.skipif(not HAS_TOKAMAX, reason="tokamax is not installed (not a dependency; pip install tokamax)")
@pytest.mark.parametrize("window", [None, 48])
def test_tokamax_splash_equals_the_masks_written_out_and_jax_splash_gradients(window):
    """tokamax's kernel: causal and sliding, documents and a PAD tail: attention equal to the dense
    reference, q/k/v gradients equal to JAX's fused-backward splash."""
    q, k, v = qkv((2, T, 2, 2, 16), seed=4)
    jax_cfg = tiny_config(**BLOCKS, splash_fused_bwd=True)
    tok_cfg = tiny_config(**BLOCKS, splash_fused_bwd=True, splash_kernel="tokamax")
    got, grads = _attend_and_grads(tok_cfg, q, k, v, window)
    np.testing.assert_allclose(got, dense_reference(q, k, v, SEGMENTS, window), atol=2e-5, rtol=0)
    _, want_grads = _attend_and_grads(jax_cfg, q, k, v, window)
    for g, w in zip(grads, want_grads):
        _close(g, w)


def test_tokamax_without_the_package_or_the_fused_backward_is_a_clear_error(monkeypatch):
    with pytest.raises(ValueError, match="splash_kernel='tokamax' has only the fused backward kernel"):
        tiny_config(splash_kernel="tokamax")
    with pytest.raises(ValueError, match="splash_kernel='pallas'; expected one of"):
        tiny_config(splash_kernel="pallas")
    with pytest.raises(ValueError, match="splash_k_layout='seq'; expected one of"):
        tiny_config(splash_k_layout="seq")
    attention.tokamax_splash_kernel.cache_clear()
    for name in ["tokamax", *(m for m in sys.modules if m.startswith("tokamax."))]:
        monkeypatch.setitem(sys.modules, name, None)  # an import of it fails, installed or not
    with pytest.raises(ImportError, match="needs the tokamax package"):
        attention.tokamax_splash_kernel(T, None, 128, 128, True)
    # start-up's check (trainer.startup.check_attention) refuses it before step 0, the jax kernel passes
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    cfg = tiny_config(**BLOCKS, splash_fused_bwd=True, splash_kernel="tokamax")
    with pytest.raises(ValueError, match="needs the tokamax package"):
        attention.check_seq_len(cfg, T, "splash")
    attention.check_seq_len(cfg, T, "xla")
    attention.check_seq_len(tiny_config(**BLOCKS), T, "splash")


def _logits_and_grads(cfg, params, tokens):
    ct = jnp.asarray(np.random.default_rng(5).standard_normal((*tokens.shape, cfg.vocab_size)), jnp.float32)

    def loss(p):
        logits = model.forward(cfg, p, tokens, jnp.asarray(SEGMENTS[:, :32]))
        return (logits * ct).sum(), logits

    # default and fused compiled alike (tests/fast_compile.py)
    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True), compiler_options=fast_compile.OPTIONS)(params)
    return np.asarray(logits), grads


def _dots(cfg, params, tokens):
    return str(jax.make_jaxpr(lambda p: model.forward(cfg, p, tokens))(params)).count("dot_general")


def test_fused_projections_keep_the_parameters_and_give_the_same_logits_and_gradients():
    """fused_qkv and fused_gate_up (GQA: 4 query heads over 2 kv heads; a sliding and a full layer):
    the same parameter tree (names, shapes: checkpoints and the HF converter unchanged), logits and
    every parameter's gradient equal to the default's, and fewer matmuls in the program (the q/k/v
    three and the gate/up two are one each)."""
    layers = dict(n_layers=2, layer_types=("sliding_attention", "full_attention"))
    default = tiny_config(**layers)
    fused = tiny_config(**layers, fused_qkv=True, fused_gate_up=True)
    assert jax.tree.map(lambda a: (a.shape, a.dtype), model.abstract_params(fused)) == jax.tree.map(
        lambda a: (a.shape, a.dtype), model.abstract_params(default)
    )
    params = randomize(model.abstract_params(default), seed=0)
    tokens = np.random.default_rng(1).integers(0, default.vocab_size, size=(2, 32), dtype=np.int32)
    want_logits, want_grads = _logits_and_grads(default, params, tokens)
    logits, grads = _logits_and_grads(fused, params, tokens)
    np.testing.assert_allclose(logits, want_logits, rtol=1e-5, atol=1e-5 * np.abs(want_logits).max())
    for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(want_grads)):
        g, w = np.asarray(g), np.asarray(w)
        assert np.abs(g - w).max() <= 1e-5 * np.abs(w).max(), jax.tree_util.keystr(path)
    P = model.transformer.layer_period(default.layers)  # the scan's body holds one group of P layers
    assert _dots(default, params, tokens) - _dots(fused, params, tokens) == 3 * P
    assert _dots(tiny_config(**layers, fused_qkv=True), params, tokens) == _dots(default, params, tokens) - 2 * P
