"""Masking, windows, init and dtype policy behave as specified."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import model
from tests import fast_compile
from tests.model.tiny import SEQ_LEN, randomize, tiny_config

# The buffer-accounting tests compile and never run: LLVM's optimisation of the CPU code is skipped
# (level 0), which leaves XLA's buffer assignment as it is. Measured: the same temp, argument and output
# bytes to the byte for every program below, compile CPU 34 -> 15 s (bench/RESULTS.md, round 7b).
BUFFERS_ONLY = fast_compile.OPTIONS


def test_single_document_masking_equals_no_masking(tiny_cfg, tiny_params, tokens):
    plain = model.forward(tiny_cfg, tiny_params, tokens)
    seg = np.ones_like(tokens)
    masked = model.forward(
        tiny_cfg,
        tiny_params,
        tokens,
        segment_ids=seg,
        positions=np.broadcast_to(np.arange(SEQ_LEN, dtype=np.int32), tokens.shape),
    )
    np.testing.assert_array_equal(np.asarray(plain), np.asarray(masked))


def test_packed_documents_do_not_see_each_other(tiny_cfg, tiny_params, tokens):
    """Each document of a packed row gets the logits it would get alone (window < doc lengths)."""
    forward = jax.jit(model.forward, static_argnums=0, compiler_options=fast_compile.OPTIONS)  # all compared alike
    lengths = [11, 5, SEQ_LEN - 16]
    row = tokens[:1]
    seg = np.concatenate([np.full(n, i + 1) for i, n in enumerate(lengths)])[None].astype(np.int32)
    pos = np.concatenate([np.arange(n) for n in lengths])[None].astype(np.int32)
    packed = np.asarray(forward(tiny_cfg, tiny_params, row, segment_ids=seg, positions=pos))
    start = 0
    for n in lengths:
        alone = np.asarray(forward(tiny_cfg, tiny_params, row[:, start : start + n]))
        np.testing.assert_allclose(packed[:, start : start + n], alone, atol=2e-5, rtol=1e-5)
        start += n
    # and without the document mask the later documents do see the earlier ones
    unmasked = np.asarray(forward(tiny_cfg, tiny_params, row, positions=pos))
    assert np.abs(unmasked[:, 11:] - packed[:, 11:]).max() > 1e-2


def _logit_change(cfg, params, tokens, q, k):
    """Max |Δ logits at query q| when the token at key position k is replaced."""
    changed = tokens.copy()
    changed[:, k] = (changed[:, k] + 1) % cfg.vocab_size
    a = np.asarray(model.forward(cfg, params, tokens))[:, q]
    b = np.asarray(model.forward(cfg, params, changed))[:, q]
    return float(np.abs(a - b).max())


def test_sliding_layer_sees_exactly_window_keys_including_itself(tokens):
    """One sliding layer: query q depends on keys q-W+1..q and on nothing before (HF's convention)."""
    window = 5
    cfg = tiny_config(n_layers=1, layer_types=("sliding_attention",), sliding_window=window)
    params = randomize(model.abstract_params(cfg), seed=1)
    q = SEQ_LEN - 3
    assert _logit_change(cfg, params, tokens, q, q - window) == 0.0  # just outside: invisible
    assert _logit_change(cfg, params, tokens, q, q - window + 1) > 1e-3  # oldest visible key
    assert _logit_change(cfg, params, tokens, q, 0) == 0.0
    assert _logit_change(cfg, params, tokens, q, q + 1) == 0.0  # causal


def test_full_attention_layer_sees_beyond_the_window(tokens):
    cfg = tiny_config(n_layers=1, layer_types=("full_attention",), sliding_window=4)
    params = randomize(model.abstract_params(cfg), seed=1)
    q = SEQ_LEN - 3
    assert _logit_change(cfg, params, tokens, q, 0) > 1e-3
    assert _logit_change(cfg, params, tokens, q, q - 4) > 1e-3


def test_init_is_truncated_normal_std_002_cut_at_3_sigma():
    cfg = model.get_config("olmo3-tiny", n_layers=2, vocab_size=16384)  # 1M-entry matrices
    params = model.init(cfg, jax.random.key(0))
    assert set(params) == {"embed", "layers", "final_norm", "lm_head"}
    assert model.count_params(cfg) == sum(x.size for x in jax.tree.leaves(params))
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
        assert x.dtype == jnp.float32, path
        x = np.asarray(x)
        if path[-1].key == "scale":
            np.testing.assert_array_equal(x, 1.0)
            continue
        assert np.abs(x).max() <= 3 * 0.02 + 1e-7, path
        if path[0].key == "layers":  # every layer draws its own weights
            assert not np.array_equal(x[0], x[1]), path
        # std of N(0, 0.02²) truncated at ±3σ is 0.02 · 0.98658
        if x.size > 100_000:
            assert abs(x.std() / 0.02 - 0.98658) < 0.01, (path, x.std())
            assert np.abs(x).max() > 2.9 * 0.02, path  # the tails are there, cut at 3σ not 2σ


def test_bf16_compute_keeps_fp32_params_and_returns_fp32_logits(tiny_params, tokens):
    cfg32 = tiny_config()
    cfg16 = tiny_config(compute_dtype="bfloat16")
    assert model.get_config("olmo3-tiny").compute_dtype == "bfloat16"  # the default policy
    out16 = model.forward(cfg16, tiny_params, tokens)
    out32 = model.forward(cfg32, tiny_params, tokens)
    assert out16.dtype == jnp.float32 and out16.shape == (2, SEQ_LEN, cfg16.vocab_size)
    scale = float(jnp.abs(out32).max())
    err = float(jnp.abs(out16 - out32).max())
    assert 0 < err < 0.1 * scale  # bf16 rounding, not a different model


def test_vocab_padding_changes_nothing_but_storage(tiny_params, tokens):
    cfg = tiny_config(vocab_size=250)
    padded = tiny_config(vocab_size=250, vocab_pad_multiple=128)
    params = jax.tree.map(lambda x: x, tiny_params)
    params = {
        **params,
        "embed": {"embedding": tiny_params["embed"]["embedding"][:250]},
        "lm_head": {"kernel": tiny_params["lm_head"]["kernel"][:, :250]},
    }
    tok = tokens % 250
    forward = jax.jit(model.forward, static_argnums=0, compiler_options=fast_compile.OPTIONS)  # both alike
    out = forward(cfg, params, tok)
    out_padded = forward(padded, tiny_params, tok)
    assert out_padded.shape == out.shape == (2, SEQ_LEN, 250)
    np.testing.assert_allclose(np.asarray(out_padded), np.asarray(out), atol=1e-5)


def _loss_grads(cfg, params, tokens):
    def loss(p):
        logits = model.forward(cfg, p, tokens)[:, :-1]  # position t predicts token t + 1
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1).mean()

    return jax.jit(jax.grad(loss), compiler_options=fast_compile.OPTIONS)(params)  # all compared alike


