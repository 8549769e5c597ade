"""model.attention: both implementations compute exactly the masks OLMo 3 specifies.

Splash runs in Pallas interpret mode on CPU (exact, slow): shapes here are small, blocks are the
kernel's smallest (128), sequences two blocks long so that documents and windows cross a block
boundary. Float32 throughout; tolerances are stated where used.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import model
from model import attention
from tests import fast_compile
from tests.model.tiny import randomize, tiny_config

T = 256  # two splash blocks of 128
BLOCKS = dict(splash_block_q=128, splash_block_kv=128)
# B=2 rows: documents of 100, 90, 66 tokens (boundaries at 100 and 190 cross no / the 128 block edge);
# 150 tokens, 60 tokens, then 46 PAD tokens (segment id 0, as the loader writes them).
SEGMENTS = np.stack([np.repeat([1, 2, 3], [100, 90, 66]), np.repeat([1, 2, 0], [150, 60, 46])]).astype(np.int32)
# Float32 agreement of splash with xla, relative to the largest magnitude: interpret mode runs the
# kernel's online softmax in float32, so the two differ by summation order only (measured: ~1e-6).
SPLASH_RTOL = 1e-5


def doc_positions(seg: np.ndarray) -> np.ndarray:
    """RoPE positions restarting at 0 in each document (what the loader gives with document masking)."""
    pos = np.zeros_like(seg)
    for b in range(seg.shape[0]):
        for s in np.unique(seg[b]):
            idx = np.flatnonzero(seg[b] == s)
            pos[b, idx] = np.arange(len(idx))
    return pos


def dense_reference(q, k, v, seg, window):
    """float64 numpy attention over the full [B, T, T] mask written out from its definition."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    B, L, K, G, hd = q.shape
    i, j = np.arange(L)[:, None], np.arange(L)[None, :]
    mask = np.broadcast_to((j <= i) & (True if window is None else i - window < j), (B, L, L))
    if seg is not None:
        mask = mask & (seg[:, :, None] == seg[:, None, :])
    s = np.einsum("bikgd,bjkd->bkgij", q, k) / np.sqrt(hd)
    s = np.where(mask[:, None, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    return np.einsum("bkgij,bjkd->bikgd", p / p.sum(-1, keepdims=True), v)


def qkv(shape, seed=0):
    rng = np.random.default_rng(seed)
    B, L, K, G, hd = shape
    return (
        jnp.asarray(rng.standard_normal(shape), jnp.float32),
        jnp.asarray(rng.standard_normal((B, L, K, hd)), jnp.float32),
        jnp.asarray(rng.standard_normal((B, L, K, hd)), jnp.float32),
    )


def test_auto_is_splash_on_tpu_and_xla_elsewhere_and_splash_is_refused_on_gpu():
    assert attention.resolve_impl("auto", "tpu") == "splash"
    assert attention.resolve_impl("auto", "cpu") == "xla"
    assert attention.resolve_impl("auto", "gpu") == "xla"
    assert attention.resolve_impl("splash", "cpu") == "splash"  # interpret mode
    assert attention.resolve_impl("xla", "tpu") == "xla"
    for gpu in ("gpu", "cuda", "rocm"):
        with pytest.raises(ValueError, match="does not run on GPU: set attention_impl to 'xla'"):
            attention.resolve_impl("splash", gpu)
    with pytest.raises(ValueError, match="attention_impl='flash'"):
        attention.resolve_impl("flash", "tpu")


@pytest.mark.parametrize("window", [None, 48, 200])
def test_both_implementations_equal_the_masks_written_out(window):
    """Causal, HF's window q - W < k <= q (48 < one block; 200 spans two), same-document, PAD id 0."""
    q, k, v = qkv((2, T, 2, 2, 16))
    for seg in (SEGMENTS, None):
        want = dense_reference(q, k, v, seg, window)
        segj = None if seg is None else jnp.asarray(seg)
        for chunk in (None, 64):
            got = attention.attend_xla(q, k, v, segj, window, tiny_config(attention_chunk=chunk))
            np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=0)
        got = attention.attend_splash(q, k, v, segj, window, tiny_config(**BLOCKS), interpret=True)
        np.testing.assert_allclose(np.asarray(got), want, atol=2e-5, rtol=0)


@pytest.mark.parametrize("window, chunk", [(1, 4), (5, 4), (5, 8), (8, 8), (13, 4), (13, 16), (None, 8)])
def test_sliding_xla_path_reading_only_window_keys_equals_the_full_key_path(window, chunk):
    """Each chunk of C queries reads W + C - 1 keys instead of T (clamped at both ends of the
    sequence): same values and gradients as scoring all T keys."""
    q, k, v = qkv((2, 32, 2, 2, 8), seed=1)
    seg = jnp.asarray(np.repeat([[1, 2], [1, 0]], [11, 21], axis=1), jnp.int32)
    ct = jnp.asarray(np.random.default_rng(2).standard_normal(q.shape), jnp.float32)
    cfg = tiny_config(attention_chunk=chunk)

    @functools.partial(jax.jit, static_argnums=0, compiler_options=fast_compile.OPTIONS)  # both paths alike
    def run(slice_keys, q, k, v):
        out, vjp = jax.vjp(lambda *a: attention.attend_xla(*a, seg, window, cfg, slice_keys=slice_keys), q, k, v)
        return out, vjp(ct)

    (out, grads), (want, want_grads) = run(True, q, k, v), run(False, q, k, v)
    np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=1e-6, rtol=1e-6)
    for g, w in zip(grads, want_grads):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=1e-5, rtol=1e-5)


