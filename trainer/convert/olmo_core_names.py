"""olmax parameters ↔ OLMo-core's ``Transformer`` state dict (OLMo 3's model), one tensor at a time.

OLMo-core's tensors are torch ``nn.Linear`` weights (``[out, in]``), the layout of Hugging Face's
``Olmo3ForCausalLM`` (``model.hf``), under OLMo-core's own names; olmax stacks each layer tensor
over a leading layer axis and splits heads out. The conversions are ``model.hf.LAYER_MAP``'s (one
rule for both formats):

  embeddings.weight                          [Vp, D]     embed/embedding               [Vp, D]
  blocks.i.attention.w_q.weight              [H·hd, D]   layers/attn/q_proj[i]         [D, H, hd]
  blocks.i.attention.w_k.weight / w_v        [K·hd, D]   layers/attn/k_proj[i] / v_proj [D, K, hd]
  blocks.i.attention.w_out.weight            [D, H·hd]   layers/attn/o_proj[i]         [H, hd, D]
  blocks.i.attention.q_norm.weight           [H·hd]      layers/attn/q_norm/scale[i]   [H, hd]
  blocks.i.attention.k_norm.weight           [K·hd]      layers/attn/k_norm/scale[i]   [K, hd]
  blocks.i.attention_norm.weight             [D]         layers/post_attn_norm/scale[i] (OLMo 3's
  blocks.i.feed_forward_norm.weight          [D]         layers/post_mlp_norm/scale[i]  reordered norm)
  blocks.i.feed_forward.w1 / w3 .weight      [F, D]      layers/mlp/gate_proj[i] / up_proj [D, F]
  blocks.i.feed_forward.w2.weight            [D, F]      layers/mlp/down_proj[i]       [F, D]
  lm_head.norm.weight                        [D]         final_norm/scale
  lm_head.w_out.weight                       [Vp, D]     lm_head/kernel                [D, Vp]

The embedding and LM head keep every row olmax allocates (``ModelConfig.padded_vocab_size``): an
OLMo-core model has ``padded_vocab_size()`` rows (100,352 for OLMo 3 7B), and a checkpoint's
rows must match the recipe's, padded rows included (no row is dropped or invented here).
The same names carry SkipStepAdamW's per-parameter state (``exp_avg``, ``exp_avg_sq``): moments
have their parameter's shape and layout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from model.config import ModelConfig
from model.hf import LAYER_MAP, Converter

# model.hf.LAYER_MAP's HF suffix (under model.layers.i) -> OLMo-core's (under blocks.i)
OLMO_LAYER_NAMES = {
    "self_attn.q_proj.weight": "attention.w_q.weight",
    "self_attn.k_proj.weight": "attention.w_k.weight",
    "self_attn.v_proj.weight": "attention.w_v.weight",
    "self_attn.o_proj.weight": "attention.w_out.weight",
    "self_attn.q_norm.weight": "attention.q_norm.weight",
    "self_attn.k_norm.weight": "attention.k_norm.weight",
    "post_attention_layernorm.weight": "attention_norm.weight",
    "post_feedforward_layernorm.weight": "feed_forward_norm.weight",
    "mlp.gate_proj.weight": "feed_forward.w1.weight",
    "mlp.up_proj.weight": "feed_forward.w3.weight",
    "mlp.down_proj.weight": "feed_forward.w2.weight",
}
assert set(OLMO_LAYER_NAMES) == set(LAYER_MAP), "model.hf.LAYER_MAP and OLMo-core's names disagree"


def _same(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w


def _transpose(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w.T


@dataclass(frozen=True)
class Entry:
    """One OLMo-core tensor: its name, where it lives in olmax's params (``path``, and ``layer``:
    the index on the stacked layer axis, None for an unstacked tensor) and the two conversions of
    one slice (olmax's ``params[path][layer]`` ↔ OLMo-core's tensor, numpy, no copy where a view does)."""

    olmo: str
    path: tuple[str, ...]
    layer: int | None
    to_olmo: Converter
    from_olmo: Converter


def entries(cfg: ModelConfig) -> list[Entry]:
    """Every tensor of OLMo-core's OLMo 3 model of ``cfg``, in OLMo-core's order (embedding, blocks
    in layer order, LM head)."""
    out = [Entry("embeddings.weight", ("embed", "embedding"), None, _same, _same)]
    for i in range(cfg.n_layers):
        for hf_suffix, (ours, to_hf, from_hf) in LAYER_MAP.items():
            out.append(Entry(f"blocks.{i}.{OLMO_LAYER_NAMES[hf_suffix]}", ("layers", *ours), i, to_hf, from_hf))
    out.append(Entry("lm_head.norm.weight", ("final_norm", "scale"), None, _same, _same))
    out.append(Entry("lm_head.w_out.weight", ("lm_head", "kernel"), None, _transpose, _transpose))
    return out


def olmax_shapes(cfg: ModelConfig) -> dict[tuple[str, ...], tuple[int, ...]]:
    """{olmax param path: its full (stacked) shape} (``model.hf``'s layout, no JAX)."""
    D, L, V = cfg.d_model, cfg.n_layers, cfg.padded_vocab_size
    H, K, hd, F = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.mlp_hidden
    return {
        ("embed", "embedding"): (V, D),
        ("final_norm", "scale"): (D,),
        ("lm_head", "kernel"): (D, V),
        ("layers", "attn", "q_proj"): (L, D, H, hd),
        ("layers", "attn", "k_proj"): (L, D, K, hd),
        ("layers", "attn", "v_proj"): (L, D, K, hd),
        ("layers", "attn", "o_proj"): (L, H, hd, D),
        ("layers", "attn", "q_norm", "scale"): (L, H, hd),
        ("layers", "attn", "k_norm", "scale"): (L, K, hd),
        ("layers", "post_attn_norm", "scale"): (L, D),
        ("layers", "post_mlp_norm", "scale"): (L, D),
        ("layers", "mlp", "gate_proj"): (L, D, F),
        ("layers", "mlp", "up_proj"): (L, D, F),
        ("layers", "mlp", "down_proj"): (L, F, D),
    }


def olmo_shape(cfg: ModelConfig, e: Entry) -> tuple[int, ...]:
    """The shape OLMo-core holds for ``e`` under ``cfg`` (its slice converted, without data)."""
    return tuple(e.to_olmo(zero_view(olmax_slice_shape(cfg, e)), cfg).shape)


def olmax_slice_shape(cfg: ModelConfig, e: Entry) -> tuple[int, ...]:
    """The shape of ``e``'s slice of its olmax array (the layer axis dropped for a layer tensor)."""
    full = olmax_shapes(cfg)[e.path]
    return full if e.layer is None else full[1:]


def zero_view(shape: tuple[int, ...]) -> np.ndarray:
    """A read-only float32 array of ``shape`` that allocates nothing (every stride 0): the layout
    rules' reshapes and transposes of it allocate nothing either."""
    return np.broadcast_to(np.zeros((), np.float32), shape)


def _get(tree: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = tree
    for key in path:
        node = node[key]
    return node


def iter_to_olmo(cfg: ModelConfig, params: Mapping[str, Any]) -> Iterator[tuple[str, np.ndarray]]:
    """(OLMo-core name, numpy tensor) of every entry of an olmax param tree (any array leaves;
    moments too), one at a time."""
    for e in entries(cfg):
        full = _get(params, e.path)
        piece = np.asarray(full if e.layer is None else full[e.layer])
        yield e.olmo, np.ascontiguousarray(e.to_olmo(piece, cfg))


def to_olmo_state(cfg: ModelConfig, params: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """olmax params (any array tree) -> OLMo-core's model state dict (numpy, OLMo-core's names)."""
    return dict(iter_to_olmo(cfg, params))


def from_olmo_state(
    cfg: ModelConfig, state: Mapping[str, Any], as_numpy: Callable[[Any], np.ndarray] = np.asarray
) -> dict[str, Any]:
    """OLMo-core's model state dict (numpy arrays, or anything ``as_numpy`` reads) -> olmax params
    (numpy, stacked). KeyError naming a missing tensor; ValueError naming one whose shape differs
    (both shapes)."""
    shapes = olmax_shapes(cfg)
    out: dict[str, Any] = {}
    stacks: dict[tuple[str, ...], np.ndarray] = {}
    for e in entries(cfg):
        if e.olmo not in state:
            raise KeyError(f"OLMo-core state lacks tensor {e.olmo!r}")
        w = as_numpy(state[e.olmo])
        want = olmo_shape(cfg, e)
        if tuple(w.shape) != want:
            raise ValueError(f"{e.olmo}: the checkpoint holds {tuple(w.shape)}, the recipe's model needs {want}")
        piece = e.from_olmo(w, cfg)
        if e.layer is None:
            _put(out, e.path, np.array(piece))
            continue
        if e.path not in stacks:
            stacks[e.path] = np.empty(shapes[e.path], piece.dtype)
            _put(out, e.path, stacks[e.path])
        stacks[e.path][e.layer] = piece
    return out


def _put(tree: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value
