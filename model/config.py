"""OLMo 3 model configuration: one frozen dataclass and the named sizes.

The architecture follows OLMo-core's ``TransformerConfig.olmo3_7B`` and Hugging Face's
``Olmo3ForCausalLM`` (the public reference this package is tested against):

* "reordered" post-norm blocks: ``h = x + RMSNorm(attn(x))``, ``out = h + RMSNorm(mlp(h))``;
* QK-norm: RMSNorm over the full projection width (``n_heads * head_dim``), before RoPE;
* RoPE with HF's ``rotate_half`` convention (the two halves of each head are the pairs);
* sliding-window attention in three of every four layers; full attention in layers 3, 7, ...
  and always in the last layer. A key ``k`` is visible to query ``q`` in a sliding layer iff
  ``q - sliding_window < k <= q`` (HF's ``sliding_window_overlay``: the window counts the
  query itself, so exactly ``sliding_window`` keys are visible);
* SwiGLU MLP ``down(silu(gate(x)) * up(x))``, no biases anywhere;
* untied input embedding and LM head; truncated-normal init (std 0.02, cut at ±3σ).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import typing
from typing import Any

import jax.numpy as jnp

from contract.errors import Refused

# The vocabulary is the model's own config. These defaults are the dolma2 tokenizer's (OLMo 3's),
# written out here so that `model` depends on nothing in `pipelines`; a test checks that they
# equal `pipelines.dolma2_tokenizer`'s, and the trainer checks a run's manifest against the config.
DOLMA2_VOCAB_SIZE = 100278
DOLMA2_EOS_ID = 100257  # <|endoftext|>
DOLMA2_PAD_ID = 100277  # <|pad|>
# sha256 of the cl100k_base ranks file dolma2's ordinary ids come from (what the ids *mean*).
DOLMA2_RANKS_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
# dolma2-proxy32k (pipelines.dolma2_tokenizer): cl100k's first 32,766 ranks, then EOS and PAD; the
# vocabulary of the one-chip proxy of the 7B model. Its ranks sha256 is that of those 32,766 lines.
PROXY32K_VOCAB_SIZE = 32768
PROXY32K_EOS_ID = 32766  # <|endoftext|>
PROXY32K_PAD_ID = 32767  # <|pad|>
PROXY32K_RANKS_SHA256 = "37d312afd9b66f20194e9dd79621910ed54fd749eedae0ecffa7e785bcdb0598"

SLIDING = "sliding_attention"
FULL = "full_attention"
LAYER_TYPES = (SLIDING, FULL)
# OLMo 3: every FULL_EVERY-th layer (1-based) attends to the whole sequence.
FULL_EVERY = 4
DTYPES = ("float32", "bfloat16", "float16")

# attention_impl: "xla" (model.attention's jnp path: CPU, GPU, anywhere), "splash" (JAX's Pallas TPU
# kernel; interpret mode on CPU, refused on GPU), "auto" (splash on TPU, xla elsewhere).
ATTENTION_IMPLS = ("auto", "xla", "splash")
# Splash block sizes (queries x keys per kernel tile, forward and both backward kernels). The one place
# the defaults live: bench.attention swept 256/512/1024 on a TPU v5e chip at seq 8192 for both head
# layouts, causal and window 4096 (bench/RESULTS.md, 2026-12-05): 1024 was fastest in all four cases.
SPLASH_BLOCK_Q = 1024
SPLASH_BLOCK_KV = 1024
SPLASH_LANES = 128  # a splash key block is a multiple of the TPU's 128 lanes (the kernel refuses others)
# splash_kernel: whose Pallas splash kernel runs ("jax": the one the pinned JAX ships; "tokamax": the
# tokamax package's, which MaxText's use_tokamax_splash calls; not a dependency: installed where used).
SPLASH_KERNELS = ("jax", "tokamax")
# splash_{q,k,v}_layout: the memory layout the kernel reads each operand in (its QKVLayout):
# [.., T, hd] ("head_dim_minor", the default) or [.., hd, T] ("seq_minor", MaxText's OLMo 3 q/k).
QKV_LAYOUTS = ("head_dim_minor", "seq_minor")
# remat: "none" (keep every activation), "full" (recompute each block in the backward pass), or a
# policy that keeps matmul outputs (MaxText's remat_policy): names of jax.checkpoint_policies, plus
# "offload_dots_with_no_batch_dims" (those outputs moved to pinned host memory: TPU only); for long
# sequences "save_attn_mlp_out" / "save_attn_out" / "offload_attn_mlp_out" (model/README.md).
# The old booleans keep their meaning: true = "full", false = "none".
# rope_scaling: "none" (plain RoPE θ in every layer) or "yarn" (YaRN, arXiv 2309.00071, with OLMo-core's
# YaRNRoPEScalingConfig parameters: the yarn_* fields; on the full-attention layers only unless
# yarn_full_attn_layers_only=false, as OLMo-core's TransformerConfig.with_rope_scaling).
ROPE_SCALINGS = ("none", "yarn")
# What the padded embedding/LM-head rows (vocab_pad_multiple) are to the softmax: "masked" (olmax's
# default: never scored, as if absent) or "unmasked" (AI2's: OLMo-core's 7B scores all 100,352 rows)
VOCAB_PADDINGS = ("masked", "unmasked")
REMAT_POLICIES = (
    "none",
    "full",
    "dots_saveable",
    "dots_with_no_batch_dims_saveable",
    "offload_dots_with_no_batch_dims",
    "save_attn_mlp_out",  # the long-sequence ones (model/README.md)
    "save_attn_out",
    "offload_attn_mlp_out",
)


def default_layer_types(n_layers: int) -> tuple[str, ...]:
    """OLMo 3's pattern: sliding, sliding, sliding, full, ...; the last layer is always full."""
    return tuple(FULL if (i + 1) % FULL_EVERY == 0 or i == n_layers - 1 else SLIDING for i in range(n_layers))


