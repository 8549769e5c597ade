"""Tiny float32 OLMo 3 configs and weight randomisation shared by the model tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import model

# A small vocabulary keeps the tiny models fast; every other structural feature is kept:
# GQA (4 query heads, 2 kv heads), 3 sliding + 1 full layer, window shorter than SEQ_LEN.
TINY = dict(
    vocab_size=256,
    d_model=64,
    n_layers=4,
    n_heads=4,
    n_kv_heads=2,
    head_dim=16,
    mlp_hidden=96,
    sliding_window=8,
    max_seq_len=128,
    compute_dtype="float32",
)
SEQ_LEN = 32


def tiny_config(**overrides) -> model.ModelConfig:
    return model.get_config("olmo3-tiny", **{**TINY, **overrides})


def randomize(params: dict, seed: int, std: float = 0.1) -> dict:
    """Larger-than-init random weights and non-unit norm scales, so every parameter matters.

    params: any pytree with ``.shape`` leaves (e.g. ``model.abstract_params(cfg)``).
    """
    leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
    rng = np.random.default_rng(seed)
    out = []
    for path, x in leaves:
        is_norm = any(getattr(k, "key", None) == "scale" for k in path)
        noise = rng.standard_normal(x.shape).astype(np.float32)
        out.append(jnp.asarray(1.0 + 0.2 * noise if is_norm else std * noise))
    return jax.tree.unflatten(treedef, out)
