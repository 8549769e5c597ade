"""Parity with Hugging Face ``Olmo3ForCausalLM`` (float32, CPU) in both conversion directions."""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import numpy as np
import pytest
import torch  # the test extra installs torch (CPU) and transformers: no skipping when absent
import transformers
from olmo_core.nn.rope import YaRNRoPEScalingConfig

import model
from model.config import FULL, SLIDING
from tests.model.tiny import SEQ_LEN, TINY

ATOL = 1e-4
# load_hf with the checkpoint's own dtype (float32): the difference to HF is float32 rounding
# (measured 4.2e-6 on logits up to 3.3; HF's own sdpa vs eager differ by 2.1e-6), while bfloat16
# matmuls are off by ~7e-2.
TIGHT_ATOL = 1e-5
# OLMo 3 stage 3's YaRN in HF's form, as OLMo-core's YaRNRoPEScalingConfig.to_hf_config() writes it
# (factor 8, beta 32/1, original context 8,192, attention factor 0.1·ln 8 + 1), with RoPE θ.
YARN_HF = {
    **YaRNRoPEScalingConfig(factor=8.0, beta_fast=32, beta_slow=1, old_context_len=8192).to_hf_config(),
    "rope_theta": 500_000.0,
}
# YaRN on the full-attention layers only; the sliding-window layers keep plain RoPE θ.
YARN_FULL_ONLY = {FULL: YARN_HF, SLIDING: {"rope_type": "default", "rope_theta": 500_000.0}}
YARN_SEQ = 8192  # the parity sequence: YaRN's original context, 1,024 times the window


def _hf_tiny(seed: int, attn_implementation: str, **overrides):
    torch.manual_seed(seed)
    max_len = overrides.pop("max_position_embeddings", TINY["max_seq_len"])
    hf_cfg = transformers.Olmo3Config(
        vocab_size=TINY["vocab_size"],
        hidden_size=TINY["d_model"],
        intermediate_size=TINY["mlp_hidden"],
        num_hidden_layers=TINY["n_layers"],
        num_attention_heads=TINY["n_heads"],
        num_key_value_heads=TINY["n_kv_heads"],
        max_position_embeddings=max_len,
        sliding_window=TINY["sliding_window"],
        rms_norm_eps=1e-6,
        pad_token_id=1,
        eos_token_id=2,
        attn_implementation=attn_implementation,
        **overrides,
    )
    assert hf_cfg.layer_types == ["sliding_attention"] * 3 + ["full_attention"]
    hf = transformers.Olmo3ForCausalLM(hf_cfg).eval()
    with torch.no_grad():  # weights large enough (and norms non-trivial) that every one matters
        for name, p in hf.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    return hf


def _hf_logits(hf, tokens: np.ndarray) -> np.ndarray:
    with torch.no_grad():
        return hf(torch.from_numpy(tokens.astype(np.int64))).logits.float().numpy()


@pytest.fixture(scope="module")
def hf_checkpoint(tmp_path_factory):
    hf = _hf_tiny(seed=0, attn_implementation="eager")
    path = str(tmp_path_factory.mktemp("hf_tiny"))
    hf.save_pretrained(path)
    return hf, path


@pytest.fixture(scope="module")
def hf_checkpoint_config(hf_checkpoint) -> dict:
    with open(os.path.join(hf_checkpoint[1], "config.json")) as f:
        return json.load(f)


@pytest.mark.slow
def test_hf_checkpoint_loads_with_matching_logits(hf_checkpoint, tokens):
    hf, path = hf_checkpoint
    cfg, params = model.load_hf(path, compute_dtype="float32")
    assert cfg.layer_types == ("sliding_attention",) * 3 + ("full_attention",)
    assert cfg.sliding_window == TINY["sliding_window"] < SEQ_LEN
    assert (cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.rms_norm_eps) == (4, 2, 16, 1e-6)
    expected = _hf_logits(hf, tokens)
    ours = np.asarray(model.forward(cfg, params, tokens))
    assert np.abs(expected).max() > 1.0  # logits are not vanishingly small
    np.testing.assert_allclose(ours, expected, atol=ATOL, rtol=0)
    # the comparison is sharp enough to see a one-key shift of the sliding window
    for shifted in (cfg.sliding_window - 1, cfg.sliding_window + 1):
        off = np.asarray(
            model.forward(model.ModelConfig(**{**cfg.__dict__, "sliding_window": shifted}), params, tokens)
        )
        assert np.abs(off - expected).max() > 100 * ATOL


