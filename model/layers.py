"""OLMo 3 building blocks in Flax linen: RMSNorm, RoPE, attention, SwiGLU MLP, block.

Shapes: B batch, T sequence, D d_model, H query heads, K kv heads, G = H // K, hd head_dim,
F mlp_hidden. Parameters are stored in ``param_dtype`` and cast to ``compute_dtype`` for
matmuls; norms, RoPE and softmax run in float32 (as HF does).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.ad_checkpoint import checkpoint_name

from model import attention, context_parallel
from model.config import ModelConfig

MLP_OUT = "mlp_out"  # jax.checkpoint name of a block's MLP output (the "save_attn_mlp_out" remat policy)
# jax.checkpoint name of the MLP's gate and up projections the chunked block tail keeps
# (ModelConfig.seq_chunk_keep_gate_up; saved by the "save_attn_mlp_out" and "save_attn_out" policies)
MLP_GATE_UP = "mlp_gate_up"


def partitioned(init: Callable[..., Any], names: tuple[str | None, ...]) -> Callable[..., jax.Array]:
    """``nn.with_logical_partitioning``, typed as what ``self.param`` returns from it: the array itself
    (flax unboxes the LogicallyPartitioned box, ``unbox=True``; its annotation says the box)."""
    return nn.with_logical_partitioning(init, names)  # type: ignore[return-value]  # the box, unboxed by param


def weight_init(cfg: ModelConfig) -> Any:
    """Truncated normal with std ``init_std`` cut at ±``init_cutoff`` std (OLMo-core's init)."""
    return jax.nn.initializers.truncated_normal(stddev=cfg.init_std, lower=-cfg.init_cutoff, upper=cfg.init_cutoff)


class Constrain:
    """Applies Flax logical sharding constraints when rules and a mesh are given, else no-op."""

    def __init__(self, rules: Any, mesh: Any):
        self.rules, self.mesh = rules, mesh

    def __call__(self, x: jax.Array, names: tuple[str | None, ...]) -> jax.Array:
        if self.rules is None or self.mesh is None:
            return x
        return nn.with_logical_constraint(x, names, rules=self.rules, mesh=self.mesh)


class RMSNorm(nn.Module):
    """``scale * x / sqrt(mean(x², over ``axes``) + eps)`` computed in float32, cast back to x's dtype.

    ``axes``: trailing axes normalised jointly (QK-norm normalises ``(heads, head_dim)`` together,
    i.e. over the full projection width). ``names``: logical axes of ``scale`` (shape of those axes).
    """

    cfg: ModelConfig
    names: tuple[str, ...]
    n_axes: int = 1

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        shape = x.shape[-self.n_axes :]
        scale = self.param("scale", partitioned(nn.initializers.ones, self.names), shape, self.cfg.params_dtype)
        return rms_norm(x, scale, self.cfg.rms_norm_eps)


class NormScale(nn.Module):
    """An RMSNorm's ``scale`` parameter alone (``"scale"``, ones, ``shape``): for a norm applied
    inside a JAX loop (``Attention``'s sequence chunks), where a Flax module cannot be called."""

    cfg: ModelConfig
    names: tuple[str, ...]
    shape: tuple[int, ...]

    @nn.compact
    def __call__(self) -> jax.Array:
        return self.param("scale", partitioned(nn.initializers.ones, self.names), self.shape, self.cfg.params_dtype)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """``RMSNorm`` of x over its trailing ``scale.ndim`` axes, with that scale."""
    axes = tuple(range(-scale.ndim, 0))
    x32 = x.astype(jnp.float32)
    var = jnp.mean(jnp.square(x32), axis=axes, keepdims=True)
    y = x32 * jax.lax.rsqrt(var + eps)
    return (scale.astype(jnp.float32) * y).astype(x.dtype)


def rope_inv_freq(cfg: ModelConfig, yarn: bool = False) -> jax.Array:
    """``1 / theta^(2i/hd)`` for i < hd/2, float32 ``[hd/2]`` (HF's default rope); with ``yarn``,
    YaRN's blend of those and the same divided by ``cfg.yarn_factor`` (``yarn_inv_freq``).

    The frequencies are computed now, op by op, even inside a trace (``ensure_compile_time_eval``):
    the bits OLMo-core's and HF's torch code computes. Traced, XLA folds ``1/θ^(2i/hd)`` to float32
    values up to an ulp off torch's, and at position p an angle moves by up to p·ulp: ~5e-4 rad at
    8,192, logits ~5e-4 off HF's on a long sequence (3.7e-5 within the first 1,024 positions).
    """
    with jax.ensure_compile_time_eval():
        exponents = jnp.arange(0, cfg.head_dim, 2, dtype=jnp.float32) / cfg.head_dim
        inv_freq = 1.0 / (cfg.rope_theta**exponents)
        return yarn_inv_freq(cfg, inv_freq) if yarn else inv_freq


def yarn_ramp_bounds(cfg: ModelConfig) -> tuple[int, int]:
    """The first and last rotary dimension of YaRN's ramp (OLMo-core's ``low``/``high``; HF's
    ``find_correction_range`` with ``truncate``): the dimensions that turn ``yarn_beta_fast`` and
    ``yarn_beta_slow`` times in ``yarn_original_max_seq_len`` tokens, floored/ceiled and clamped
    to ``[0, hd/2 - 1]`` (HF clamps ``high`` to ``hd - 1``: the same unless ``high`` passes ``hd/2``)."""
    dim, theta = cfg.head_dim, cfg.rope_theta

    def dim_from_rotations(n: float) -> float:
        return dim * math.log(cfg.yarn_original_max_seq_len / (n * 2.0 * math.pi)) / (2.0 * math.log(theta))

    low = max(math.floor(dim_from_rotations(cfg.yarn_beta_fast)), 0)
    high = min(math.ceil(dim_from_rotations(cfg.yarn_beta_slow)), dim // 2 - 1)
    return low, high


def yarn_inv_freq(cfg: ModelConfig, inv_freq: jax.Array) -> jax.Array:
    """YaRN's frequencies from the plain ones ``inv_freq`` ``[hd/2]``, as OLMo-core's
    ``YaRNRoPEScalingConfig.compute_scaled_inv_freq``: ``inv_freq / factor`` (interpolation) below
    the ramp's low end, ``inv_freq`` (extrapolation) above its high end, linear in between."""
    low, high = yarn_ramp_bounds(cfg)
    span = max(high - low, 1e-3)  # OLMo-core's guard (HF adds 0.001 to equal bounds)
    ramp = jnp.clip((jnp.arange(inv_freq.shape[0], dtype=jnp.float32) - low) / span, 0.0, 1.0)
    return (inv_freq / cfg.yarn_factor) * ramp + inv_freq * (1.0 - ramp)


def rope_attention_factor(cfg: ModelConfig, yarn: bool = False) -> float:
    """What the scaled layers' cos and sin are multiplied by (so q·k by its square): 1 without
    YaRN; ``yarn_attention_factor``, else ``0.1·ln(yarn_factor) + 1`` (YaRN §3.4; OLMo-core's
    ``get_attention_rescale_factor``, HF's ``get_mscale``)."""
    if not yarn:
        return 1.0
    af = cfg.yarn_attention_factor
    return 0.1 * math.log(cfg.yarn_factor) + 1.0 if af is None else af


def uses_yarn(cfg: ModelConfig, window: int | None) -> bool:
    """Whether a layer with sliding ``window`` (None: a full-attention layer) is YaRN-scaled."""
    return cfg.rope_scaling == "yarn" and (window is None or not cfg.yarn_full_attn_layers_only)


def rope_cos_sin(positions: jax.Array, cfg: ModelConfig, yarn: bool = False) -> tuple[jax.Array, jax.Array]:
    """float32 ``cos, sin`` ``[..., hd]`` of ``positions`` (int ``[...]``), HF's layout (the
    frequencies twice), times the attention factor when ``yarn``."""
    freqs = positions.astype(jnp.float32)[..., None] * rope_inv_freq(cfg, yarn)  # [..., hd/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)
    cos, sin = jnp.cos(emb), jnp.sin(emb)
    if yarn:  # plain RoPE is left as it always was (no multiply by 1.0)
        factor = rope_attention_factor(cfg, yarn)
        cos, sin = cos * factor, sin * factor
    return cos, sin


def apply_rope(x: jax.Array, positions: jax.Array, cfg: ModelConfig, yarn: bool = False) -> jax.Array:
    """Rotary embedding, HF ``rotate_half`` convention (YaRN-scaled when ``yarn``).

    x: ``[B, T, N, hd]``; positions: int ``[B, T]``. Dimension i is paired with i + hd/2.
    Computed in float32, returned in x's dtype.
    """
    cos, sin = rope_cos_sin(positions, cfg, yarn)  # [B, T, hd]
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]  # [B, T, 1, hd]
    x32 = x.astype(jnp.float32)
    half = cfg.head_dim // 2
    rotated = jnp.concatenate([-x32[..., half:], x32[..., :half]], axis=-1)
    return (x32 * cos + rotated * sin).astype(x.dtype)


class Attention(nn.Module):
    """Multi-head (or grouped-query) attention with QK-norm, RoPE, sliding-window + doc masks.

    ``window``: static keys visible per query in this layer (None: full causal attention). The
    attention itself is ``model.attention.attend`` (which implementation runs is chosen there).
    """

    cfg: ModelConfig
    rules: Any = None
    mesh: Any = None
    window: int | None = None
    project_out: bool = True

    def _param(self, name: str, shape: tuple[int, ...], names: tuple[str, ...]) -> jax.Array:
        return self.param(name, partitioned(weight_init(self.cfg), names), shape, self.cfg.params_dtype)

    def _kernel(self, name: str, shape: tuple[int, ...], names: tuple[str, ...]) -> jax.Array:
        return self._param(name, shape, names).astype(self.cfg.dtype)

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None, positions: jax.Array) -> Any:
        """x ``[B, T, D]``; segment_ids int ``[B, T]`` or None; positions ``[B, T]`` → ``[B, T, D]``;
        with ``project_out=False``: (the attention core's output ``[B, K, G, T, hd]``, the ``o_proj``
        kernel in ``param_dtype``), for ``block_tail`` to apply."""
        cfg, c = self.cfg, Constrain(self.rules, self.mesh)
        H, K, hd, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
        B, T, _ = x.shape
        wq = self._kernel("q_proj", (D, H, hd), ("embed", "heads", "head_dim"))
        wk = self._kernel("k_proj", (D, K, hd), ("embed", "kv_heads", "head_dim"))
        wv = self._kernel("v_proj", (D, K, hd), ("embed", "kv_heads", "head_dim"))
        wo_param = self._param("o_proj", (H, hd, D), ("heads", "head_dim", "embed"))
        wo = wo_param.astype(cfg.dtype)
        scales = (
            NormScale(cfg, ("heads", "head_dim"), (H, hd), name="q_norm")(),
            NormScale(cfg, ("kv_heads", "head_dim"), (K, hd), name="k_norm")(),
        )
        weights = (wq, wk, wv, *scales)
        yarn = uses_yarn(cfg, self.window)
        C = cfg.seq_chunk
        if C is not None and C < T and T % C == 0:  # one chunk's float32 norm/RoPE temporaries at a time
            n = T // C
            pieces = jax.lax.map(
                jax.checkpoint(lambda a: project_qkv(cfg, c, a[0], a[1], weights, yarn)),
                (jnp.moveaxis(x.reshape(B, n, C, D), 1, 0), jnp.moveaxis(positions.reshape(B, n, C), 1, 0)),
            )
            q, k, v = (jnp.moveaxis(p, 0, 1).reshape(B, T, *p.shape[3:]) for p in pieces)
            q = c(q, ("act_batch", "act_length", "act_heads", None))
            k = c(k, ("act_batch", "act_length", "act_kv_heads", None))
            v = c(v, ("act_batch", "act_length", "act_kv_heads", None))
        else:
            q, k, v = project_qkv(cfg, c, x, positions, weights, yarn)

        q = q.reshape(B, T, K, H // K, hd)
        attend = context_parallel.attend if context_parallel.active(self.rules, self.mesh) else attention.attend
        out = attend(q, k, v, segment_ids, self.window, cfg, self.rules, self.mesh)
        if not self.project_out:  # [B, K, G, T, hd]: splash's own output layout, no transposed copy
            out = jnp.transpose(out, (0, 2, 3, 1, 4))
            return c(out, ("act_batch", "act_kv_heads", None, "act_length", None)), wo_param
        out = out.reshape(B, T, H, hd)
        out = c(out, ("act_batch", "act_length", "act_heads", None))
        return jnp.einsum("bthk,hkd->btd", out, wo)


def project_qkv(
    cfg: ModelConfig, c: Constrain, x: jax.Array, positions: jax.Array, weights: tuple[jax.Array, ...], yarn: bool
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q ``[B, T, H, hd]``, k, v ``[B, T, K, hd]`` of x ``[B, T, D]``: the projections (``weights``:
    wq, wk, wv in the compute dtype, then the q and k norm scales), QK-norm over the full projection
    width (all heads jointly), then RoPE on q and k; each constrained to its logical sharding by c."""
    wq, wk, wv, q_scale, k_scale = weights
    H, K = wq.shape[1], wk.shape[1]
    if cfg.fused_qkv:  # one matmul over the kernels side by side (same parameters), then split
        qkv = jnp.einsum("btd,dhk->bthk", x, jnp.concatenate([wq, wk, wv], axis=1))
        q, k, v = jnp.split(qkv, [H, H + K], axis=2)
    else:
        q = jnp.einsum("btd,dhk->bthk", x, wq)
        k = jnp.einsum("btd,dhk->bthk", x, wk)
        v = jnp.einsum("btd,dhk->bthk", x, wv)
    q = rms_norm(q, q_scale, cfg.rms_norm_eps)
    k = rms_norm(k, k_scale, cfg.rms_norm_eps)
    q = c(apply_rope(q, positions, cfg, yarn), ("act_batch", "act_length", "act_heads", None))
    k = c(apply_rope(k, positions, cfg, yarn), ("act_batch", "act_length", "act_kv_heads", None))
    return q, k, c(v, ("act_batch", "act_length", "act_kv_heads", None))


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``; x ``[B, T, D]`` → ``[B, T, D]``. With
    ``kernels_only`` it returns its kernels (gate, up, down in ``param_dtype``) instead, for
    ``block_tail`` to apply over sequence chunks."""

    cfg: ModelConfig
    rules: Any = None
    mesh: Any = None
    kernels_only: bool = False

    @nn.compact
    def __call__(self, x: jax.Array | None) -> Any:
        cfg, c = self.cfg, Constrain(self.rules, self.mesh)
        D, F = cfg.d_model, cfg.mlp_hidden
        init = weight_init(cfg)

        def kernel(name: str, shape: tuple[int, int], names: tuple[str, str]) -> jax.Array:
            return self.param(name, partitioned(init, names), shape, cfg.params_dtype)

        kernels = (
            kernel("gate_proj", (D, F), ("embed", "mlp")),
            kernel("up_proj", (D, F), ("embed", "mlp")),
            kernel("down_proj", (F, D), ("mlp", "embed")),
        )
        if self.kernels_only or x is None:
            return kernels
        return swiglu(cfg, c, x, kernels)


def swiglu(cfg: ModelConfig, c: Constrain, x: jax.Array, kernels: tuple[jax.Array, ...]) -> jax.Array:
    """The MLP over x ``[B, C, D]`` with its ``param_dtype`` kernels (gate, up, down), cast here."""
    return swiglu_parts(cfg, c, x, kernels)[0]


def swiglu_parts(
    cfg: ModelConfig, c: Constrain, x: jax.Array, kernels: tuple[jax.Array, ...], kept: tuple | None = None
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """``swiglu`` and its gate and up projections ``[B, C, F]``. With ``kept`` (those projections
    of x computed before), they are taken as they are, not recomputed: the same values and the same
    gradients to x and the kernels (``kept_projection``)."""
    w_gate, w_up = (w.astype(cfg.dtype) for w in kernels[:2])
    if kept is not None:
        gate, up = kept_projection(x, w_gate, kept[0]), kept_projection(x, w_up, kept[1])
    elif cfg.fused_gate_up:  # one [D, 2F] matmul over the two kernels (same parameters), then split
        gate, up = jnp.split(jnp.einsum("btd,df->btf", x, jnp.concatenate([w_gate, w_up], axis=1)), 2, axis=-1)
    else:
        gate = jnp.einsum("btd,df->btf", x, w_gate)
        up = jnp.einsum("btd,df->btf", x, w_up)
    h = c(jax.nn.silu(gate) * up, ("act_batch", "act_length", "act_mlp"))
    return jnp.einsum("btf,fd->btd", h, kernels[2].astype(cfg.dtype)), (gate, up)


def _projection(x: jax.Array, w: jax.Array) -> jax.Array:
    return jnp.einsum("btd,df->btf", x, w)


@jax.custom_vjp
def kept_projection(x: jax.Array, w: jax.Array, value: jax.Array) -> jax.Array:
    """``x @ w`` known already (``value``): returns value; its gradients to x and w are those of
    ``x @ w`` (``jax.vjp`` of the einsum, whose unused forward XLA drops), none to value."""
    return value


def _kept_fwd(x: jax.Array, w: jax.Array, value: jax.Array) -> tuple[jax.Array, tuple]:
    return value, (x, w, value)


def _kept_bwd(res: tuple, dy: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    x, w, value = res
    dx, dw = jax.vjp(_projection, x, w)[1](dy)
    return dx, dw, jnp.zeros_like(value)


kept_projection.defvjp(_kept_fwd, _kept_bwd)


def block_tail(
    cfg: ModelConfig, c: Constrain, seqs: tuple[jax.Array, jax.Array], params: tuple, kept: tuple | None = None
) -> tuple[jax.Array, tuple[jax.Array, jax.Array]]:
    """A block after its attention core, token by token: ``h = x + norm(o @ wo)``, ``out = h +
    norm(mlp(h))`` (``Block``'s function), and the MLP's gate and up projections of h (``[B, C, F]``).
    seqs: (x ``[B, C, D]``, the attention core's output o in the splash kernel's layout
    ``[B, K, G, C, hd]``); params: (wo, post_attn_norm scale, gate, up, down, post_mlp_norm scale),
    in ``param_dtype``, cast here; kept: those gate and up projections computed before (taken, not
    recomputed: ``swiglu_parts``)."""
    x, o = seqs
    wo, s_attn, w_gate, w_up, w_down, s_mlp = params
    K, G, hd = o.shape[1], o.shape[2], o.shape[4]
    a = jnp.einsum("bkgtc,kgcd->btd", o, wo.reshape(K, G, hd, -1).astype(cfg.dtype))
    h = c(x + rms_norm(a, s_attn, cfg.rms_norm_eps), ("act_batch", "act_length", "act_embed"))
    m, gate_up = swiglu_parts(cfg, c, h, (w_gate, w_up, w_down), kept)
    return h + rms_norm(m, s_mlp, cfg.rms_norm_eps), gate_up


def seq_chunked(
    f: Callable,
    seqs: tuple[jax.Array, ...],
    axes: tuple[int, ...],
    params: tuple,
    C: int,
    keep: str | None = None,
) -> jax.Array:
    """``f(seqs, params, None)[0]`` (token-wise along axis ``axes[i]`` of ``seqs[i]``, → ``[B, T, D]``)
    over the sequence C tokens at a time: the forward and backward passes hold one chunk's temporaries
    (``[B, C, F]`` MLP activations, float32 norm values), not the sequence's. The chunks are
    slices of the inputs in their own layout and the outputs are written into whole-sequence
    buffers in place (no transposed copy of an input). A ``custom_vjp`` whose only residuals are
    seqs and params, so no remat policy around it can save the chunks' matmul outputs (a nested
    ``jax.checkpoint`` would not stop ``dots_with_no_batch_dims_saveable`` from stacking them), and
    nothing of f's output is kept: the backward pass recomputes each chunk's forward and takes its
    ``jax.vjp``, chunk by chunk. params enter in ``param_dtype`` (f casts them), so their gradients
    are summed over the chunks in ``param_dtype`` (float32), as one whole-sequence matmul's are.

    f returns (its output, a tuple of values ``[B, C, ...]``) and takes such a tuple, or None, as
    its third argument. With ``keep`` (a ``jax.checkpoint`` name) those values of every chunk are
    kept too (whole-sequence buffers named ``keep``, residuals), and the backward pass hands each
    chunk's to f instead of having it recompute them."""
    T = seqs[0].shape[axes[0]]

    def piece(i: jax.Array, a: jax.Array, axis: int) -> jax.Array:
        return jax.lax.dynamic_slice_in_dim(a, i * C, C, axis=axis)

    def pieces(i: jax.Array, seqs: tuple[jax.Array, ...]) -> tuple[jax.Array, ...]:
        return tuple(piece(i, a, axis) for a, axis in zip(seqs, axes))

    def whole(one: jax.ShapeDtypeStruct) -> jax.Array:
        return jnp.zeros((one.shape[0], T, *one.shape[2:]), one.dtype)

    def forward(seqs: tuple[jax.Array, ...], params: tuple, kept: bool) -> tuple[jax.Array, tuple]:
        one, one_kept = jax.eval_shape(lambda s, p: f(pieces(jnp.int32(0), s), p, None), seqs, params)

        def body(i: jax.Array, carry: tuple) -> tuple:
            out, bufs = carry
            y, values = f(pieces(i, seqs), params, None)
            out = jax.lax.dynamic_update_slice_in_dim(out, y, i * C, axis=1)
            return out, tuple(jax.lax.dynamic_update_slice_in_dim(b, v, i * C, axis=1) for b, v in zip(bufs, values))

        bufs = tuple(whole(o) for o in one_kept) if kept else ()
        return jax.lax.fori_loop(0, T // C, body, (whole(one), bufs))

    @jax.custom_vjp
    def run(seqs: tuple[jax.Array, ...], params: tuple) -> jax.Array:
        return forward(seqs, params, False)[0]

    def fwd(seqs: tuple[jax.Array, ...], params: tuple) -> tuple[jax.Array, tuple]:
        if keep is None:
            return run(seqs, params), (seqs, params, ())
        out, bufs = forward(seqs, params, True)
        return out, (seqs, params, tuple(checkpoint_name(b, keep) for b in bufs))

    def bwd(res: tuple, dy: jax.Array) -> tuple[tuple[jax.Array, ...], tuple]:
        seqs, params, bufs = res
        # the backward pass casts the params itself: without the barrier XLA shares the forward
        # loop's hoisted compute-dtype copies (0.27 GiB a 7B layer) and keeps them alive till here
        params = jax.lax.optimization_barrier(params)

        def body(i: jax.Array, carry: tuple) -> tuple:
            acc, ds = carry
            kept = tuple(piece(i, b, 1) for b in bufs) if bufs else None
            _, vjp = jax.vjp(lambda s, p: f(s, p, kept)[0], pieces(i, seqs), params)
            dsc, dp = vjp(piece(i, dy, 1))
            ds = tuple(jax.lax.dynamic_update_slice_in_dim(d, g, i * C, axis) for d, g, axis in zip(ds, dsc, axes))
            return jax.tree.map(jnp.add, acc, dp), ds

        zeros = (jax.tree.map(jnp.zeros_like, params), tuple(jnp.zeros_like(a) for a in seqs))
        dp, ds = jax.lax.fori_loop(0, T // C, body, zeros)
        return ds, dp

    run.defvjp(fwd, bwd)
    return run(seqs, params)


class Block(nn.Module):
    """Reordered post-norm block: ``h = x + norm(attn(x))``; ``out = h + norm(mlp(h))``.

    Written for ``nn.scan``: ``(carry=x, segment_ids, positions) -> (out, None)``. ``window``: the
    layer's static sliding window (None: full attention).
    """

    cfg: ModelConfig
    rules: Any = None
    mesh: Any = None
    window: int | None = None

    @nn.compact
    def __call__(self, x: jax.Array, segment_ids: jax.Array | None, positions: jax.Array) -> tuple[jax.Array, None]:
        cfg, c = self.cfg, Constrain(self.rules, self.mesh)
        C, T = cfg.seq_chunk, x.shape[1]
        if C is not None and C < T and T % C == 0:  # the tail over sequence chunks (seq_chunked)
            o, wo = Attention(cfg, self.rules, self.mesh, self.window, project_out=False, name="attn")(
                x, segment_ids, positions
            )
            scale = (cfg.d_model,)
            params = (
                wo,
                NormScale(cfg, ("embed",), scale, name="post_attn_norm")(),
                *MLP(cfg, self.rules, self.mesh, kernels_only=True, name="mlp")(None),
                NormScale(cfg, ("embed",), scale, name="post_mlp_norm")(),
            )
            keep = MLP_GATE_UP if cfg.seq_chunk_keep_gate_up else None
            out = seq_chunked(lambda s, p, k: block_tail(cfg, c, s, p, k), (x, o), (1, 3), params, C, keep)
            return c(out, ("act_batch", "act_length", "act_embed")), None
        a = Attention(cfg, self.rules, self.mesh, self.window, name="attn")(x, segment_ids, positions)
        h = x + RMSNorm(cfg, ("embed",), name="post_attn_norm")(a)
        h = c(h, ("act_batch", "act_length", "act_embed"))
        m = checkpoint_name(MLP(cfg, self.rules, self.mesh, name="mlp")(h), MLP_OUT)
        out = h + RMSNorm(cfg, ("embed",), name="post_mlp_norm")(m)
        return c(out, ("act_batch", "act_length", "act_embed")), None
