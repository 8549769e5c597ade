"""Hugging Face ``Olmo3ForCausalLM`` checkpoints ↔ our params (config.json + safetensors, no torch).

Name and layout mapping (HF ``nn.Linear.weight`` is ``[out, in]``; ours are ``[in, out]`` with
heads split out):

  model.embed_tokens.weight              [V, D]      embed/embedding            [V, D]
  model.layers.i.self_attn.q_proj.weight [H·hd, D]   layers/attn/q_proj[i]      [D, H, hd]
  model.layers.i.self_attn.k_proj.weight [K·hd, D]   layers/attn/k_proj[i]      [D, K, hd]
  model.layers.i.self_attn.v_proj.weight [K·hd, D]   layers/attn/v_proj[i]      [D, K, hd]
  model.layers.i.self_attn.o_proj.weight [D, H·hd]   layers/attn/o_proj[i]      [H, hd, D]
  model.layers.i.self_attn.q_norm.weight [H·hd]      layers/attn/q_norm/scale[i] [H, hd]
  model.layers.i.self_attn.k_norm.weight [K·hd]      layers/attn/k_norm/scale[i] [K, hd]
  model.layers.i.post_attention_layernorm.weight     layers/post_attn_norm/scale[i]
  model.layers.i.post_feedforward_layernorm.weight   layers/post_mlp_norm/scale[i]
  model.layers.i.mlp.{gate,up}_proj.weight [F, D]    layers/mlp/{gate,up}_proj[i] [D, F]
  model.layers.i.mlp.down_proj.weight    [D, F]      layers/mlp/down_proj[i]    [F, D]
  model.norm.weight                      [D]         final_norm/scale
  lm_head.weight                         [V, D]      lm_head/kernel             [D, V]

Vocabulary padding rows (``vocab_pad_multiple``) are dropped on save and zero-filled on load (an
HF checkpoint has none: with ``vocab_padding="unmasked"`` those zero rows score logit 0, not the
trained rows of AI2's OLMo-core checkpoint; continue AI2's run from its OLMo-core checkpoint).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from contract.errors import Refused
from model.config import DTYPES, FULL, LAYER_TYPES, SLIDING, ModelConfig

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
MODEL_TYPE = "olmo3"

# name suffix under model.layers.i → (our path under "layers", to_hf, from_hf given cfg)
Converter = Callable[[np.ndarray, ModelConfig], np.ndarray]


def _proj_to_hf(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:  # [D, N, hd] -> [N·hd, D]
    return w.reshape(w.shape[0], -1).T


def _q_from_hf(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w.T.reshape(cfg.d_model, cfg.n_heads, cfg.head_dim)


def _kv_from_hf(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w.T.reshape(cfg.d_model, cfg.n_kv_heads, cfg.head_dim)


def _o_to_hf(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:  # [H, hd, D] -> [D, H·hd]
    return w.reshape(-1, w.shape[-1]).T


def _o_from_hf(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w.T.reshape(cfg.n_heads, cfg.head_dim, cfg.d_model)


def _flat(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w.reshape(-1)


def _transpose(w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    return w.T


LAYER_MAP: dict[str, tuple[tuple[str, ...], Converter, Converter]] = {
    "self_attn.q_proj.weight": (("attn", "q_proj"), _proj_to_hf, _q_from_hf),
    "self_attn.k_proj.weight": (("attn", "k_proj"), _proj_to_hf, _kv_from_hf),
    "self_attn.v_proj.weight": (("attn", "v_proj"), _proj_to_hf, _kv_from_hf),
    "self_attn.o_proj.weight": (("attn", "o_proj"), _o_to_hf, _o_from_hf),
    "self_attn.q_norm.weight": (("attn", "q_norm", "scale"), _flat, lambda w, c: w.reshape(c.n_heads, c.head_dim)),
    "self_attn.k_norm.weight": (("attn", "k_norm", "scale"), _flat, lambda w, c: w.reshape(c.n_kv_heads, c.head_dim)),
    "post_attention_layernorm.weight": (("post_attn_norm", "scale"), _flat, _flat),
    "post_feedforward_layernorm.weight": (("post_mlp_norm", "scale"), _flat, _flat),
    "mlp.gate_proj.weight": (("mlp", "gate_proj"), _transpose, _transpose),
    "mlp.up_proj.weight": (("mlp", "up_proj"), _transpose, _transpose),
    "mlp.down_proj.weight": (("mlp", "down_proj"), _transpose, _transpose),
}


def _get(tree: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        tree = tree[key]
    return tree


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        tree = tree.setdefault(key, {})
    tree[path[-1]] = value


def hf_config_dict(cfg: ModelConfig) -> dict:
    """``config.json`` contents for an ``Olmo3ForCausalLM`` equivalent to ``cfg``."""
    return {
        "architectures": ["Olmo3ForCausalLM"],
        "model_type": MODEL_TYPE,
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.mlp_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": cfg.max_seq_len,
        "initializer_range": cfg.init_std,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_parameters": hf_rope_parameters(cfg),
        "sliding_window": cfg.sliding_window,
        "layer_types": list(cfg.layers),
        "attention_bias": False,
        "attention_dropout": 0.0,
        "tie_word_embeddings": False,
        # ids outside the vocabulary (toy vocabularies) would make HF's embedding reject them
        "pad_token_id": cfg.pad_id if cfg.pad_id < cfg.vocab_size else None,
        "eos_token_id": cfg.eos_id if cfg.eos_id < cfg.vocab_size else None,
        "bos_token_id": None,
        "use_cache": True,
        "dtype": "float32",
    }


def _rope_per_type(hf: dict) -> dict[str, dict]:
    """Each layer type's RoPE dict as HF reads it: ``rope_parameters`` per layer type, or one dict
    (``rope_parameters`` or the legacy ``rope_scaling``) for every type; a type without one is the
    default rope with the top-level ``rope_theta``."""
    rope = hf.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise ValueError(f"rope_parameters={rope!r} is not a dict")
    if any(isinstance(rope.get(t), dict) for t in LAYER_TYPES):
        per_type = {t: dict(rope[t]) if isinstance(rope.get(t), dict) else {} for t in LAYER_TYPES}
    else:
        single = dict(rope)
        if isinstance(hf.get("rope_scaling"), dict):  # the pre-5 form of the same dict
            single = {**hf["rope_scaling"], **single}
        per_type = {t: dict(single) for t in LAYER_TYPES}
    for r in per_type.values():
        r.setdefault("rope_theta", hf.get("rope_theta", 500_000.0))
        r["rope_type"] = r.get("rope_type", r.get("type", "default"))
    return per_type


# YaRN keys olmax represents (HF's names → ModelConfig fields); mscale/mscale_all_dim (DeepSeek's
# attention factor), truncate=false and partial rotary are refused: olmax cannot compute them.
_YARN_FIELDS = {
    "factor": "yarn_factor",
    "beta_fast": "yarn_beta_fast",
    "beta_slow": "yarn_beta_slow",
    "original_max_position_embeddings": "yarn_original_max_seq_len",
    "attention_factor": "yarn_attention_factor",
}
_YARN_IGNORED = {"rope_type", "type", "rope_theta"}


def _yarn_fields(r: dict, hf: dict) -> dict[str, Any]:
    """The yarn_* ModelConfig fields of one ``rope_type: "yarn"`` dict, with HF's defaults
    (beta 32/1, original length = max_position_embeddings, factor = their ratio)."""
    extra = sorted(set(r) - set(_YARN_FIELDS) - _YARN_IGNORED - {"truncate"})
    if extra or r.get("truncate", True) is not True:
        raise ValueError(
            f"unsupported YaRN rope_parameters keys {extra or ['truncate=false']}: olmax implements {sorted(_YARN_FIELDS)}"
        )
    original = r.get("original_max_position_embeddings") or hf.get("max_position_embeddings", 8192)
    factor = r.get("factor") or hf.get("max_position_embeddings", 8192) / original
    return {
        "yarn_factor": factor,
        "yarn_beta_fast": r.get("beta_fast") or 32.0,
        "yarn_beta_slow": r.get("beta_slow") or 1.0,
        "yarn_original_max_seq_len": original,
        "yarn_attention_factor": r.get("attention_factor"),
    }


def _rope_fields(hf: dict) -> dict[str, Any]:
    """``rope_theta`` and the ``rope_scaling``/``yarn_*`` ModelConfig fields of an HF config: plain
    RoPE everywhere, YaRN on the full-attention layers only, or the same YaRN on every layer; any
    other form (other scalings, per-type thetas, YaRN on the sliding layers only, different YaRN
    per type) is refused."""
    per_type = _rope_per_type(hf)
    thetas = {float(r["rope_theta"]) for r in per_type.values()}
    if len(thetas) != 1:
        raise ValueError(f"different rope_theta per layer type {sorted(thetas)} is not supported")
    kinds = {t: r["rope_type"] for t, r in per_type.items()}
    if set(kinds.values()) - {"default", "yarn"}:
        raise ValueError(
            f"unsupported RoPE scaling {sorted(set(kinds.values()))}: olmax implements 'default' and 'yarn'"
        )
    fields: dict[str, Any] = {"rope_theta": thetas.pop()}
    if kinds[FULL] == "default":
        if kinds[SLIDING] == "yarn":
            raise ValueError(
                "YaRN on the sliding-window layers only is not supported (yarn on full_attention or on both)"
            )
        return fields
    yarn = _yarn_fields(per_type[FULL], hf)
    if kinds[SLIDING] == "yarn" and _yarn_fields(per_type[SLIDING], hf) != yarn:
        raise ValueError("different YaRN parameters per layer type are not supported")
    return {**fields, **yarn, "rope_scaling": "yarn", "yarn_full_attn_layers_only": kinds[SLIDING] != "yarn"}


def hf_rope_parameters(cfg: ModelConfig) -> dict[str, dict]:
    """HF's per-layer-type ``rope_parameters`` of ``cfg`` (what transformers' ``Olmo3RotaryEmbedding``
    reads): ``"default"`` rope, and ``"yarn"`` (OLMo-core's ``to_hf_config`` keys) on the layer
    types ``cfg`` scales."""
    plain = {"rope_type": "default", "rope_theta": float(cfg.rope_theta)}
    yarn = {
        **plain,
        "rope_type": "yarn",
        "factor": float(cfg.yarn_factor),
        "beta_fast": float(cfg.yarn_beta_fast),
        "beta_slow": float(cfg.yarn_beta_slow),
        "original_max_position_embeddings": cfg.yarn_original_max_seq_len,
    }
    if cfg.yarn_attention_factor is not None:  # else HF computes 0.1·ln(factor) + 1, as olmax does
        yarn["attention_factor"] = float(cfg.yarn_attention_factor)
    scaled = {t: cfg.rope_scaling == "yarn" and (t == FULL or not cfg.yarn_full_attn_layers_only) for t in LAYER_TYPES}
    return {t: dict(yarn if scaled[t] else plain) for t in LAYER_TYPES}


def checkpoint_dtype(hf: dict) -> str | None:
    """The checkpoint's ``dtype`` (``torch_dtype`` in older files) as a numpy dtype name, or None.

    Raises ValueError for a dtype we cannot compute in (e.g. a quantised checkpoint)."""
    value = hf.get("dtype", hf.get("torch_dtype"))
    if value is None or value == "auto":
        return None
    name = str(value).removeprefix("torch.")
    if name not in DTYPES:
        raise ValueError(f"checkpoint dtype {value!r} is not one of {DTYPES}; pass compute_dtype=... to load it")
    return name


# The fields of an Olmo3ForCausalLM config.json that have no default (what each holds: a refusal says it)
REQUIRED_FIELDS = {
    "vocab_size": "the vocabulary size, an integer (100278 for OLMo 3's dolma2 tokenizer)",
    "hidden_size": "the model width d_model, an integer (4096 for OLMo 3 7B)",
    "num_hidden_layers": "the number of transformer layers, an integer (32 for OLMo 3 7B)",
    "num_attention_heads": "the number of attention (query) heads, an integer (32 for OLMo 3 7B)",
    "intermediate_size": "the MLP's hidden width, an integer (11008 for OLMo 3 7B)",
}


def missing_fields(hf: dict) -> str | None:
    """Which of ``REQUIRED_FIELDS`` an HF ``config.json`` dict lacks (or holds as no positive integer), and
    what each should hold; None when it has them all."""
    bad = [k for k in REQUIRED_FIELDS if not isinstance(hf.get(k), int) or isinstance(hf.get(k), bool) or hf[k] < 1]
    if not bad:
        return None
    return "; ".join(
        f"{k!r} {'is missing' if k not in hf else f'is {hf[k]!r}'}: it holds {REQUIRED_FIELDS[k]}" for k in bad
    )


def config_from_hf(hf: dict, **overrides: Any) -> ModelConfig:
    """``ModelConfig`` from an HF Olmo3 ``config.json`` dict; rejects what we do not implement.

    ``compute_dtype`` is the checkpoint's ``dtype``/``torch_dtype`` (as ``from_pretrained(dtype="auto")``
    does: a float32 checkpoint runs float32 matmuls) unless ``overrides`` sets it; without either it
    is ModelConfig's default. Parameters stay ``param_dtype`` (float32) whatever the checkpoint's.
    """
    if hf.get("model_type") != MODEL_TYPE:
        raise ValueError(f"expected model_type {MODEL_TYPE!r}, got {hf.get('model_type')!r}")
    for key, want in (("hidden_act", "silu"), ("attention_bias", False), ("tie_word_embeddings", False)):
        if hf.get(key, want) != want:
            raise ValueError(f"unsupported {key}={hf[key]!r} (OLMo 3 uses {want!r})")
    if problem := missing_fields(hf):
        raise ValueError(f"{CONFIG_FILE}: {problem}")
    n_heads = hf["num_attention_heads"]
    layer_types = hf.get("layer_types")
    if hf.get("sliding_window") is None and layer_types and "sliding_attention" in layer_types:
        raise ValueError("layer_types has sliding layers but sliding_window is null")
    fields = dict(
        name=hf.get("_name_or_path") or "hf",
        vocab_size=hf["vocab_size"],
        d_model=hf["hidden_size"],
        n_layers=hf["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=hf.get("num_key_value_heads") or n_heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // n_heads,
        mlp_hidden=hf["intermediate_size"],
        **_rope_fields(hf),
        sliding_window=hf.get("sliding_window") or hf.get("max_position_embeddings", 8192),
        # HF's own default when layer_types is absent: full only where (i + 1) % 4 == 0.
        layer_types=tuple(layer_types)
        if layer_types
        else tuple(
            "full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(hf["num_hidden_layers"])
        ),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-5),
        init_std=hf.get("initializer_range", 0.02),
        max_seq_len=hf.get("max_position_embeddings", 8192),
    )
    if hf.get("pad_token_id") is not None:
        fields["pad_id"] = hf["pad_token_id"]
    eos = hf.get("eos_token_id")
    if isinstance(eos, int):
        fields["eos_id"] = eos
    if "compute_dtype" not in overrides and (dtype := checkpoint_dtype(hf)) is not None:
        fields["compute_dtype"] = dtype
    fields.update(overrides)
    return ModelConfig(**fields)


def _tensor_files(path: str) -> dict[str, str]:
    """Tensor name → safetensors file (single file or HF's sharded index)."""
    index = os.path.join(path, INDEX_FILE)
    if os.path.exists(index):
        with open(index) as f:
            return {k: os.path.join(path, v) for k, v in json.load(f)["weight_map"].items()}
    single = os.path.join(path, WEIGHTS_FILE)
    with safe_open(single, framework="numpy") as f:
        return {k: single for k in f.keys()}  # noqa: SIM118 - a safetensors handle: keys(), no __iter__


def load_hf(path: str, **overrides: Any) -> tuple[ModelConfig, dict]:
    """Read an HF Olmo3 checkpoint directory → ``(cfg, params)`` (numpy, ``cfg.param_dtype``).

    ``overrides`` are ModelConfig fields (e.g. ``compute_dtype``, ``vocab_pad_multiple``); by default
    ``compute_dtype`` is the checkpoint's own dtype (see ``config_from_hf``).
    Unknown or missing tensors are an error (nothing is silently dropped or invented).
    """
    try:
        return _load_hf(path, **overrides)
    except SafetensorError as e:  # a truncated or damaged model.safetensors: one line, not a traceback
        raise HFCheckpointError(f"checkpoint {path}: a safetensors file cannot be read ({e})") from None


class HFCheckpointError(Refused, ValueError):
    """A Hugging Face checkpoint directory whose tensors cannot be read (a Refused: one line)."""


def _load_hf(path: str, **overrides: Any) -> tuple[ModelConfig, dict]:
    with open(os.path.join(path, CONFIG_FILE)) as f:
        cfg = config_from_hf(json.load(f), **overrides)
    files = _tensor_files(path)
    dtype = cfg.params_dtype  # a numpy dtype (ml_dtypes for bfloat16)
    handles: dict[str, Any] = {}

    def take(name: str) -> np.ndarray:
        if name not in files:
            raise KeyError(f"checkpoint {path} lacks tensor {name!r}")
        file = files.pop(name)
        if file not in handles:
            # framework="flax": safetensors' numpy reader cannot represent bfloat16 checkpoints.
            handles[file] = stack.enter_context(safe_open(file, framework="flax"))
        return np.asarray(handles[file].get_tensor(name)).astype(dtype)

    def pad_vocab(w: np.ndarray) -> np.ndarray:  # [V, D] -> [Vp, D], zero rows
        extra = cfg.padded_vocab_size - w.shape[0]
        return np.concatenate([w, np.zeros((extra, w.shape[1]), w.dtype)]) if extra else w

    with contextlib.ExitStack() as stack:
        params = _convert_from_hf(cfg, take, pad_vocab)
    leftover = sorted(k for k in files if "rotary_emb" not in k)
    if leftover:
        raise ValueError(f"checkpoint {path} has tensors this model does not use: {leftover[:5]}")
    return cfg, params


def _convert_from_hf(
    cfg: ModelConfig, take: Callable[[str], np.ndarray], pad_vocab: Callable[[np.ndarray], np.ndarray]
) -> dict:
    params: dict = {
        "embed": {"embedding": pad_vocab(take("model.embed_tokens.weight"))},
        "final_norm": {"scale": take("model.norm.weight")},
        "lm_head": {"kernel": pad_vocab(take("lm_head.weight")).T.copy()},
        "layers": {},
    }
    for suffix, (ours, _, from_hf) in LAYER_MAP.items():
        stacked = np.stack([from_hf(take(f"model.layers.{i}.{suffix}"), cfg) for i in range(cfg.n_layers)])
        _set(params["layers"], ours, stacked)
    return params


def save_hf(cfg: ModelConfig, params: dict, path: str) -> None:
    """Write ``config.json`` + ``model.safetensors`` (float32) loadable by ``Olmo3ForCausalLM.from_pretrained``."""
    os.makedirs(path, exist_ok=True)
    V = cfg.vocab_size

    def np32(x: Any) -> np.ndarray:
        return np.ascontiguousarray(np.asarray(x, dtype=np.float32))

    tensors = {
        "model.embed_tokens.weight": np32(params["embed"]["embedding"])[:V],
        "model.norm.weight": np32(params["final_norm"]["scale"]),
        "lm_head.weight": np32(np.asarray(params["lm_head"]["kernel"])[:, :V].T),
    }
    for suffix, (ours, to_hf, _) in LAYER_MAP.items():
        stacked = np.asarray(_get(params["layers"], ours))
        for i in range(cfg.n_layers):
            tensors[f"model.layers.{i}.{suffix}"] = np32(to_hf(stacked[i], cfg))
    tensors = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    save_file(tensors, os.path.join(path, WEIGHTS_FILE), metadata={"format": "pt"})
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(hf_config_dict(cfg), f, indent=2, sort_keys=True)
