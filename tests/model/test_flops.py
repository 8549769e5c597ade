"""Parameter and FLOP accounting match the case study's numbers for both 7B head layouts."""

from __future__ import annotations

import math

import pytest

import model

OLMO3_7B_PARAMS = 7_298_011_136
STEP_TOKENS = 4 * 8192  # one device's batch in the case study: 4 sequences of 8192 tokens
OLMO3_7B_STEP_TFLOPS = 1565


@pytest.mark.parametrize("name", ["olmo3-7b", "olmo3-7b-mxu"])
def test_olmo3_7b_has_7298011136_params_in_both_head_layouts(name):
    assert model.count_params(model.get_config(name)) == OLMO3_7B_PARAMS


def test_mxu_variant_differs_only_in_head_layout():
    stock, mxu = model.get_config("olmo3-7b"), model.get_config("olmo3-7b-mxu")
    assert (stock.n_heads, stock.head_dim, mxu.n_heads, mxu.head_dim) == (32, 128, 16, 256)
    assert stock.q_width == mxu.q_width == stock.d_model
    assert model.matmul_params(stock) == model.matmul_params(mxu)


@pytest.mark.parametrize("name", ["olmo3-7b", "olmo3-7b-mxu"])
def test_olmo3_7b_step_of_4x8192_tokens_is_1565_tflops(name):
    cfg = model.get_config(name)
    tflops = model.flops_per_token(cfg, seq_len=8192) * STEP_TOKENS / 1e12
    assert round(tflops) == OLMO3_7B_STEP_TFLOPS, tflops


def test_flop_formula_terms():
    cfg = model.get_config("olmo3-7b")
    S = 8192
    dense = 6 * model.matmul_params(cfg)
    attn = 6 * cfg.n_layers * cfg.n_heads * cfg.head_dim * S
    assert model.flops_per_token(cfg, S) == dense + attn
    # matmul params = everything but the input embedding and the norm scales
    norms = cfg.n_layers * (2 * cfg.d_model + cfg.q_width + cfg.kv_width) + cfg.d_model
    assert model.matmul_params(cfg) == OLMO3_7B_PARAMS - cfg.vocab_size * cfg.d_model - norms


def test_exact_flops_discount_only_sliding_windows():
    cfg = model.get_config("olmo3-7b")
    S = 8192
    per_key = 12 * cfg.n_heads * cfg.head_dim
    n_full = cfg.layer_types.count("full_attention")
    W = cfg.sliding_window
    # full layer: sum_{q<S}(q+1)/S = (S+1)/2 keys; sliding: (W(W+1)/2 + (S-W)W)/S keys
    expected_attn = per_key * (n_full * (S + 1) / 2 + (cfg.n_layers - n_full) * (W * (W + 1) / 2 + (S - W) * W) / S)
    exact = model.flops_per_token(cfg, S, exact=True)
    assert math.isclose(exact, 6 * model.matmul_params(cfg) + expected_attn, rel_tol=1e-12)
    assert exact < model.flops_per_token(cfg, S)
    # when the window covers the sequence, nothing is discounted (only the +1/2 key of the exact count)
    short = model.flops_per_token(cfg, W, exact=True) - model.flops_per_token(cfg, W)
    assert math.isclose(short, cfg.n_layers * per_key / 2, rel_tol=1e-9)


def test_vocab_padding_is_counted_as_allocated():
    cfg = model.get_config("olmo3-7b", vocab_pad_multiple=128)
    assert cfg.padded_vocab_size == 100352
    shapes = model.abstract_params(cfg)
    assert shapes["embed"]["embedding"].shape == (100352, 4096)
    assert shapes["lm_head"]["kernel"].shape == (4096, 100352)
    assert model.count_params(cfg) == OLMO3_7B_PARAMS + 2 * (100352 - 100278) * 4096
    # FLOPs count useful work only: padding rows add nothing
    assert model.flops_per_token(cfg, 8192) == model.flops_per_token(model.get_config("olmo3-7b"), 8192)


@pytest.mark.parametrize("name", ["olmo3-7b-proxy", "olmo3-7b-proxy-mxu"])
def test_the_one_chip_proxy_has_7b_layers_and_the_32k_vocabulary(name):
    """olmo3-7b's layer widths (D 4096, F 11008, 4096-wide attention in either head layout) with
    the 32,768-id proxy vocabulary: count_params against the parameter count written out by hand."""
    from model.config import PROXY_LAYERS

    cfg = model.get_config(name)
    big = model.get_config("olmo3-7b" + ("-mxu" if name.endswith("mxu") else ""))
    assert (cfg.d_model, cfg.mlp_hidden, cfg.n_heads, cfg.head_dim, cfg.sliding_window) == (
        big.d_model,
        big.mlp_hidden,
        big.n_heads,
        big.head_dim,
        big.sliding_window,
    )
    D, F, V, L = 4096, 11008, 32768, PROXY_LAYERS
    per_layer = 4 * D * D + 3 * D * F + 4 * D  # q k v o, gate up down, q/k-norm + two post-norms
    assert model.count_params(cfg) == L * per_layer + 2 * V * D + D == 673_222_656
    assert cfg.layer_types == model.default_layer_types(L) == ("sliding_attention",) * (L - 1) + ("full_attention",)
    assert model.flops_per_token(cfg, 8192) == 6 * (L * (4 * D * D + 3 * D * F) + D * V) + 6 * L * 4096 * 8192


@pytest.mark.parametrize("name", ["olmo3-7b", "olmo3-7b-mxu"])
def test_attention_flops_state_the_convention_and_what_the_window_needs(name):
    """7B at 8192: 12·H·hd per (query, key); the convention counts S/2 keys per query in all 32 layers;
    the window needs 3072.25 keys per query on average in the 24 sliding layers ((4096·4097/2 +
    4096·4096) / 8192) and 4096.5 in the 8 full ones."""
    from model.flops import attention_flops_per_token

    per_key = 12 * 4096
    got = attention_flops_per_token(model.get_config(name), 8192)
    assert got["dense_causal"] == 32 * per_key * 4096 == pytest.approx(6.44e9, rel=1e-3)
    assert got["windowed"] == pytest.approx(24 * per_key * 3072.25 + 8 * per_key * 4096.5, rel=1e-12)
    assert got["windowed"] / got["dense_causal"] == pytest.approx(0.8126, abs=1e-4)