@pytest.mark.slow
def test_float32_checkpoint_runs_float32_matmuls_by_default(hf_checkpoint, tokens):
    """As ``from_pretrained(dtype="auto")``: the checkpoint's dtype is the compute dtype."""
    hf, path = hf_checkpoint
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["dtype"] == "float32"
    cfg, params = model.load_hf(path)
    assert (cfg.compute_dtype, cfg.param_dtype) == ("float32", "float32")
    expected = _hf_logits(hf, tokens)
    np.testing.assert_allclose(np.asarray(model.forward(cfg, params, tokens)), expected, atol=TIGHT_ATOL, rtol=0)
    # An explicit compute_dtype still wins, and bfloat16 matmuls are far outside that tolerance.
    bf16, _ = model.load_hf(path, compute_dtype="bfloat16")
    assert bf16.compute_dtype == "bfloat16"
    assert np.abs(np.asarray(model.forward(bf16, params, tokens)) - expected).max() > 100 * TIGHT_ATOL


@pytest.mark.slow
def test_checkpoint_dtype_is_read_from_dtype_or_torch_dtype(hf_checkpoint):
    _, path = hf_checkpoint
    with open(os.path.join(path, "config.json")) as f:
        base = {k: v for k, v in json.load(f).items() if k not in ("dtype", "torch_dtype")}
    assert model.hf.config_from_hf({**base, "dtype": "bfloat16"}).compute_dtype == "bfloat16"
    assert model.hf.config_from_hf({**base, "torch_dtype": "float32"}).compute_dtype == "float32"
    assert model.hf.config_from_hf({**base, "torch_dtype": "float16"}).compute_dtype == "float16"
    assert model.hf.config_from_hf(base).compute_dtype == model.ModelConfig().compute_dtype
    with pytest.raises(ValueError, match="checkpoint dtype 'int8' is not one of"):
        model.hf.config_from_hf({**base, "dtype": "int8"})
    assert model.hf.config_from_hf({**base, "dtype": "int8"}, compute_dtype="float32").compute_dtype == "float32"


def test_save_hf_loads_in_transformers_with_matching_logits(tiny_cfg, tiny_params, tokens, tmp_path):
    path = str(tmp_path / "ours")
    model.save_hf(tiny_cfg, tiny_params, path)
    with open(os.path.join(path, "config.json")) as f:
        assert json.load(f)["layer_types"] == list(tiny_cfg.layer_types)
    hf = transformers.Olmo3ForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    assert next(hf.parameters()).dtype == torch.float32
    expected = _hf_logits(hf, tokens)
    ours = np.asarray(model.forward(tiny_cfg, tiny_params, tokens))
    np.testing.assert_allclose(ours, expected, atol=ATOL, rtol=0)
    # and back: load_hf(save_hf(params)) is the identity on the parameters
    cfg2, params2 = model.load_hf(path, compute_dtype="float32")
    assert cfg2.layer_types == tiny_cfg.layer_types and cfg2.n_kv_heads == tiny_cfg.n_kv_heads
    jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), tiny_params, params2)


@pytest.mark.slow
def test_bf16_checkpoint_loads_as_fp32_params(hf_checkpoint, tmp_path):
    hf, _ = hf_checkpoint
    path = str(tmp_path / "bf16")
    hf.to(torch.bfloat16).save_pretrained(path)
    hf.to(torch.float32)
    cfg, params = model.load_hf(path)
    assert cfg.compute_dtype == "bfloat16"  # the checkpoint's dtype; parameters are still stored float32
    emb = params["embed"]["embedding"]
    assert emb.dtype == np.float32
    want = hf.model.embed_tokens.weight.detach().to(torch.bfloat16).float().numpy()
    np.testing.assert_array_equal(emb, want)


@pytest.mark.slow
def test_hf_config_variants_are_read(hf_checkpoint):
    _, path = hf_checkpoint
    with open(os.path.join(path, "config.json")) as f:
        base = json.load(f)
    single = {**base, "rope_parameters": {"rope_type": "default", "rope_theta": 10000}}
    assert model.hf.config_from_hf(single).rope_theta == 10000.0
    legacy = {k: v for k, v in base.items() if k not in ("rope_parameters", "layer_types")}
    legacy["rope_theta"] = 20000.0
    cfg = model.hf.config_from_hf(legacy)
    assert cfg.rope_theta == 20000.0
    assert cfg.layer_types == tuple(transformers.Olmo3Config(num_hidden_layers=cfg.n_layers).layer_types)