def test_sliding_xla_chunk_scores_only_the_keys_its_window_can_see():
    """T 32, W 5, C 4: each chunk's scores are [B, K, G, 4, 8] (W + C - 1 keys), never [.., 4, 32];
    in a full layer they stay [.., 4, 32]."""
    q, k, v = qkv((2, 32, 2, 2, 8))
    cfg = tiny_config(attention_chunk=4)
    sliding = str(jax.make_jaxpr(lambda *a: attention.attend_xla(*a, None, 5, cfg))(q, k, v))
    full = str(jax.make_jaxpr(lambda *a: attention.attend_xla(*a, None, None, cfg))(q, k, v))
    assert "f32[2,2,2,4,8]" in sliding and "f32[2,2,2,4,32]" not in sliding
    assert "f32[2,2,2,4,32]" in full


def _model_logits_and_grads(cfg, params, tokens, seg, pos):
    ct = jnp.asarray(np.random.default_rng(5).standard_normal((*tokens.shape, cfg.vocab_size)), jnp.float32)

    def loss(p):
        logits = model.forward(cfg, p, tokens, seg, pos)
        return (logits * ct).sum(), logits

    # both implementations compiled alike (tests/fast_compile.py)
    (_, logits), grads = jax.jit(jax.value_and_grad(loss, has_aux=True), compiler_options=fast_compile.OPTIONS)(params)
    return np.asarray(logits), grads


@pytest.mark.slow
@pytest.mark.parametrize(
    "kernel",
    [{}, {"splash_fused_bwd": True, "splash_block_kv": 256, "splash_block_kv_compute": 128}],
    ids=["separate-dq-dkv", "fused-bwd-kv-compute"],
)
def test_whole_model_with_splash_equals_xla_logits_and_gradients(kernel):
    """GQA (4 query heads over 2 kv heads), 3 sliding layers with a window smaller than a block + 1 full,
    documents crossing the block edge, a PAD tail: logits and every parameter's gradient; with the
    separate dq and dkv backward kernels, and with the fused one over an inner key tile."""
    xla = tiny_config(max_seq_len=T, sliding_window=48, attention_impl="xla", attention_chunk=64)
    spl = tiny_config(max_seq_len=T, sliding_window=48, attention_impl="splash", **{**BLOCKS, **kernel})
    assert (xla.n_heads, xla.n_kv_heads, xla.layer_types[:4]) == (
        4,
        2,
        ("sliding_attention",) * 3 + ("full_attention",),
    )
    params = randomize(model.abstract_params(xla), seed=0)
    tokens = np.random.default_rng(1).integers(0, xla.vocab_size, size=SEGMENTS.shape, dtype=np.int32)
    want_logits, want_grads = _model_logits_and_grads(xla, params, tokens, SEGMENTS, doc_positions(SEGMENTS))
    logits, grads = _model_logits_and_grads(spl, params, tokens, SEGMENTS, doc_positions(SEGMENTS))
    assert np.abs(logits - want_logits).max() <= SPLASH_RTOL * np.abs(want_logits).max()
    for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(want_grads)):
        g, w = np.asarray(g), np.asarray(w)
        assert np.abs(g - w).max() <= SPLASH_RTOL * np.abs(w).max(), jax.tree_util.keystr(path)


def _logit_change(cfg, params, tokens, q, k):
    changed = tokens.copy()
    changed[:, k] = (changed[:, k] + 1) % cfg.vocab_size
    a = np.asarray(_forward(cfg, params, tokens))[:, q]
    b = np.asarray(_forward(cfg, params, changed))[:, q]
    return float(np.abs(a - b).max())


