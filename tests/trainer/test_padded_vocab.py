"""`vocab_padding`: the padded embedding/LM-head rows (`vocab_pad_multiple`) masked out of the
softmax (olmax's default) or in it, as AI2 trains OLMo 3 (`unmasked`: OLMo-core's
`padded_vocab_size()` rows all in the log-normaliser and the z-loss). With an LM head of zeros
every logit is 0, so a target's loss is exactly ln(rows the softmax runs over): ln 500 masked,
ln 512 unmasked, on every loss path the trainer has (full logits, chunked, the fused backward)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import model
from model.config import ModelConfigError
from tests import fast_compile
from trainer import mesh as mesh_lib
from trainer import step as step_lib
from trainer.config.schema import TrainConfig

V, MULTIPLE, VP = 500, 128, 512
FAST = fast_compile.OPTIONS


def train_config(padding: str) -> TrainConfig:
    overrides = {"compute_dtype": "float32", "n_layers": 2, "vocab_size": V, "vocab_pad_multiple": MULTIPLE}
    overrides |= {"vocab_padding": padding, "eos_id": V - 1, "pad_id": V - 2, "ranks_sha256": None}
    return TrainConfig(model="olmo3-tiny", model_overrides=overrides)


def zero_head_state(cfg: TrainConfig) -> tuple[dict, dict]:
    mc = cfg.model_cfg()
    params = jax.jit(model.init, static_argnums=0, compiler_options=FAST)(mc, jax.random.key(0))
    params["lm_head"]["kernel"] = jnp.zeros_like(params["lm_head"]["kernel"])
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, V - 2, (2, 16)), jnp.int32)
    return params, {"tokens": tokens, "loss_mask": jnp.ones_like(tokens)}


@pytest.mark.parametrize("padding, rows", [("masked", V), ("unmasked", VP)])
def test_the_scored_rows_are_the_true_vocabulary_masked_and_every_padded_row_unmasked(padding, rows):
    mc = train_config(padding).model_cfg()
    assert mc.padded_vocab_size == VP and mc.scored_vocab_size == rows
    params, batch = zero_head_state(train_config(padding))
    logits = jax.jit(model.forward, static_argnums=0, compiler_options=FAST)(mc, params, batch["tokens"])
    assert logits.shape == (2, 16, rows)


@pytest.mark.parametrize("loss_chunk, fused", [(0, False), (8, False), (8, True)], ids=["full", "chunked", "fused"])
@pytest.mark.parametrize("padding, rows", [("masked", V), ("unmasked", VP)])
def test_a_zero_head_costs_ln_of_the_scored_rows_per_target_on_every_loss_path(loss_chunk, fused, padding, rows):
    cfg = train_config(padding)
    mc, mesh = cfg.model_cfg(), mesh_lib.make_mesh(cfg.mesh)
    params, batch = zero_head_state(cfg)
    args = (mc, model.ShardingConfig(), mesh, False, loss_chunk)
    if fused:
        run = jax.jit(lambda p, b: step_lib._objective(*args, p, b, 1.0, 1.0)[1], compiler_options=FAST)
    else:
        run = jax.jit(lambda p, b: step_lib._forward(*args, p, b), compiler_options=FAST)
    sums = run(params, batch)
    n = float(sums.tokens)
    assert n == 2 * 15
    np.testing.assert_allclose(float(sums.ce) / n, math.log(rows), rtol=1e-6)
    np.testing.assert_allclose(float(sums.z) / n, math.log(rows) ** 2, rtol=1e-6)


def test_an_unknown_vocab_padding_is_refused_naming_the_field():
    with pytest.raises(ModelConfigError, match="vocab_padding='ai2'; expected one of \\('masked', 'unmasked'\\)"):
        model.get_config("olmo3-tiny", vocab_padding="ai2")
    assert model.get_config("olmo3-tiny").vocab_padding == "masked"  # today's behaviour stays the default