@pytest.mark.slow
def test_load_hf_rejects_what_it_does_not_implement(hf_checkpoint, tmp_path):
    _, path = hf_checkpoint
    with open(os.path.join(path, "config.json")) as f:
        base = json.load(f)
    for key, value, message in (
        ("model_type", "llama", "expected model_type 'olmo3', got 'llama'"),
        ("tie_word_embeddings", True, "unsupported tie_word_embeddings=True"),
        (
            "rope_parameters",
            {"rope_type": "llama3", "factor": 4.0, "rope_theta": 1e4},
            r"unsupported RoPE scaling \['llama3'\]",
        ),
        (
            "rope_parameters",
            {"sliding_attention": YARN_HF, "full_attention": {"rope_type": "default", "rope_theta": 5e5}},
            "YaRN on the sliding-window layers only is not supported",
        ),
        (
            "rope_parameters",
            {"sliding_attention": {**YARN_HF, "factor": 4.0}, "full_attention": YARN_HF},
            "different YaRN parameters per layer type are not supported",
        ),
        ("rope_parameters", {**YARN_HF, "mscale": 0.707}, r"unsupported YaRN rope_parameters keys \['mscale'\]"),
        ("rope_parameters", {**YARN_HF, "truncate": False}, "unsupported YaRN rope_parameters keys"),
    ):
        with pytest.raises(ValueError, match=message):
            model.hf.config_from_hf({**base, key: value})


@pytest.mark.slow
def test_yarn_checkpoint_loads_with_matching_logits_at_8192_tokens(tmp_path):
    """YaRN on the full layers only, as HF's Olmo3ForCausalLM runs it: fp32 logits within 1e-5."""
    hf = _hf_tiny(seed=3, attn_implementation="sdpa", max_position_embeddings=65_536, rope_parameters=YARN_FULL_ONLY)
    path = str(tmp_path / "yarn")
    hf.save_pretrained(path)
    cfg, params = model.load_hf(path, attention_chunk=1024)  # chunked: no [T, T] scores at 8,192
    assert (cfg.rope_scaling, cfg.yarn_full_attn_layers_only, cfg.compute_dtype) == ("yarn", True, "float32")
    assert (cfg.yarn_factor, cfg.yarn_beta_fast, cfg.yarn_beta_slow, cfg.yarn_original_max_seq_len) == (8, 32, 1, 8192)
    assert cfg.yarn_attention_factor == pytest.approx(1.2079, abs=1e-4)
    assert cfg.sliding_window < YARN_SEQ
    tokens = np.random.default_rng(5).integers(0, TINY["vocab_size"], size=(1, YARN_SEQ), dtype=np.int32)
    expected = _hf_logits(hf, tokens)
    np.testing.assert_allclose(np.asarray(model.forward(cfg, params, tokens)), expected, atol=TIGHT_ATOL, rtol=0)
    # sharp: without YaRN, or with it on every layer, the logits are far outside the tolerance
    for other in (
        dataclasses.replace(cfg, rope_scaling="none"),
        dataclasses.replace(cfg, yarn_full_attn_layers_only=False),
    ):
        assert np.abs(np.asarray(model.forward(other, params, tokens)) - expected).max() > 100 * TIGHT_ATOL


def test_yarn_rope_parameters_round_trip_hf_olmax_hf(hf_checkpoint_config):
    base = hf_checkpoint_config
    for rope in (YARN_FULL_ONLY, {t: YARN_HF for t in (FULL, SLIDING)}):
        cfg = model.hf.config_from_hf({**base, "rope_parameters": rope})
        assert cfg.yarn_full_attn_layers_only == (rope[SLIDING]["rope_type"] == "default")
        assert model.hf.hf_config_dict(cfg)["rope_parameters"] == rope
    # and olmax -> HF -> olmax, with the attention factor left to the formula
    for full_only in (True, False):
        cfg = model.hf.config_from_hf(base, rope_scaling="yarn", yarn_factor=4.0, yarn_full_attn_layers_only=full_only)
        assert model.hf.config_from_hf({**base, **model.hf.hf_config_dict(cfg)}) == cfg
    # the plain form is unchanged
    plain = model.hf.config_from_hf(base)
    assert plain.rope_scaling == "none"
    assert model.hf.hf_config_dict(plain)["rope_parameters"] == {
        t: {"rope_type": "default", "rope_theta": 500_000.0} for t in (SLIDING, FULL)
    }


def test_save_hf_with_yarn_loads_in_transformers_with_matching_logits(tiny_cfg, tiny_params, tokens, tmp_path):
    cfg = dataclasses.replace(tiny_cfg, rope_scaling="yarn", yarn_original_max_seq_len=16)  # the ramp within seq 32
    path = str(tmp_path / "ours-yarn")
    model.save_hf(cfg, tiny_params, path)
    hf = transformers.Olmo3ForCausalLM.from_pretrained(path, attn_implementation="sdpa").eval()
    assert hf.config.rope_parameters[FULL]["rope_type"] == "yarn"
    assert hf.config.rope_parameters[SLIDING]["rope_type"] == "default"
    expected = _hf_logits(hf, tokens)
    np.testing.assert_allclose(np.asarray(model.forward(cfg, tiny_params, tokens)), expected, atol=ATOL, rtol=0)
    assert np.abs(np.asarray(model.forward(tiny_cfg, tiny_params, tokens)) - expected).max() > 100 * ATOL
