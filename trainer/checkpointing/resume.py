"""What a resumed run must share with its checkpoint: the settings that shape every update.

`resume_changes(meta["config"], cfg, meta.get("model_resolved"))` lists each difference (the
trainer refuses the resume unless ``checkpoint.allow_optimizer_change``);
`init_from_changes(...)` the same for ``checkpoint.init_from`` less what a new stage changes by
design (the learning rate and its schedule), less the fields ``checkpoint.init_from_allow_changes``
names. Pure, no JAX backend.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from trainer.config.schema import TrainConfig

# Settings a resumed run must share with its checkpoint unless checkpoint.allow_optimizer_change:
# they shape the updates (optimizer, skip step), the learning rate at every step (schedule), the
# loss (z_loss, document_masking: what attends to what) and the model computing it ("model": the
# RESOLVED ModelConfig of `model` + `model_overrides`, compared field by field, so writing out a
# default is no change).
RESUME_KEYS = (
    "lr",
    "optimizer",
    "skip_step",
    "schedule.kind",
    "schedule.warmup_steps",
    "schedule.final_lr_ratio",
    "schedule.decay_steps",
    "schedule.step_offset",
    "z_loss",
    "document_masking",
    "model",
)

# ModelConfig fields that change memory or layout only, never the function computed (so they may
# be retuned when resuming, e.g. on another topology):
#   remat: rematerialises each block in the backward pass: the same operations recomputed;
#   attention_chunk: splits the *queries* into chunks; each query's softmax still runs over the
#     keys its mask lets it see (model.attention.attend_xla: "same math, same result");
#   attention_impl, splash_*: which kernel computes the same masked softmax
#     and how it tiles it (model.attention; tests hold splash equal to xla), e.g. a run started with
#     xla on CPU resumed with splash on a TPU. Like remat they change rounding, not the function;
#   fused_qkv, fused_gate_up: the same projections over the same parameters as one matmul each;
#   seq_chunk: a block's token-wise parts (projections, RoPE, MLP) over the sequence in chunks: each
#     token's values are computed by the same operations (e.g. stage 3 at 65,536 continuing stage 2);
#   seq_chunk_keep_gate_up: the chunked tail's gate/up projections kept instead of recomputed;
# Everything else (shapes, dtypes, RoPE, norms, windows, vocabulary, token ids, even the name) counts.
MODEL_LAYOUT_ONLY = (
    "remat",
    "attention_chunk",
    "attention_impl",
    "splash_block_q",
    "splash_block_kv",
    "splash_block_kv_compute",
    "splash_fused_bwd",
    "splash_kernel",
    "splash_q_layout",
    "splash_k_layout",
    "splash_v_layout",
    "fused_qkv",
    "fused_gate_up",
    "seq_chunk",
    "seq_chunk_keep_gate_up",
)
# ModelConfig fields that shape the initialisation only (model.init's truncated normal), which a
# resume never repeats: the restored parameters are what they shaped.
MODEL_INIT_ONLY = ("init_std", "init_cutoff")
NOT_COMPARED = MODEL_LAYOUT_ONLY + MODEL_INIT_ONLY


def _model_fields(resolved: dict[str, Any]) -> dict[str, Any]:
    """{"model.<field>": value} of a ModelConfig as a dict, less NOT_COMPARED; a field it lacks
    (recorded before the field existed) reads as its default, as for the other resume keys."""
    from model.config import ModelConfig  # imports jax.numpy, which starts no backend

    defaults = {f.name: f.default for f in dataclasses.fields(ModelConfig) if f.default is not dataclasses.MISSING}
    resolved = json.loads(json.dumps({**defaults, **resolved}))  # tuples → lists, as a checkpoint's meta reads
    return {f"model.{k}": v for k, v in resolved.items() if k not in NOT_COMPARED}


def _resolved_model(name: Any, overrides: Any) -> dict[str, Any]:
    """{"model.<field>": value} of the ModelConfig today's code resolves, less NOT_COMPARED; a
    name or overrides this code cannot resolve (a model since renamed) compare as written instead."""
    from model.config import get_config  # imports jax.numpy, which starts no backend

    overrides = overrides if isinstance(overrides, dict) else {}
    try:
        resolved = dataclasses.asdict(get_config(name, **overrides))
    except (KeyError, TypeError, ValueError):
        return {"model": name, **{f"model_overrides.{k}": v for k, v in overrides.items()}}
    return _model_fields(resolved)


def _resume_settings(config: dict[str, Any], model_resolved: dict[str, Any] | None = None) -> dict[str, Any]:
    """The RESUME_KEYS of a ``to_dict()`` config, flattened, with the *effective* decay_steps
    (unset = steps), the resolved model, and JSON-normalised values (tuples → lists). A key the
    config lacks (a checkpoint written before the key existed) reads as today's default, which is
    what the code that wrote it did (e.g. document_masking: segment ids were always used before
    the switch; schedule.step_offset: 0). ``model_resolved``: the ModelConfig the run recorded
    (its checkpoint's meta), compared instead of its name resolved by today's code (a named
    config whose definition changed since is a change)."""
    config = json.loads(json.dumps(config))
    defaults = json.loads(json.dumps(TrainConfig().to_dict()))
    out: dict[str, Any] = {}
    for key in RESUME_KEYS:
        section, _, name = key.partition(".")
        if key == "model":
            out.update(
                _model_fields(model_resolved)
                if isinstance(model_resolved, dict)
                else _resolved_model(
                    config.get("model", defaults["model"]), config.get("model_overrides", defaults["model_overrides"])
                )
            )
            continue
        if not name:
            value = config.get(section, defaults[section])
            if isinstance(value, dict):  # a section: each of its keys defaults on its own
                value = {**defaults[section], **value}
        else:
            value = config.get(section, {}).get(name, defaults[section][name])
        if key == "schedule.decay_steps" and value is None:
            value = config.get("steps")
        if isinstance(value, dict):
            out.update({f"{key}.{k}": v for k, v in value.items()})
        else:
            out[key] = value
    return out


def resume_changes(
    saved_config: dict[str, Any], cfg: TrainConfig, saved_model: dict[str, Any] | None = None
) -> list[str]:
    """``"key: checkpoint has A, config gives B"`` for each RESUME_KEYS setting that
    differs between a checkpoint's config (``meta["config"]``, and ``meta["model_resolved"]``
    when it has one) and ``cfg``."""
    old, new = _resume_settings(saved_config, saved_model), _resume_settings(cfg.to_dict())
    return [
        f"{k}: checkpoint has {old.get(k)!r}, config gives {new.get(k)!r}"
        for k in sorted(set(old) | set(new))
        if old.get(k) != new.get(k)
    ]


# What a new stage started from another run's step (checkpoint.init_from) changes by design: the
# learning rate and its schedule. Everything else a resume compares must match unless named in
# checkpoint.init_from_allow_changes (e.g. rope_theta for a long-context extension).
INIT_FROM_FREE = ("lr", "schedule.")


def allowed_by(key: str, name: str) -> bool:
    """``name`` (as a user writes it: ``model.rope_theta`` or ``rope_theta``, ``optimizer`` for
    all its fields) names the setting ``key``."""
    return key == name or key.startswith(name + ".") or key.removeprefix("model.") == name


def init_from_changes(
    saved_config: dict[str, Any],
    cfg: TrainConfig,
    saved_model: dict[str, Any] | None,
    allowed: tuple[str, ...] | list[str] = (),
) -> tuple[list[str], list[str]]:
    """(refused, allowed) differences between the run ``checkpoint.init_from`` comes from and
    ``cfg`` ("key: checkpoint has A, config gives B" each): resume_changes less INIT_FROM_FREE;
    those ``allowed`` names go to the second list. A name in ``allowed`` that names no compared
    setting is a refusal of its own (a typo must not pass silently)."""
    old, new = _resume_settings(saved_config, saved_model), _resume_settings(cfg.to_dict())
    keys = [k for k in sorted(set(old) | set(new)) if not k.startswith(INIT_FROM_FREE)]
    refused: list[str] = []
    passed: list[str] = []
    for k in keys:
        if old.get(k) != new.get(k):
            line = f"{k}: checkpoint has {old.get(k)!r}, config gives {new.get(k)!r}"
            (passed if any(allowed_by(k, name) for name in allowed) else refused).append(line)
    for name in allowed:
        if not any(allowed_by(k, name) for k in keys):
            refused.append(
                f"checkpoint.init_from_allow_changes names {name!r}, which is no setting init_from "
                "compares (e.g. rope_theta, sliding_window, document_masking, optimizer.b2)"
            )
    return refused, passed