def normalize_remat(value: Any) -> str:
    """``remat`` as one of ``REMAT_POLICIES`` (``True`` → ``"full"``, ``False`` → ``"none"``)."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if value not in REMAT_POLICIES:
        raise ValueError(f"ModelConfig.remat={value!r}; expected true/false or one of {REMAT_POLICIES}")
    return value


class ModelConfigError(Refused, ValueError):
    """A ModelConfig field whose value cannot be right; ``field`` names it."""

    def __init__(self, field: str, message: str):
        super().__init__(f"ModelConfig.{message}")
        self.field, self.reason = field, message


class UnknownFieldsError(ModelConfigError, TypeError):
    """Overrides naming no ModelConfig field (a TypeError too, as an unknown keyword argument is);
    ``field``: the first unknown name, ``reason``: ``NAME: <message>``."""

    def __init__(self, unknown: list[str], message: str):
        ValueError.__init__(self, message)
        self.field, self.reason = unknown[0], f"{unknown[0]}: {message}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # a bool is no size (True would be 1)


def _typed(value: Any, tp: Any) -> tuple[Any, str | None]:
    """``value`` as field type ``tp`` (int, float, str, tuple[str, ...], X | None), and why it is not
    one (None when it is). Written the way YAML and JSON write numbers, a value is taken as what it
    means: an int is a float (500000 for 500000.0; kept as written), and a float field's text that is a finite number
    is that number (YAML 1.1, which PyYAML reads, takes ``1e-2`` without a dot for a string; the
    trainer's own float fields read it as a number too). An int field takes an int or an integral
    float (64.0 is 64, as the trainer's own int fields take it; 64.5 is refused), and a bool is
    neither an int nor a float."""
    args = typing.get_args(tp)
    if type(None) in args:
        if value is None:
            return value, None
        tp = next(a for a in args if a is not type(None))
    if tp is int:
        if isinstance(value, float) and value.is_integer():
            return int(value), None
        return value, None if _is_int(value) else "is not an int"
    if tp is float:
        if isinstance(value, str):
            try:
                number = float(value)
            except ValueError:
                return value, "is not a float"
            return (number, None) if math.isfinite(number) else (value, "is not a finite number")
        return value, None if _is_int(value) or isinstance(value, float) else "is not a float"
    if tp is str:
        return value, None if isinstance(value, str) else "is not a str"
    if typing.get_origin(tp) is tuple:
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value)
        return value, None if ok else "is not a list of str"
    return value, None


@functools.cache
def _field_types() -> dict[str, Any]:
    return typing.get_type_hints(ModelConfig)  # the annotations are strings (__future__ annotations)


# Checked by their own rule instead of their type: remat also takes the old booleans.
_OWN_RULE = ("remat",)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyper-parameters of an OLMo 3 decoder. Hashable, so it can be a static jit argument.

    Attributes:
      name: label only (named configs set it; overrides keep it).
      vocab_size: number of token ids the model accepts and scores (logits are ``[..., vocab_size]``).
      vocab_pad_multiple: if set, embedding and LM head are allocated with ``padded_vocab_size``
        rows (vocab rounded up to this multiple, e.g. 128 → 100352); the extra rows are never
        looked up (the data holds no id ≥ ``vocab_size``: ``trainer.data_contract``).
      vocab_padding: what the padded rows' logits are to the softmax and the z-loss:
        ``"masked"`` (the default: sliced off / −inf, the model is one over ``vocab_size`` ids) or
        ``"unmasked"`` (AI2's: OLMo-core's ``padded_vocab_size()`` rows all in the log-normaliser,
        as AI2 trains OLMo 3; ``scored_vocab_size`` columns). Moves the loss at initialisation by
        about ln(padded/true); an OLMo-core checkpoint's padded rows are trained toward −∞ logits.
      d_model: residual width D.
      n_layers: number of blocks L.
      n_heads / n_kv_heads / head_dim: query heads H, key/value heads K (GQA when K < H), width hd.
      mlp_hidden: SwiGLU hidden width F.
      rope_theta: RoPE base.
      rope_scaling: ``"none"`` (plain RoPE, the default) or ``"yarn"``: the scaled layers' RoPE is
        OLMo-core's ``YaRNRoPEScalingConfig`` / HF's ``rope_type: "yarn"`` (``model.layers``).
      yarn_factor: context expansion (OLMo-core ``factor``; > 1).
      yarn_beta_fast / yarn_beta_slow: rotation counts that bound the ramp (OLMo-core ``beta_fast``
        / ``beta_slow``; HF the same names).
      yarn_original_max_seq_len: the context the base model was trained at (OLMo-core
        ``old_context_len``, HF ``original_max_position_embeddings``).
      yarn_attention_factor: the cos/sin multiplier (HF ``attention_factor``, OLMo-core's
        ``get_attention_rescale_factor()``); None: ``0.1·ln(yarn_factor) + 1``, both libraries'
        formula (1.2079 for factor 8).
      yarn_full_attn_layers_only: YaRN on the full-attention layers only, the sliding-window
        layers keeping plain RoPE θ (OLMo-core's ``with_rope_scaling(full_attn_layers_only=True)``,
        OLMo 3's stage 3); false: on every layer.
      sliding_window: keys visible to a query in a sliding layer, counting itself.
      layer_types: per layer, ``"sliding_attention"`` or ``"full_attention"``; derived from
        ``n_layers`` when None.
      rms_norm_eps: epsilon of every RMSNorm.
      init_std / init_cutoff: truncated-normal init std and cut-off in units of std.
      max_seq_len: longest sequence the config is meant for (written to HF's
        ``max_position_embeddings``; RoPE itself has no table and no limit).
      compute_dtype / param_dtype: matmul inputs vs stored parameters (names of numpy dtypes).
      remat: what each block keeps for the backward pass: ``"none"`` (everything), ``"full"``
        (only its input; the block is recomputed), or a policy of ``REMAT_POLICIES`` that keeps
        matmul outputs. ``True``/``False`` read as ``"full"``/``"none"``.
      attention_chunk: XLA attention only: queries run in chunks of this many tokens, each
        rematerialised (memory ``O(C·T)`` instead of ``O(T²)``, same result; in sliding layers a
        chunk reads only the ``W + C - 1`` keys its window can see); the sequence length must be
        a multiple of it.
      seq_chunk: a block's token-wise parts run over the sequence this many tokens at a time (the
        same function): the q/k/v projections with QK-norm and RoPE (one chunk's float32 temporaries
        live) and the tail after the attention core, o_proj, both norms and the SwiGLU MLP
        (``model.layers.block_tail`` under ``seq_chunked``: recomputed chunk by chunk in its own
        backward pass, so no MLP output is kept); splash's saved output and logsumexp are cut where
        the kernel writes them (``model.attention.residuals_cut``). None, or a sequence not longer
        than it or not a multiple of it: whole.
      seq_chunk_keep_gate_up: with ``seq_chunk``, the chunked tail keeps every chunk's MLP gate and
        up projections (``[B, T, F]`` twice in the compute dtype, a layer; named
        ``model.layers.MLP_GATE_UP``, which remat ``"none"``, ``"save_attn_mlp_out"`` and
        ``"save_attn_out"`` save) and its backward pass takes them instead of recomputing 2 of the
        MLP's 3 matmuls: the same function and gradients, more memory, less compute.
      attention_impl: ``"auto"`` (splash on TPU, xla elsewhere), ``"xla"`` or ``"splash"``
        (``model.attention``; same function, different kernels).
      splash_block_q / splash_block_kv: splash tile sizes (multiples of 128; a sequence shorter
        than a block uses one block of its length).
      splash_block_kv_compute: the kernel's inner key tile (a divisor of splash_block_kv; None: the
        whole block), as MaxText's ``sa_block_kv_compute``.
      splash_fused_bwd: one fused dq/dk/dv backward kernel instead of separate dq and dkv kernels.
      splash_kernel: ``"jax"`` (JAX's own splash kernel) or ``"tokamax"`` (tokamax's, which has only
        the fused backward: it needs ``splash_fused_bwd``; the ``tokamax`` package must be installed).
      splash_q_layout / splash_k_layout / splash_v_layout: the layout the splash kernel reads q, k, v
        in (``QKV_LAYOUTS``: ``"head_dim_minor"`` or ``"seq_minor"``); the same attention either way.
      fused_qkv / fused_gate_up: compute the q/k/v (and the MLP's gate/up) projections as one matmul
        over the kernels concatenated inside the step, then split: the same parameters (names,
        shapes, checkpoints) and the same function, a different matmul shape.
      eos_id / pad_id: the tokenizer's end-of-text and padding ids (written to HF's config);
        the defaults, like ``vocab_size``'s, are dolma2's (``DOLMA2_*`` above).
      ranks_sha256: sha256 of the BPE ranks file whose ids the model was (or will be) trained on;
        the trainer refuses data tokenized with other ranks. None: not known (a converted
        checkpoint whose tokenizer the config does not say), and then not checked.
    """

    name: str = "custom"
    vocab_size: int = DOLMA2_VOCAB_SIZE
    vocab_pad_multiple: int | None = None
    vocab_padding: str = "masked"
    d_model: int = 4096
    n_layers: int = 32
    n_heads: int = 32
    n_kv_heads: int = 32
    head_dim: int = 128
    mlp_hidden: int = 11008
    rope_theta: float = 500_000.0
    rope_scaling: str = "none"
    yarn_factor: float = 8.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    yarn_original_max_seq_len: int = 8192
    yarn_attention_factor: float | None = None
    yarn_full_attn_layers_only: bool = True
    sliding_window: int = 4096
    layer_types: tuple[str, ...] | None = None
    rms_norm_eps: float = 1e-6
    init_std: float = 0.02
    init_cutoff: float = 3.0
    max_seq_len: int = 8192
    compute_dtype: str = "bfloat16"
    param_dtype: str = "float32"
    remat: str = "none"
    attention_chunk: int | None = None
    seq_chunk: int | None = None
    seq_chunk_keep_gate_up: bool = False
    attention_impl: str = "auto"
    splash_block_q: int = SPLASH_BLOCK_Q
    splash_block_kv: int = SPLASH_BLOCK_KV
    splash_block_kv_compute: int | None = None
    splash_fused_bwd: bool = False
    splash_kernel: str = "jax"
    splash_q_layout: str = "head_dim_minor"
    splash_k_layout: str = "head_dim_minor"
    splash_v_layout: str = "head_dim_minor"
    fused_qkv: bool = False
    fused_gate_up: bool = False
    eos_id: int = DOLMA2_EOS_ID
    pad_id: int = DOLMA2_PAD_ID
    ranks_sha256: str | None = DOLMA2_RANKS_SHA256

    def __post_init__(self) -> None:
        hints = _field_types()
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in _OWN_RULE:
                continue
            typed, problem = _typed(value, hints[f.name])
            if problem:
                raise ModelConfigError(f.name, f"{f.name}={value!r} {problem}")
            if typed is not value:
                object.__setattr__(self, f.name, typed)
        for field in ("rope_theta", "rms_norm_eps", "init_std", "init_cutoff"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):  # init_cutoff <= 0: every weight the same constant
                raise ModelConfigError(field, f"{field}={value!r} must be a finite number > 0")
        if self.layer_types is None:
            object.__setattr__(self, "layer_types", default_layer_types(self.n_layers))
        else:
            object.__setattr__(self, "layer_types", tuple(self.layer_types))
        positive = (
            "vocab_size",
            "d_model",
            "n_layers",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "mlp_hidden",
            "sliding_window",
            "max_seq_len",
        )
        for field in positive:
            value = getattr(self, field)
            if value <= 0:
                raise ModelConfigError(field, f"{field} must be a positive int, got {value!r}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for RoPE")
        if len(self.layers) != self.n_layers:
            raise ValueError(f"layer_types has {len(self.layers)} entries for n_layers={self.n_layers}")
        bad = sorted(set(self.layers) - set(LAYER_TYPES))
        if bad:
            raise ValueError(f"unknown layer types {bad}; expected {LAYER_TYPES}")
        for field in ("compute_dtype", "param_dtype"):
            if getattr(self, field) not in DTYPES:
                raise ValueError(f"ModelConfig.{field}={getattr(self, field)!r}; expected one of {DTYPES}")
        for field in ("vocab_pad_multiple", "attention_chunk", "seq_chunk"):
            value = getattr(self, field)
            if value is not None and value <= 0:
                raise ModelConfigError(field, f"{field} must be a positive int or None, got {value!r}")
        if self.vocab_padding not in VOCAB_PADDINGS:
            raise ModelConfigError(
                "vocab_padding", f"vocab_padding={self.vocab_padding!r}; expected one of {VOCAB_PADDINGS}"
            )
        object.__setattr__(self, "remat", normalize_remat(self.remat))
        if self.attention_impl not in ATTENTION_IMPLS:
            raise ValueError(f"ModelConfig.attention_impl={self.attention_impl!r}; expected one of {ATTENTION_IMPLS}")
        self._check_splash()
        self._check_rope_scaling()

    def _check_splash(self) -> None:
        """The splash kernel's block, kernel and layout rules (each refusal names its field)."""
        for field in ("splash_block_q", "splash_block_kv", "splash_block_kv_compute"):
            value = getattr(self, field)
            if value is None and field == "splash_block_kv_compute":
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0 or value % SPLASH_LANES:
                raise ValueError(f"ModelConfig.{field} must be a positive multiple of {SPLASH_LANES}, got {value!r}")
        if self.splash_kernel not in SPLASH_KERNELS:
            raise ModelConfigError(
                "splash_kernel", f"splash_kernel={self.splash_kernel!r}; expected one of {SPLASH_KERNELS}"
            )
        if self.splash_kernel == "tokamax" and not self.splash_fused_bwd:
            raise ModelConfigError(
                "splash_kernel",
                "splash_kernel='tokamax' has only the fused backward kernel: set splash_fused_bwd=true too",
            )
        for field in ("splash_q_layout", "splash_k_layout", "splash_v_layout"):
            if getattr(self, field) not in QKV_LAYOUTS:
                raise ModelConfigError(field, f"{field}={getattr(self, field)!r}; expected one of {QKV_LAYOUTS}")
        if self.splash_block_kv_compute is not None and self.splash_block_kv % self.splash_block_kv_compute:
            raise ModelConfigError(
                "splash_block_kv_compute",
                f"splash_block_kv_compute={self.splash_block_kv_compute} must divide splash_block_kv={self.splash_block_kv}",
            )

    def _check_rope_scaling(self) -> None:
        """The rope_scaling/yarn_* rules (each refusal names its field)."""
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ModelConfigError(
                "rope_scaling", f"rope_scaling={self.rope_scaling!r}; expected one of {ROPE_SCALINGS}"
            )
        if not isinstance(self.yarn_full_attn_layers_only, bool):
            raise ModelConfigError(
                "yarn_full_attn_layers_only",
                f"yarn_full_attn_layers_only={self.yarn_full_attn_layers_only!r} is not a bool",
            )
        # factor > 1: YaRN extends the context (at factor <= 1 HF's attention factor is 1, OLMo-core's is not)
        if not (math.isfinite(self.yarn_factor) and self.yarn_factor > 1):
            raise ModelConfigError("yarn_factor", f"yarn_factor={self.yarn_factor!r} must be a finite number > 1")
        for field in ("yarn_beta_fast", "yarn_beta_slow", "yarn_original_max_seq_len"):
            value = getattr(self, field)
            if not (math.isfinite(value) and value > 0):
                raise ModelConfigError(field, f"{field}={value!r} must be a finite number > 0")
        if self.yarn_beta_fast <= self.yarn_beta_slow:
            raise ModelConfigError(
                "yarn_beta_fast",
                f"yarn_beta_fast={self.yarn_beta_fast!r} must exceed yarn_beta_slow={self.yarn_beta_slow!r}",
            )
        af = self.yarn_attention_factor
        if af is not None and not (math.isfinite(af) and af > 0):
            raise ModelConfigError(
                "yarn_attention_factor", f"yarn_attention_factor={af!r} must be a finite number > 0 or null"
            )

    def yarn_in(self, layer: int) -> bool:
        """Whether ``layer``'s RoPE is YaRN-scaled (``rope_scaling``, ``yarn_full_attn_layers_only``)."""
        return self.rope_scaling == "yarn" and (not self.yarn_full_attn_layers_only or self.layers[layer] == FULL)

    @classmethod
    def from_record(cls, fields: dict[str, Any]) -> ModelConfig:
        """The ModelConfig ``dataclasses.asdict`` recorded (a checkpoint's ``model_resolved``: its
        tuples as JSON lists)."""
        values: dict[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
        return cls(**values)

    @property
    def padded_vocab_size(self) -> int:
        """Rows allocated for embedding and LM head (== vocab_size unless padding is on)."""
        m = self.vocab_pad_multiple
        return self.vocab_size if m is None else -(-self.vocab_size // m) * m

    @property
    def scored_vocab_size(self) -> int:
        """Logit columns the softmax (loss, z-loss, scores) runs over: ``padded_vocab_size`` when
        ``vocab_padding`` is "unmasked" (AI2's), else ``vocab_size``."""
        return self.padded_vocab_size if self.vocab_padding == "unmasked" else self.vocab_size

    @property
    def q_width(self) -> int:
        """Width of the query projection (n_heads * head_dim); QK-norm normalises over it."""
        return self.n_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def dtype(self) -> Any:
        return jnp.dtype(self.compute_dtype)

    @property
    def layers(self) -> tuple[str, ...]:
        """``layer_types``, never None once built (``__post_init__`` derives it from ``n_layers``)."""
        assert self.layer_types is not None
        return self.layer_types

    @property
    def params_dtype(self) -> Any:
        return jnp.dtype(self.param_dtype)

    def window_of(self, layer: int) -> int | None:
        """Sliding window of ``layer`` in keys (counting the query), or None for full attention."""
        return self.sliding_window if self.layers[layer] == SLIDING else None


_7B = dict(
    vocab_size=DOLMA2_VOCAB_SIZE,
    d_model=4096,
    n_layers=32,
    n_heads=32,
    n_kv_heads=32,
    head_dim=128,
    mlp_hidden=11008,
    rope_theta=500_000.0,
    sliding_window=4096,
    max_seq_len=8192,
)

PROXY_LAYERS = 2  # what fits one v5e chip: trainer/configs/olmo3-7b-proxy-v5e.yaml says why
# The MXU layout: 16 heads x 256. Its splash blocks are 512 x 512: with head_dim 256 the 1024 x 1024
# default ran out of the kernel's scoped VMEM inside the whole training step on a TPU v5e chip
# ("RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom", bench/RESULTS.md), and 512 costs this
# layout's attention little (the chip's sweep: 21.4 vs 19.7 ms causal, 16.8 vs 16.7 ms window 4096).
_MXU_HEADS = {"n_heads": 16, "n_kv_heads": 16, "head_dim": 256, "splash_block_q": 512, "splash_block_kv": 512}
_PROXY = {
    **_7B,
    "n_layers": PROXY_LAYERS,
    "vocab_size": PROXY32K_VOCAB_SIZE,
    "eos_id": PROXY32K_EOS_ID,
    "pad_id": PROXY32K_PAD_ID,
    "ranks_sha256": PROXY32K_RANKS_SHA256,
}

NAMED_CONFIGS: dict[str, dict[str, Any]] = {
    # AI2's OLMo 3 7B (OLMo-core TransformerConfig.olmo3_7B).
    "olmo3-7b": _7B,
    # Same projection widths (16 x 256 = 32 x 128 = 4096): same params and FLOPs, but every
    # attention matmul is a multiple of a 256x256 matrix unit.
    "olmo3-7b-mxu": {**_7B, **_MXU_HEADS},
    # The one-chip proxy of olmo3-7b (trainer/configs/olmo3-7b-proxy-v5e.yaml): 7B layer widths
    # and heads, the 32k proxy vocabulary, and as many layers as one TPU v5e chip (15.75 GiB)
    # holds with fp32 params, grads and Adam moments (the recipe's comments show the arithmetic).
    "olmo3-7b-proxy": _PROXY,
    "olmo3-7b-proxy-mxu": {**_PROXY, **_MXU_HEADS},
    # CPU-sized configs with the same structure (real vocabulary, sliding + full layers).
    "olmo3-small": dict(
        vocab_size=DOLMA2_VOCAB_SIZE,
        d_model=512,
        n_layers=8,
        n_heads=8,
        n_kv_heads=8,
        head_dim=64,
        mlp_hidden=1408,
        rope_theta=500_000.0,
        sliding_window=256,
        max_seq_len=1024,
    ),
    "olmo3-tiny": dict(
        vocab_size=DOLMA2_VOCAB_SIZE,
        d_model=64,
        n_layers=4,
        n_heads=4,
        n_kv_heads=4,
        head_dim=16,
        mlp_hidden=192,
        rope_theta=500_000.0,
        sliding_window=32,
        max_seq_len=256,
    ),
}


def get_config(name: str, **overrides: Any) -> ModelConfig:
    """Named config with field overrides, e.g. ``get_config("olmo3-tiny", compute_dtype="float32")``.

    ``layer_types`` is re-derived from ``n_layers`` unless it is overridden too.
    """
    if name not in NAMED_CONFIGS:
        raise KeyError(f"unknown model config {name!r}; known: {sorted(NAMED_CONFIGS)}")
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        meant = [m[0] for m in (difflib.get_close_matches(k, sorted(fields), n=1, cutoff=0.6) for k in unknown) if m]
        hint = f" (did you mean {', '.join(map(repr, meant))}?)" if meant else ""
        raise UnknownFieldsError(unknown, f"unknown ModelConfig fields {unknown}{hint}; valid fields: {sorted(fields)}")
    return ModelConfig(**{"name": name, **NAMED_CONFIGS[name], **overrides})