# the model at LLVM level 0 where only its own runs are compared, or only structure is checked
_forward = jax.jit(model.forward, static_argnums=0, compiler_options=fast_compile.OPTIONS)


@pytest.mark.parametrize("window", [48, 130])
def test_splash_sliding_layer_sees_exactly_window_keys_including_itself(window):
    cfg = tiny_config(
        n_layers=1,
        layer_types=("sliding_attention",),
        sliding_window=window,
        max_seq_len=T,
        attention_impl="splash",
        **BLOCKS,
    )
    params = randomize(model.abstract_params(cfg), seed=1)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, size=(1, T), dtype=np.int32)
    q = 200
    assert _logit_change(cfg, params, tokens, q, q - window) == 0.0  # just outside: invisible
    assert _logit_change(cfg, params, tokens, q, q - window + 1) > 1e-3  # oldest visible key
    assert _logit_change(cfg, params, tokens, q, q + 1) == 0.0  # causal


@pytest.mark.slow
def test_splash_kernel_built_inside_a_trace_is_cached_as_constants():
    """The first request comes from inside jit (forward) and from inside grad: the cached kernel
    holds numpy arrays, never tracers, and serves the later traces (no UnexpectedTracerError)."""
    attention.splash_kernel.cache_clear()
    cfg = tiny_config(n_layers=1, layer_types=("full_attention",), max_seq_len=T, attention_impl="splash", **BLOCKS)
    params = randomize(model.abstract_params(cfg), seed=2)
    _forward(cfg, params, np.zeros((1, T), np.int32))  # structure only: level 0
    tokens = np.zeros((2, T), np.int32)  # another shape: forward is traced again, inside grad's trace
    jax.jit(jax.grad(lambda p: model.forward(cfg, p, tokens).sum()), compiler_options=fast_compile.OPTIONS)(params)
    info = attention.splash_kernel.cache_info()
    assert info.currsize == 1 and info.hits >= 1
    kernel = attention.splash_kernel(T, None, 2, 128, 128, True)
    assert all(isinstance(x, np.ndarray) for x in jax.tree.leaves(kernel))


def test_shapes_the_kernel_cannot_take_are_errors_naming_the_field():
    with pytest.raises(ValueError, match="splash_block_kv must be a positive multiple of 128"):
        tiny_config(splash_block_kv=100)
    with pytest.raises(ValueError, match="splash_block_kv_compute=384 must divide splash_block_kv=1024"):
        tiny_config(splash_block_kv_compute=384)
    cfg = tiny_config(attention_impl="splash", splash_block_q=256, splash_block_kv=128)
    with pytest.raises(ValueError, match="sequence length 384 with splash_block_q=256"):
        attention.check_seq_len(cfg, 384, "splash")
    with pytest.raises(ValueError, match="sequence length 32 with splash_block_q=256"):
        model.forward(cfg, randomize(model.abstract_params(cfg), seed=0), np.zeros((1, 32), np.int32))
    attention.check_seq_len(cfg, 128, "splash")  # shorter than a block: one block of 128
    attention.check_seq_len(cfg, 512, "splash")
    with pytest.raises(ValueError, match="attention_chunk=24"):
        attention.check_seq_len(tiny_config(attention_chunk=24), 64, "xla")
    with pytest.raises(ValueError, match="act_length"):
        attention._splash_specs(model.ShardingConfig(act_length="tensor").rules)


def test_layer_stack_scans_over_the_repeating_group_of_layer_types():
    assert model.transformer.layer_period(model.get_config("olmo3-7b").layer_types) == 4
    assert model.transformer.layer_period(model.get_config("olmo3-tiny", n_layers=6).layer_types) == 6  # S S S F S F
    assert model.transformer.layer_period(("full_attention",) * 3) == 1


@pytest.mark.slow
@pytest.mark.parametrize("n_layers", [8, 6])
def test_grouped_layer_stack_equals_layers_applied_one_by_one(n_layers):
    """Two groups of 4 (8 layers) and a pattern that does not repeat (6): each layer gets its own
    parameters [i] and its own window, in order."""
    cfg = tiny_config(n_layers=n_layers)
    params = randomize(model.abstract_params(cfg), seed=4)
    tokens = np.random.default_rng(3).integers(0, cfg.vocab_size, size=(2, 32), dtype=np.int32)
    seg = np.repeat([[1, 2], [1, 1]], [13, 19], axis=1).astype(np.int32)
    pos = doc_positions(seg)
    h = jnp.take(params["embed"]["embedding"], tokens, axis=0)

    # both sides one program each, compiled alike (tests/fast_compile.py)
    @functools.partial(jax.jit, compiler_options=fast_compile.OPTIONS)
    def one_by_one(layers, want):
        for i in range(n_layers):
            block = model.layers.Block(cfg, window=cfg.window_of(i))
            layer = jax.tree.map(lambda a: a[i], layers)  # noqa: B023 - tree.map calls it at once
            want = block.apply({"params": layer}, want, seg, pos)[0]
        return want

    want = one_by_one(params["layers"], h)
    got = jax.jit(
        lambda layers, h: model.transformer.run_layers(cfg, layers, h, seg, pos), compiler_options=fast_compile.OPTIONS
    )(params["layers"], h)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5, rtol=1e-5)


