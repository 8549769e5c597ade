"""The OLMo 3 decoder: ``init(cfg, rng) -> params`` and ``forward(cfg, params, tokens, ...) -> logits``.

Parameters are a plain nested dict of arrays (``param_dtype``, float32 by default)::

    {"embed":      {"embedding": [Vp, D]},
     "layers":     {  # stacked over L (the blocks run under nn.scan)
        "attn": {"q_proj": [L, D, H, hd], "k_proj": [L, D, K, hd], "v_proj": [L, D, K, hd],
                 "o_proj": [L, H, hd, D], "q_norm": {"scale": [L, H, hd]},
                 "k_norm": {"scale": [L, K, hd]}},
        "post_attn_norm": {"scale": [L, D]},
        "mlp": {"gate_proj": [L, D, F], "up_proj": [L, D, F], "down_proj": [L, F, D]},
        "post_mlp_norm": {"scale": [L, D]}},
     "final_norm": {"scale": [D]},
     "lm_head":    {"kernel": [D, Vp]}}

``Vp`` is ``cfg.padded_vocab_size``. The trainer excludes exactly the ``"embed"`` subtree
from weight decay.

The layer stack (``run_layers``): a layer's attention mask is static (the splash kernel's block
skipping, the XLA path's key slicing), so the scan runs over the repeating group of layer types
(OLMo 3's sliding, sliding, sliding, full: 8 groups of 4 at 32 layers; as MaxText scans Gemma 3's
interleaved pattern), each group applying its layers with their own static windows. The
parameters stay stacked ``[L, ...]`` (checkpoints, ``model.hf``): the scan reads them as
``[L / P, P, ...]``, a reshape of the leading axis that copies nothing.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any, cast

import flax.linen as nn
import jax
import jax.numpy as jnp

from model import context_parallel
from model.attention import ATTN_OUT
from model.axis_rules import ShardingConfig
from model.config import ModelConfig
from model.layers import MLP_GATE_UP, MLP_OUT, Block, Constrain, RMSNorm, partitioned, weight_init


class Embed(nn.Module):
    """Token embedding ``[B, T] -> [B, T, D]``: gathers rows of the ``param_dtype`` table, then casts.

    (Flax's ``nn.Embed`` casts the whole ``[V, D]`` table to ``compute_dtype`` before the gather:
    a full-table copy per step for nothing.) Ids outside the table gather NaN (jnp.take's "fill"),
    so bad token ids cannot pass silently.
    """

    cfg: ModelConfig
    rules: Any = None
    mesh: Any = None

    @nn.compact
    def __call__(self, tokens: jax.Array) -> jax.Array:
        cfg = self.cfg
        table = self.param(
            "embedding",
            partitioned(weight_init(cfg), ("vocab", "embed")),
            (cfg.padded_vocab_size, cfg.d_model),
            cfg.params_dtype,
        )
        if context_parallel.active(self.rules, self.mesh):
            # the rows gathered whole (embed unsharded) for tokens split over batch and context: XLA's
            # partitioner cannot turn a gather sharded on embed over (fsdp, context) into that layout
            # and would replicate the whole [B, T, D] result; the table's all-gather is FSDP's anyway
            table = Constrain(self.rules, self.mesh)(table, ("vocab", None))
        return jnp.take(table, tokens, axis=0).astype(cfg.dtype)


class LMHead(nn.Module):
    """``[B, T, D] -> [B, T, Vp]`` float32 logits (bf16 inputs, float32 accumulation)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.cfg
        w = self.param(
            "kernel",
            partitioned(weight_init(cfg), ("embed", "vocab")),
            (cfg.d_model, cfg.padded_vocab_size),
            cfg.params_dtype,
        )
        return head_logits(x, w.astype(cfg.dtype))


def head_logits(x: jax.Array, w: jax.Array) -> jax.Array:
    """The LM head's matmul: ``x [B, C, D] @ w [D, Vp]`` (both ``compute_dtype``) → float32 logits."""
    return jnp.einsum("btd,dv->btv", x, w, preferred_element_type=jnp.float32)


LOGITS_AXES = ("act_batch", "act_length", "act_vocab")


@dataclasses.dataclass(frozen=True)
class Head:
    """The LM head ``final_hidden`` hands out: ``head(x [B, C, D])`` are ``forward``'s float32 logits
    ``[B, C, Vp]``. For a loss that computes the head's gradients itself (``trainer.loss``'s fused
    backward), its parts: ``kernel`` (the ``param_dtype`` weight ``[D, Vp]``, the array the
    gradient belongs to), ``dtype`` (the compute dtype it is cast to) and ``constrain`` (the logits'
    sharding constraint, also the right one for their cotangent)."""

    kernel: jax.Array
    dtype: Any
    constrain_fn: Constrain

    def constrain(self, logits: jax.Array) -> jax.Array:
        return self.constrain_fn(logits, LOGITS_AXES)

    @staticmethod
    def matmul(x: jax.Array, w: jax.Array) -> jax.Array:
        return head_logits(x, w)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.constrain(head_logits(x, self.kernel.astype(self.dtype)))


def remat_policy(name: str) -> Callable | None:
    """``jax.checkpoint`` policy of ``ModelConfig.remat`` (None for ``"none"``: no checkpoint)."""
    policies = jax.checkpoint_policies
    return {
        "none": None,
        "full": policies.nothing_saveable,
        "dots_saveable": policies.dots_saveable,
        "dots_with_no_batch_dims_saveable": policies.dots_with_no_batch_dims_saveable,
        "offload_dots_with_no_batch_dims": policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
        "save_attn_mlp_out": policies.save_only_these_names(ATTN_OUT, MLP_OUT, MLP_GATE_UP),
        "save_attn_out": policies.save_only_these_names(ATTN_OUT, MLP_GATE_UP),
        "offload_attn_mlp_out": policies.save_and_offload_only_these_names(
            names_which_can_be_saved=[],
            names_which_can_be_offloaded=[ATTN_OUT, MLP_OUT],
            offload_src="device",
            offload_dst="pinned_host",
        ),
    }[name]


# Policies whose recomputation must survive XLA when the layer scan has one trip (run_layers).
CSE_PREVENTING_POLICIES = ("full", "save_attn_mlp_out", "save_attn_out", "offload_attn_mlp_out")


def layer_period(layer_types: tuple[str, ...]) -> int:
    """Smallest P dividing L with ``layer_types[i] == layer_types[i % P]`` (4 for OLMo 3's
    pattern at 8, 32, ... layers; L itself when the pattern does not repeat)."""
    L = len(layer_types)
    return next(
        p for p in range(1, L + 1) if L % p == 0 and all(layer_types[i] == layer_types[i % p] for i in range(L))
    )


def run_layers(
    cfg: ModelConfig,
    layers: Any,
    x: jax.Array,
    segment_ids: jax.Array | None,
    positions: jax.Array,
    rules: Any = None,
    mesh: Any = None,
) -> jax.Array:
    """The L blocks over x ``[B, T, D]``; ``layers``: the ``"layers"`` params (leaves ``[L, ...]``).

    A ``lax.scan`` over L / P groups of P layers (``layer_period``): layer j of a group is a Block
    with layer j's static window, under ``jax.checkpoint`` with ``cfg.remat``'s policy.
    """
    P = layer_period(cfg.layers)
    policy = remat_policy(cfg.remat)
    # One group (e.g. the 2-layer proxy, whose pattern does not repeat): XLA unrolls the one-trip
    # loop, and with CSE allowed it merges a recomputed forward with the original, keeping every
    # activation alive whatever the policy. The policies that exist to save memory forbid that.
    prevent_cse = cfg.n_layers // P == 1 and cfg.remat in CSE_PREVENTING_POLICIES

    def block_fn(window: int | None) -> Callable:
        block = Block(cfg, rules, mesh, window, parent=None)

        def apply(params: Any, h: jax.Array) -> jax.Array:
            return block.apply({"params": params}, h, segment_ids, positions)[0]

        return apply if policy is None else jax.checkpoint(apply, policy=policy, prevent_cse=prevent_cse)

    fns = [block_fn(cfg.window_of(j)) for j in range(P)]

    def group(h: jax.Array, params: Any) -> tuple[jax.Array, None]:
        for j, fn in enumerate(fns):
            h = fn(jax.tree.map(lambda a: a[j], params), h)  # noqa: B023 - tree.map calls it at once
        return h, None

    grouped = jax.tree.map(lambda a: a.reshape(cfg.n_layers // P, P, *a.shape[1:]), layers)
    if prevent_cse:  # one group: no loop. Through a one-trip scan's stacked residuals XLA moves the
        # slice of splash's lane-wide logsumexp ([H, T, 128] float32, 1 GiB a layer at 65,536) into
        # the backward pass and keeps the whole buffer alive until then.
        return group(x, jax.tree.map(lambda a: a[0], grouped))[0]
    return jax.lax.scan(group, x, grouped)[0]


class Transformer(nn.Module):
    cfg: ModelConfig
    rules: Any = None
    mesh: Any = None

    @nn.compact
    def __call__(self, tokens: jax.Array, segment_ids: jax.Array | None, positions: jax.Array) -> jax.Array:
        """tokens int ``[B, T]``, segment_ids int ``[B, T]`` or None, positions int ``[B, T]`` → float32 ``[B, T, V]``."""
        cfg, c = self.cfg, Constrain(self.rules, self.mesh)
        x = c(Embed(cfg, self.rules, self.mesh, name="embed")(tokens), ("act_batch", "act_length", "act_embed"))
        if self.is_initializing():
            # Creates the stacked [L, ...] parameters (nn.scan: one RNG per layer, the "layers"
            # partition axis). Any window and the xla path do for that: init's sequence is a dummy.
            init_cfg = dataclasses.replace(cfg, attention_impl="xla", remat="none")
            blocks = nn.scan(
                Block,
                variable_axes={"params": 0},
                split_rngs={"params": True},
                in_axes=(nn.broadcast, nn.broadcast),
                length=cfg.n_layers,
                metadata_params={nn.PARTITION_NAME: "layers"},
            )
            x, _ = blocks(init_cfg, self.rules, self.mesh, name="layers")(x, segment_ids, positions)
        else:
            x = run_layers(cfg, self.variables["params"]["layers"], x, segment_ids, positions, self.rules, self.mesh)
        x = RMSNorm(cfg, ("embed",), name="final_norm")(x)
        logits = LMHead(cfg, name="lm_head")(x)
        if cfg.padded_vocab_size != cfg.scored_vocab_size:  # the masked padding: sliced off
            logits = logits[..., : cfg.scored_vocab_size]
        return c(logits, ("act_batch", "act_length", "act_vocab"))


def _dummy_tokens() -> jax.Array:
    return jnp.zeros((1, 1), jnp.int32)


def _init_boxed(cfg: ModelConfig, rng: jax.Array) -> Any:
    tokens = _dummy_tokens()
    return Transformer(cfg).init(rng, tokens, None, jnp.zeros_like(tokens))["params"]


@functools.lru_cache(maxsize=64)
def _traced_abstract_boxed_params(cfg: ModelConfig) -> Any:
    return jax.eval_shape(functools.partial(_init_boxed, cfg), jax.random.key(0))


def abstract_boxed_params(cfg: ModelConfig) -> Any:
    """``init``'s output as ``nn.Partitioned``-boxed ``ShapeDtypeStruct``s; allocates nothing.

    Traced once per config (a config is frozen, and the shapes, dtypes and axis names depend on it
    alone): a start-up asks for them from several places (the shardings, the optimizer's, the
    abstract state, the parameter count), each a whole trace of ``init`` otherwise. Each call
    returns its own containers (the leaves are immutable), so a caller may change its copy."""
    return jax.tree.map(lambda x: x, _traced_abstract_boxed_params(cfg))


def abstract_params(cfg: ModelConfig) -> Any:
    """Shapes and dtypes of ``init(cfg, rng)`` without allocating (``jax.eval_shape``)."""
    return nn.unbox(abstract_boxed_params(cfg))


@functools.partial(jax.jit, static_argnums=0)
def init(cfg: ModelConfig, rng: jax.Array) -> dict:
    """Fresh parameters (plain nested dict, ``param_dtype``); norms are ones, matrices truncated normal.

    To create them sharded, wrap in ``jax.jit(..., out_shardings=model.param_shardings(cfg, mesh))``.
    """
    return nn.unbox(_init_boxed(cfg, rng))


@functools.partial(jax.jit, static_argnames=("cfg", "sharding", "mesh"))
def forward(
    cfg: ModelConfig,
    params: dict,
    tokens: jax.Array,
    segment_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
    *,
    sharding: ShardingConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> jax.Array:
    """Logits float32 ``[B, T, scored_vocab_size]`` for int tokens ``[B, T]``: ``vocab_size``
    columns, or with AI2's unmasked padding (``vocab_padding: unmasked``) every padded row's too.

    segment_ids: int ``[B, T]``; when given, a query attends only to keys with the same id
      (document masking for packed examples; PAD rows share id 0 among themselves).
    positions: int ``[B, T]`` RoPE positions; default ``arange(T)``. Pass the loader's per-document
      positions for packed data (RoPE is relative, so with document masking this only changes
      rounding, not the math).
    sharding + mesh: when both are given, activations get Flax logical sharding constraints.
    """
    if tokens.ndim != 2:
        raise ValueError(f"tokens must be [B, T], got shape {tokens.shape}")
    for name, arr in (("segment_ids", segment_ids), ("positions", positions)):
        if arr is not None and arr.shape != tokens.shape:
            raise ValueError(f"{name} shape {arr.shape} != tokens shape {tokens.shape}")
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    rules = None if sharding is None or mesh is None else sharding.rules
    model = Transformer(cfg, rules, mesh if rules is not None else None)
    # apply's annotation allows (out, state); without mutable= it is the output alone
    return cast(jax.Array, model.apply({"params": params}, tokens.astype(jnp.int32), segment_ids, positions))


def lm_head(cfg: ModelConfig, params: dict, x: jax.Array) -> jax.Array:
    """The LM head alone: ``x [..., C, D]`` (final-normed hidden states, e.g. gathered rows of
    ``final_hidden``'s) → ``forward``'s float32 logits ``[..., C, padded_vocab_size]`` (padding
    columns included)."""
    x3 = x.reshape(-1, *x.shape[-2:]) if x.ndim != 3 else x
    logits = cast(jax.Array, LMHead(cfg).apply({"params": params["lm_head"]}, x3))  # no mutable=: the output alone
    return logits.reshape(*x.shape[:-1], logits.shape[-1])


def final_hidden(
    cfg: ModelConfig,
    params: dict,
    tokens: jax.Array,
    segment_ids: jax.Array | None = None,
    positions: jax.Array | None = None,
    *,
    sharding: ShardingConfig | None = None,
    mesh: jax.sharding.Mesh | None = None,
) -> tuple[jax.Array, Head]:
    """``forward`` split before the LM head: (final-normed hidden states ``[B, T, D]`` in
    ``compute_dtype``, ``head``), where ``head(x [B, C, D])`` gives ``forward``'s float32 logits
    ``[B, C, padded_vocab_size]`` (padding columns included: slice or mask them); ``Head``.

    For a loss that runs the head over chunks of the sequence, so the ``[B, T, V]`` logits never
    exist at once. Call it under ``jit``: the logits the full model also computes are unused and
    removed by XLA; the hidden states are the ``final_norm`` output, captured (Flax
    ``capture_intermediates``) so the layer stack is the one ``forward`` runs.
    """
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(tokens.shape[1], dtype=jnp.int32), tokens.shape)
    rules = None if sharding is None or mesh is None else sharding.rules
    mesh = mesh if rules is not None else None
    _, state = Transformer(cfg, rules, mesh).apply(
        {"params": params},
        tokens.astype(jnp.int32),
        segment_ids,
        positions,
        mutable=["intermediates"],
        capture_intermediates=lambda m, method: (
            method == "__call__" and m.name == "final_norm" and isinstance(m.parent, Transformer)
        ),
    )
    hidden = state["intermediates"]["final_norm"]["__call__"][0]
    return hidden, Head(params["lm_head"]["kernel"], cfg.dtype, Constrain(rules, mesh))