@pytest.mark.slow
def test_gradients_are_finite_reach_every_parameter_and_survive_remat_and_chunking(tiny_params, tokens):
    grads = _loss_grads(tiny_config(), tiny_params, tokens)
    for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
        assert np.isfinite(np.asarray(g)).all(), path
        assert float(jnp.abs(g).max()) > 0, path
    for remat in (True, "dots_with_no_batch_dims_saveable"):
        got = _loss_grads(tiny_config(remat=remat, attention_chunk=8), tiny_params, tokens)
        jax.tree.map(
            lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-4), grads, got
        )


@pytest.mark.slow
def test_remat_policies_keep_what_they_name():
    """XLA's buffer accounting for fwd + bwd: keeping every activation (none) > keeping the matmul
    outputs without batch dimensions > keeping only each block's input (full); true/false still read
    as full/none."""
    tok = jax.ShapeDtypeStruct((2, 128), jnp.int32)

    def temp_bytes(remat):
        cfg = tiny_config(remat=remat, n_layers=8, max_seq_len=128, attention_chunk=32)  # 2 scanned groups
        grad = jax.jit(jax.grad(lambda p, t: model.forward(cfg, p, t).mean()))
        return grad.lower(model.abstract_params(cfg), tok).compile(BUFFERS_ONLY).memory_analysis().temp_size_in_bytes

    assert temp_bytes("none") > temp_bytes("dots_with_no_batch_dims_saveable") > temp_bytes("full")
    assert tiny_config(remat=True) == tiny_config(remat="full") and tiny_config(remat=False).remat == "none"
    with pytest.raises(ValueError, match="ModelConfig.remat='dots'; expected true/false or one of"):
        tiny_config(remat="dots")


@pytest.mark.slow
def test_chunked_attention_equals_full_attention(tiny_params, tokens):
    """Query-chunked attention gives the same logits (chunks 4 < window 8 < 16; packed rows).

    Its gradients are checked in test_gradients_..._survive_remat_and_chunking.
    """
    forward = jax.jit(model.forward, static_argnums=0, compiler_options=fast_compile.OPTIONS)  # all compared alike
    seg = np.repeat(np.array([[1, 2], [1, 1]], np.int32), SEQ_LEN // 2, axis=1)
    want = np.asarray(forward(tiny_config(), tiny_params, tokens, seg))
    for chunk in (4, 16):
        got = np.asarray(forward(tiny_config(attention_chunk=chunk), tiny_params, tokens, seg))
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="attention_chunk"):
        model.forward(tiny_config(attention_chunk=5), tiny_params, tokens)


@pytest.mark.slow
def test_chunked_attention_needs_less_memory_for_the_backward_pass():
    """XLA's own buffer accounting: O(C·T) instead of O(T²) attention buffers in fwd + bwd."""
    tok = jax.ShapeDtypeStruct((1, 512), jnp.int32)

    def temp_bytes(chunk):
        cfg = tiny_config(n_layers=1, layer_types=("full_attention",), attention_chunk=chunk)
        grad = jax.jit(jax.grad(lambda p, t: model.forward(cfg, p, t).mean()))
        return grad.lower(model.abstract_params(cfg), tok).compile(BUFFERS_ONLY).memory_analysis().temp_size_in_bytes

    assert temp_bytes(64) < 0.5 * temp_bytes(None)


def test_out_of_vocabulary_ids_poison_their_row_with_nan(tiny_cfg, tiny_params, tokens):
    bad = tokens.copy()
    bad[0, 5] = tiny_cfg.vocab_size
    out = np.asarray(model.forward(tiny_cfg, tiny_params, bad))
    assert np.isnan(out[0]).any() and np.isfinite(out[1]).all()


def test_bad_shapes_are_rejected(tiny_cfg, tiny_params, tokens):
    with pytest.raises(ValueError):
        model.forward(tiny_cfg, tiny_params, tokens[0])
    with pytest.raises(ValueError):
        model.forward(tiny_cfg, tiny_params, tokens, segment_ids=np.ones((2, 3), np.int32))