def test_the_splash_kernel_annotation_resolves_to_the_kernel_class():
    """Its return annotation names the class where the kernel module defines it (the package does not
    export it), so typing.get_type_hints resolves it."""
    import typing

    from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel

    hints = typing.get_type_hints(attention.splash_kernel)
    assert hints["return"] is splash_attention_kernel.SplashAttentionKernel


def test_the_fused_backward_runs_only_while_its_dq_partials_fit(monkeypatch):
    """splash_fused_bwd asks for the fused dq/dk/dv kernel, whose per-key-block dq partials are
    rows x heads x (T / block_kv) x T x head_dim bf16 (the buffers trainer.compile reports for the
    stock proxy: 256 MiB at 8,192, 4 GiB at 32,768, 16 GiB at 65,536); above FUSED_DQ_BUDGET the
    separate dq and dkv kernels run instead."""
    MiB = 2**20
    assert [attention.fused_dq_bytes(1, 32, t, 2048, 128) // MiB for t in (8192, 32768, 65536)] == [256, 4096, 16384]
    assert attention.fused_dq_bytes(1, 32, 8192, 2048, 128) <= attention.FUSED_DQ_BUDGET  # the 8k recipes keep it
    asked = []
    kernel = attention.splash_kernel

    def recording(*args, **kw):
        asked.append(args[7])  # fused_bwd
        return kernel(*args, **kw)

    monkeypatch.setattr(attention, "splash_kernel", recording)
    cfg = tiny_config(attention_impl="splash", splash_fused_bwd=True, splash_block_q=128, splash_block_kv=128)
    K, G, hd = cfg.n_kv_heads, cfg.n_heads // cfg.n_kv_heads, cfg.head_dim
    # a budget that 128 tokens fit (one key block) and 256 do not (2 key blocks, twice the tokens)
    monkeypatch.setattr(attention, "FUSED_DQ_BUDGET", attention.fused_dq_bytes(1, K * G, 128, 128, hd))
    for length in (128, 256):
        q = jax.ShapeDtypeStruct((1, length, K, G, hd), jnp.float32)
        kv = jax.ShapeDtypeStruct((1, length, K, hd), jnp.float32)
        jax.eval_shape(lambda q, k, v: attention.attend_splash(q, k, v, None, None, cfg, interpret=True), q, kv, kv)
    assert asked == [True, False]


@pytest.mark.parametrize("remat", ["save_attn_mlp_out", "dots_with_no_batch_dims_saveable"])
def test_splash_under_the_long_context_options_computes_the_same_logits_and_gradients(remat):
    """With ``seq_chunk`` (the long recipes' options) splash runs through ``residuals_cut`` (its saved
    output and logsumexp pass an optimization barrier and are named again) and the block's tail
    through ``seq_chunked``: the same logits and gradients as splash without them, under the long
    recipes' remat policy and the 8k recipes'."""
    base = dict(max_seq_len=T, sliding_window=48, attention_impl="splash", remat=remat, **BLOCKS)
    params = randomize(model.abstract_params(tiny_config(**base)), seed=0)
    tokens = np.random.default_rng(1).integers(0, 100, size=SEGMENTS.shape, dtype=np.int32)
    args = (tokens, SEGMENTS, doc_positions(SEGMENTS))
    want_logits, want_grads = _model_logits_and_grads(tiny_config(**base), params, *args)
    logits, grads = _model_logits_and_grads(tiny_config(**base, seq_chunk=T // 4), params, *args)
    assert np.abs(logits - want_logits).max() <= SPLASH_RTOL * np.abs(want_logits).max()
    for (path, g), w in zip(jax.tree_util.tree_flatten_with_path(grads)[0], jax.tree.leaves(want_grads)):
        g, w = np.asarray(g), np.asarray(w)
        assert np.abs(g - w).max() <= SPLASH_RTOL * np.abs(w).max(), jax.tree_util.keystr(path)
