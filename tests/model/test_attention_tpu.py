"""On the chip (``@pytest.mark.tpu``; skipped elsewhere): splash compiled by Mosaic, in bf16, computes
the attention OLMo 3 specifies. Run: ``python -m pytest -q -m tpu tests/model``.

Tolerances: bf16 rounds every matmul input (relative 2⁻⁸), and splash rounds differently from xla
(it scales q before its matmul; xla scales the float32 scores after). So the whole-model check is
relative to xla's own bf16 error: splash-bf16 may be at most ``BF16_FACTOR`` times as far from the
float32 result as xla-bf16 is. Attention alone is held to the float64 reference at ``ATOL_BF16``
(outputs are averages of N(0, 1) values, so of order 1; bf16 output rounding alone is ~4e-3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import model
from model import attention
from tests.model.test_attention import dense_reference, doc_positions
from tests.model.tiny import randomize, tiny_config

pytestmark = pytest.mark.tpu

T = 1024
BLOCKS = dict(splash_block_q=256, splash_block_kv=256)
# documents crossing the 256-block edges (300, 700, ...), a PAD tail with id 0
SEGMENTS = np.stack([np.repeat([1, 2, 3], [300, 400, 324]), np.repeat([1, 2, 0], [650, 200, 174])]).astype(np.int32)
ATOL_BF16 = 3e-2
BF16_FACTOR = 2.0


def _bf16_qkv(seed=0):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((2, T, 2, 2, 128))
    k, v = rng.standard_normal((2, T, 2, 128)), rng.standard_normal((2, T, 2, 128))
    return tuple(jnp.asarray(x, jnp.bfloat16) for x in (q, k, v))


@pytest.mark.parametrize("window", [None, 100, 300])
def test_splash_on_the_chip_equals_the_masks_written_out_in_bf16(window):
    q, k, v = _bf16_qkv()
    cfg = tiny_config(compute_dtype="bfloat16", **BLOCKS)
    for seg in (SEGMENTS, None):
        want = dense_reference(*(np.asarray(x, np.float32) for x in (q, k, v)), seg, window)
        got = attention.attend_splash(q, k, v, None if seg is None else jnp.asarray(seg), window, cfg, interpret=False)
        assert np.abs(np.asarray(got, np.float32) - want).max() <= ATOL_BF16


def test_sliding_xla_path_equals_the_full_key_path_on_the_chip_in_bf16():
    q, k, v = _bf16_qkv(1)
    cfg = tiny_config(compute_dtype="bfloat16", attention_chunk=128)
    seg = jnp.asarray(SEGMENTS)
    sliced = np.asarray(jax.jit(lambda *a: attention.attend_xla(*a, seg, 100, cfg))(q, k, v), np.float32)
    full = np.asarray(
        jax.jit(lambda *a: attention.attend_xla(*a, seg, 100, cfg, slice_keys=False))(q, k, v), np.float32
    )
    assert np.abs(sliced - full).max() <= 1e-2


def _logits_grads(cfg, params, tokens):
    ct = jnp.asarray(np.random.default_rng(5).standard_normal((*tokens.shape, cfg.vocab_size)), jnp.float32)

    def loss(p):
        logits = model.forward(cfg, p, tokens, SEGMENTS, doc_positions(SEGMENTS))
        return (logits * ct).sum() / tokens.size, logits

    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    return np.asarray(logits), [np.asarray(g) for g in jax.tree.leaves(grads)]


def _rel(a, b):
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_whole_model_with_splash_on_the_chip_matches_xla_in_bf16():
    """GQA 4/2 heads of 128, window 100 < block 256, documents crossing blocks, PAD tail: logits and
    gradients of bf16 splash are within BF16_FACTOR x bf16 xla's distance from float32 xla."""
    base = dict(max_seq_len=T, sliding_window=100, head_dim=128, attention_chunk=256, **BLOCKS)
    f32 = tiny_config(attention_impl="xla", compute_dtype="float32", **base)
    xla = tiny_config(attention_impl="xla", compute_dtype="bfloat16", **base)
    spl = tiny_config(attention_impl="splash", compute_dtype="bfloat16", **base)
    params = randomize(model.abstract_params(f32), seed=0)
    tokens = np.random.default_rng(1).integers(0, f32.vocab_size, size=SEGMENTS.shape, dtype=np.int32)
    with jax.default_matmul_precision("highest"):
        ref_logits, ref_grads = _logits_grads(f32, params, tokens)
    xla_logits, xla_grads = _logits_grads(xla, params, tokens)
    spl_logits, spl_grads = _logits_grads(spl, params, tokens)
    assert _rel(spl_logits, ref_logits) <= BF16_FACTOR * _rel(xla_logits, ref_logits)
    assert _rel(spl_logits, xla_logits) <= 0.1
    for s, x, r in zip(spl_grads, xla_grads, ref_grads):
        assert _rel(s, r) <= BF16_FACTOR * _rel(x, r) + 1e-3
