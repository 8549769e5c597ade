"""YaRN RoPE scaling (model.layers, model.config): olmax's rotary frequencies, cos/sin and attention
factor equal OLMo-core's ``YaRNRoPEScalingConfig`` and transformers' ``Olmo3RotaryEmbedding`` (both
in the test extra) at positions up to 65,536; with YaRN off (and on the sliding layers with it on) plain RoPE, whose
frequencies are torch's bits inside jit too.

Tolerances: the inverse frequencies are compared bit for bit (all three compute them with the same
float32 operations in the same order: ``theta ** (2i/hd)``, its reciprocal, the ramp blend). The
cos/sin tables then differ only by the float32 cos/sin implementations (XLA's vs torch's), measured
at 1.2e-7 = one float32 ulp of 1 over 65,537 positions x 128 dims; ``ATOL = 4.8e-7`` (four ulps of
the largest value, the attention factor 1.208) bounds that and is ~1e4 times smaller than the
change plain RoPE instead of YaRN, or the ramp's low end moved (dimension 18 → 21), makes (checked below).
CPU time: ~3 s for the file (tables of 65,537 x 128 float32 in both libraries).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch  # the test extra installs torch (CPU), transformers and ai2-olmo-core
import transformers
from olmo_core.nn.rope import RotaryEmbedding, YaRNRoPEScalingConfig

import model
from model.config import FULL, SLIDING, ModelConfigError
from model.layers import apply_rope, rope_attention_factor, rope_cos_sin, rope_inv_freq, uses_yarn

# OLMo 3 stage 3 (AI2's OLMo-3-1025-7B-long-context.py): YaRN factor 8, beta 32/1, from 8,192 tokens.
STAGE3 = dict(
    rope_scaling="yarn", yarn_factor=8.0, yarn_beta_fast=32.0, yarn_beta_slow=1.0, yarn_original_max_seq_len=8192
)
POSITIONS = 65_536 + 1  # positions 0 .. 65,536
ATOL = 4.8e-7


def _cfg(**overrides) -> model.ModelConfig:
    return model.get_config("olmo3-7b", compute_dtype="float32", **{**STAGE3, **overrides})


def _olmo_core() -> YaRNRoPEScalingConfig:
    return YaRNRoPEScalingConfig(factor=8.0, beta_fast=32, beta_slow=1, old_context_len=8192)


def _hf_rotary(cfg: model.ModelConfig):
    hf_cfg = transformers.Olmo3Config(
        hidden_size=cfg.d_model,
        num_attention_heads=cfg.n_heads,
        head_dim=cfg.head_dim,
        num_hidden_layers=4,
        max_position_embeddings=POSITIONS - 1,
        # OLMo-core's own HF form of its YaRN config, on the full-attention layers only
        rope_parameters={
            FULL: {**_olmo_core().to_hf_config(), "rope_theta": cfg.rope_theta},
            SLIDING: {"rope_type": "default", "rope_theta": cfg.rope_theta},
        },
    )
    return transformers.models.olmo3.modeling_olmo3.Olmo3RotaryEmbedding(hf_cfg)


def test_attention_factor_is_both_libraries_formula():
    cfg = _cfg()
    want = 0.1 * math.log(8) + 1
    assert rope_attention_factor(cfg, yarn=True) == want == _olmo_core().get_attention_rescale_factor()
    hf = _hf_rotary(cfg)
    assert hf.full_attention_attention_scaling == want and hf.sliding_attention_attention_scaling == 1.0
    assert round(want, 4) == 1.2079
    assert rope_attention_factor(cfg, yarn=False) == 1.0
    assert rope_attention_factor(_cfg(yarn_attention_factor=1.5), yarn=True) == 1.5


def test_yarn_frequencies_equal_olmo_core_and_transformers_bit_for_bit():
    cfg = _cfg()
    ours = np.asarray(rope_inv_freq(cfg, yarn=True))
    inv_oc, _ = _olmo_core().compute_scaled_inv_freq(
        theta=int(cfg.rope_theta), dim=cfg.head_dim, device=torch.device("cpu")
    )
    hf = _hf_rotary(cfg)
    np.testing.assert_array_equal(ours, inv_oc.numpy())
    np.testing.assert_array_equal(ours, hf.full_attention_inv_freq.numpy())
    np.testing.assert_array_equal(np.asarray(rope_inv_freq(cfg)), hf.sliding_attention_inv_freq.numpy())
    # YaRN moved the low frequencies (÷ 8) and kept the high ones
    plain = np.asarray(rope_inv_freq(cfg))
    assert ours[0] == plain[0] and np.isclose(ours[-1], plain[-1] / 8, rtol=1e-6, atol=0)


def test_yarn_cos_sin_equal_olmo_core_and_transformers_up_to_65536():
    cfg = _cfg()
    cos, sin = (np.asarray(a) for a in rope_cos_sin(jnp.arange(POSITIONS), cfg, yarn=True))
    rope = RotaryEmbedding(head_size=cfg.head_dim, theta=int(cfg.rope_theta), scaling=_olmo_core())
    sin_oc, cos_oc = rope._get_rotary_embedding(POSITIONS, torch.device("cpu"))
    np.testing.assert_allclose(cos, cos_oc.numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(sin, sin_oc.numpy(), atol=ATOL, rtol=0)
    hf = _hf_rotary(cfg)
    ids = torch.arange(POSITIONS)[None]
    cos_hf, sin_hf = hf(torch.zeros(1), ids, FULL)
    np.testing.assert_allclose(cos, cos_hf[0].numpy(), atol=ATOL, rtol=0)
    np.testing.assert_allclose(sin, sin_hf[0].numpy(), atol=ATOL, rtol=0)
    # the sliding layers keep plain RoPE θ, as HF's sliding_attention rope
    plain_cos, _ = rope_cos_sin(jnp.arange(POSITIONS), cfg, yarn=False)
    np.testing.assert_allclose(np.asarray(plain_cos), hf(torch.zeros(1), ids, SLIDING)[0][0].numpy(), atol=ATOL, rtol=0)
    # the tolerance is sharp: plain RoPE, or the ramp one dimension off, is far outside it
    assert np.abs(np.asarray(plain_cos) - cos).max() > 1e4 * ATOL
    shifted = _cfg(yarn_beta_fast=16.0)  # moves the ramp's low end from dimension 18 to 21
    assert np.abs(np.asarray(rope_cos_sin(jnp.arange(POSITIONS), shifted, yarn=True)[0]) - cos).max() > 1e4 * ATOL


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_yarn_off_gives_every_layer_plain_rope_and_yarn_on_leaves_sliding_layers_alone(dtype):
    off = model.get_config("olmo3-7b", compute_dtype=dtype)
    assert off.rope_scaling == "none"
    x = jnp.asarray(np.random.default_rng(0).standard_normal((2, 256, 4, 128)), dtype=dtype)
    positions = jnp.broadcast_to(jnp.arange(0, POSITIONS, 256)[:256], (2, 256))
    want = np.asarray(apply_rope(x, positions, off))
    # plain RoPE is a rotation by position x θ's frequencies: far from the input at these positions
    assert np.abs(want.astype(np.float32) - np.asarray(x, np.float32)).max() > 0.5
    # with YaRN off the yarn_* fields change nothing; with it on, only the full layers change
    other = model.get_config("olmo3-7b", compute_dtype=dtype, yarn_factor=4.0, yarn_full_attn_layers_only=False)
    np.testing.assert_array_equal(np.asarray(apply_rope(x, positions, other)), want)
    on = model.get_config("olmo3-7b", compute_dtype=dtype, **STAGE3)
    assert not uses_yarn(off, None) and not uses_yarn(on, 4096) and uses_yarn(on, None)
    np.testing.assert_array_equal(np.asarray(apply_rope(x, positions, on, uses_yarn(on, 4096))), want)
    assert np.abs(np.asarray(apply_rope(x, positions, on, True), np.float32) - want.astype(np.float32)).max() > 0.1
    # and inside a jitted program too: the sliding layers of a YaRN model are the unscaled model's
    jitted = jax.jit(lambda c, y, x, p: apply_rope(x, p, c, y), static_argnums=(0, 1))
    np.testing.assert_array_equal(
        np.asarray(jitted(on, False, x, positions)), np.asarray(jitted(off, False, x, positions))
    )


def test_frequencies_are_torch_bits_inside_jit_with_and_without_scaling():
    """jit computes the frequencies of both layer kinds as OLMo-core/HF do, YaRN on or off (traced,
    XLA would fold 1/θ^(2i/hd) to values an ulp off torch's: p·ulp of angle at position p)."""
    cfg = _cfg()
    for yarn in (True, False):
        ref = _hf_rotary(cfg).full_attention_inv_freq if yarn else _hf_rotary(cfg).sliding_attention_inv_freq
        np.testing.assert_array_equal(np.asarray(jax.jit(lambda y=yarn: rope_inv_freq(cfg, y))()), ref.numpy())
    plain = model.get_config("olmo3-7b", compute_dtype="float32")
    ref = _hf_rotary(cfg).sliding_attention_inv_freq.numpy()  # θ 5e5, head_dim 128: the unscaled model's
    np.testing.assert_array_equal(np.asarray(jax.jit(lambda: rope_inv_freq(plain))()), ref)
    exponents = jnp.arange(0, plain.head_dim, 2, dtype=jnp.float32) / plain.head_dim
    traced = np.asarray(jax.jit(lambda e: 1.0 / (plain.rope_theta**e))(exponents))
    assert (traced != ref).any()  # the control: the traced expression is not torch's bits


def test_yarn_layers_follow_full_attn_layers_only():
    full_only = _cfg()
    assert [i for i in range(full_only.n_layers) if full_only.yarn_in(i)] == list(range(3, 32, 4))
    every = _cfg(yarn_full_attn_layers_only=False)
    assert all(every.yarn_in(i) for i in range(every.n_layers)) and uses_yarn(every, 4096)
    assert not any(model.get_config("olmo3-7b").yarn_in(i) for i in range(32))
    assert model.layers.yarn_ramp_bounds(full_only) == (18, 35)  # OLMo-core's low/high for these values


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("rope_scaling", "linear"),
        ("yarn_factor", 1.0),
        ("yarn_factor", float("inf")),
        ("yarn_beta_fast", 0.5),  # not above beta_slow
        ("yarn_beta_slow", 0.0),
        ("yarn_original_max_seq_len", 0),
        ("yarn_attention_factor", -1.0),
        ("yarn_full_attn_layers_only", "yes"),
    ],
)
def test_bad_yarn_settings_are_refused_naming_the_field(field, value):
    with pytest.raises(ModelConfigError) as e:
        _cfg(**{field: value})
    assert e.value.field == field
