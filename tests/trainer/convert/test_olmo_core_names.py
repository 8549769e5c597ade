"""trainer.convert.olmo_core_names: olmax params ↔ OLMo-core's state dict, the same tensors as
OLMo-core's own HF reader makes of olmax's HF writer's output (one layout rule, model.hf's)."""

from __future__ import annotations

import os
import tempfile

import jax
import numpy as np
import pytest

import model
from model.config import ModelConfig
from trainer.convert import olmo_core_names as names

CFG = ModelConfig(
    name="t", vocab_size=96, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, mlp_hidden=48,
    layer_types=("sliding_attention", "full_attention"), sliding_window=8, compute_dtype="float32",
)  # fmt: skip


def _params(cfg: ModelConfig = CFG) -> dict:
    return jax.tree.map(np.array, model.init(cfg, jax.random.key(0)))


def test_mapping_is_olmo_cores_hf_reader_of_olmax_hf_writer():
    """Every tensor, name and value, equals what OLMo-core's convert_state_from_hf makes of
    model.hf.save_hf's file (grouped-query heads: K < H, so q and k/v layouts differ)."""
    import torch
    import transformers
    from olmo_core.nn.hf.convert import convert_state_from_hf
    from safetensors.numpy import load_file

    from model.hf import WEIGHTS_FILE, hf_config_dict, save_hf

    params = _params()
    ours = names.to_olmo_state(CFG, params)
    with tempfile.TemporaryDirectory() as tmp:
        save_hf(CFG, params, tmp)
        hf = {k: torch.from_numpy(v.copy()) for k, v in load_file(os.path.join(tmp, WEIGHTS_FILE)).items()}
    d = hf_config_dict(CFG)
    hf_cfg = transformers.Olmo3Config(**{k: v for k, v in d.items() if k not in ("architectures", "model_type")})
    theirs = convert_state_from_hf(hf_cfg, hf, model_type="olmo3")
    assert ours.keys() == theirs.keys()
    for k in ours:
        np.testing.assert_array_equal(ours[k], theirs[k].numpy(), err_msg=k)
        assert ours[k].shape == names.olmo_shape(CFG, next(e for e in names.entries(CFG) if e.olmo == k))


def test_round_trip_is_exact_and_keeps_padded_vocab_rows():
    cfg = ModelConfig(**{**CFG.__dict__, "vocab_pad_multiple": 64})
    params = _params(cfg)
    params["embed"]["embedding"][cfg.vocab_size :] = 1.5  # trained padded rows travel both ways
    state = names.to_olmo_state(cfg, params)
    assert state["embeddings.weight"].shape == (128, 32) and state["lm_head.w_out.weight"].shape == (128, 32)
    back = names.from_olmo_state(cfg, state)
    for (p, a), b in zip(jax.tree_util.tree_flatten_with_path(params)[0], jax.tree.leaves(back)):
        np.testing.assert_array_equal(a, b, err_msg=str(p))


def test_a_shape_that_differs_is_named_with_both_shapes():
    state = names.to_olmo_state(CFG, _params())
    wide = {**state, "blocks.1.feed_forward.w2.weight": np.zeros((32, 64), np.float32)}
    with pytest.raises(ValueError, match=r"blocks\.1\.feed_forward\.w2\.weight: .*\(32, 64\).*\(32, 48\)"):
        names.from_olmo_state(CFG, wide)
    del state["lm_head.norm.weight"]
    with pytest.raises(KeyError, match="lm_head.norm.weight"):
        names.from_olmo_state(CFG, state)
