"""Attention: one function, two implementations, chosen in one place (``attend``).

Shapes: B batch, T sequence, K kv heads, G = H // K query heads per kv head, hd head_dim.
Both implementations compute exactly the same masked softmax attention: query q sees key k iff

* ``k <= q`` (causal);
* ``q - W < k`` in sliding layers with window W (HF's ``sliding_window_overlay``: W keys counting
  the query itself); full layers pass ``window=None``;
* ``segment_ids[q] == segment_ids[k]`` when segment ids are given (document masking; the loader's
  PAD tokens share id 0, so a PAD token attends causally over its PAD run, as before). The
  diagonal is always visible, so no row is ever fully masked.

Implementations (``ModelConfig.attention_impl``; ``resolve_impl`` says which one runs):

* ``xla``: jnp einsums, scores and softmax in float32. With ``attention_chunk = C`` the queries
  run C at a time under ``jax.checkpoint``; in a sliding layer the chunk at q0 reads only the
  ``W + C - 1`` keys ``[q0 - W + 1, q0 + C)`` (a static-length slice, clamped at the ends), the
  only ones its window can see. Runs anywhere (the CPU and GPU path).
* ``splash``: JAX's own Pallas TPU kernel (``jax.experimental.pallas.ops.tpu.splash_attention``,
  MaxText's TPU default): block-sparse flash attention that skips the tiles its static mask rules
  out (``LocalMask`` in sliding layers, ``CausalMask`` in full ones) and applies segment ids in the
  kernel. GQA: the MQA kernel (G query heads over one kv head) vmapped over kv heads and batch.
  Under a mesh it runs inside ``shard_map`` over the batch axes with kv heads over their axis (the
  logical rules of ``model.axis_rules``); each device holds whole sequences, so nothing is
  gathered along the sequence. On a CPU backend it runs in Pallas interpret mode (slow, exact: how
  CI tests it); on GPU it is refused. The default over tokamax's splash: this one ships with the
  pinned JAX (no dependency to install on the chip) and it is the kernel the speed-up was measured
  with. ``splash_kernel: tokamax`` runs tokamax's instead (``tokamax_splash_kernel``: the same
  masks, blocks and layouts; fused backward only), reached through the private
  ``tokamax._src`` path MaxText's ``use_tokamax_splash`` imports too (no public one in 0.0.x);
  tokamax is not a dependency, so that option needs it installed.
  ``splash_{q,k,v}_layout`` set the kernel's ``QKVLayout`` per operand (``seq_minor``: the kernel
  reads ``[.., hd, T]``, transposing inside the call; the interface stays ``[.., T, hd]``).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import PartitionSpec

from model.config import ATTENTION_IMPLS, SPLASH_LANES, ModelConfig

# Added to masked attention scores; finite so a fully masked row cannot produce NaN.
MASK_VALUE = -0.7 * float(jnp.finfo(jnp.float32).max)
GPU_PLATFORMS = ("gpu", "cuda", "rocm")


def resolve_impl(value: str, platform: str) -> str:
    """``"xla"`` or ``"splash"``: what ``attention_impl=value`` runs on ``platform`` (pure).

    platform: a JAX platform name (``"tpu"``, ``"cpu"``, ``"gpu"``/``"cuda"``/``"rocm"``); pass the
    platform the program is compiled FOR (an ahead-of-time TPU compile on a CPU machine passes
    ``"tpu"``). ``auto`` is splash on TPU, xla elsewhere; ``splash`` on GPU is refused.
    """
    if value not in ATTENTION_IMPLS:
        raise ValueError(f"attention_impl={value!r}; expected one of {ATTENTION_IMPLS}")
    if value == "auto":
        return "splash" if platform == "tpu" else "xla"
    if value == "splash" and platform in GPU_PLATFORMS:
        raise ValueError(
            "attention_impl='splash' is a TPU kernel (Pallas/Mosaic) and does not run on GPU: "
            "set attention_impl to 'xla' (or 'auto')"
        )
    return value


def resolved(cfg: ModelConfig, platform: str) -> ModelConfig:
    """``cfg`` with ``attention_impl: auto`` resolved for ``platform`` (splash on TPU, xla elsewhere;
    another value is kept: ``resolve_impl`` refuses splash on GPU where the run is checked): the one
    place a ModelConfig's ``auto`` is resolved (the trainer's start-up, ``trainer.compile``, scoring
    after the fact)."""
    if cfg.attention_impl != "auto":
        return cfg
    return dataclasses.replace(cfg, attention_impl=resolve_impl("auto", platform))


def platform_of(mesh: jax.sharding.Mesh | None) -> str:
    """The platform a computation over ``mesh`` is compiled for (its devices', which for an
    ahead-of-time topology are the target's), else JAX's default backend."""
    return mesh.devices.flat[0].platform if mesh is not None else jax.default_backend()


def splash_blocks(cfg: ModelConfig, seq_len: int) -> tuple[int, int]:
    """(block_q, block_kv) the kernel uses for ``seq_len``: the config's, or one block of the whole
    sequence when it is shorter. ValueError naming the field when the kernel cannot tile it."""
    blocks = []
    for field in ("splash_block_q", "splash_block_kv"):
        block = min(getattr(cfg, field), seq_len)
        if seq_len % block or block % SPLASH_LANES:
            raise ValueError(
                f"splash attention cannot tile sequence length {seq_len} with {field}={getattr(cfg, field)}: "
                f"the length must be a multiple of the block (a shorter sequence, a multiple of {SPLASH_LANES}); "
                f"change {field} or the sequence length, or set attention_impl=xla"
            )
        blocks.append(block)
    return blocks[0], blocks[1]


TOKAMAX_MISSING = (
    "splash_kernel='tokamax' needs the tokamax package (pip install tokamax; it is not a dependency "
    "of olmax): install it or set splash_kernel=jax"
)


SCOPE = "attention_core"  # the name scope of the attention itself (not its projections)
# jax.checkpoint name of the attention output (and splash's logsumexp, the residuals its backward
# kernels read): what the "save_attn_mlp_out" remat policy keeps (model.transformer.remat_policy)
ATTN_OUT = "attn_out"


def check_seq_len(cfg: ModelConfig, seq_len: int, impl: str) -> None:
    """ValueError naming the config field when ``impl`` cannot run sequences of ``seq_len`` (or,
    splash from tokamax, when the tokamax package is not installed: refused before step 0)."""
    if impl == "splash":
        splash_blocks(cfg, seq_len)
        if cfg.splash_kernel == "tokamax" and importlib.util.find_spec("tokamax") is None:
            raise ValueError(TOKAMAX_MISSING)
    elif cfg.attention_chunk is not None and cfg.attention_chunk < seq_len and seq_len % cfg.attention_chunk:
        raise ValueError(f"sequence length {seq_len} is not a multiple of attention_chunk={cfg.attention_chunk}")


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    window: int | None,
    cfg: ModelConfig,
    rules: Any = None,
    mesh: jax.sharding.Mesh | None = None,
) -> jax.Array:
    """q ``[B, T, K, G, hd]``, k/v ``[B, T, K, hd]``, segment_ids int ``[B, T]`` or None, window
    static (None: full causal) → ``[B, T, K, G, hd]`` in q's dtype. The one place that picks the
    implementation (``cfg.attention_impl`` on the platform of ``mesh``, else the default backend)."""
    platform = platform_of(mesh)
    impl = resolve_impl(cfg.attention_impl, platform)
    check_seq_len(cfg, q.shape[1], impl)
    with jax.named_scope(SCOPE):  # what bench.phases counts as attention
        if impl == "xla":
            return checkpoint_name(attend_xla(q, k, v, segment_ids, window, cfg), ATTN_OUT)
        return attend_splash(q, k, v, segment_ids, window, cfg, interpret=platform == "cpu", rules=rules, mesh=mesh)


# ----------------------------------------------------------------------------------------- xla


def visible(
    rows: jax.Array, cols: jax.Array, window: int | None, seg_q: jax.Array | None, seg_k: jax.Array | None
) -> jax.Array:
    """bool ``[B|1, C, S]``: query position ``rows[c]`` may see key position ``cols[s]``.

    rows int ``[C]``, cols int ``[S]``, seg_q ``[B, C]`` / seg_k ``[B, S]`` or None."""
    allowed = cols[None, :] <= rows[:, None]
    if window is not None:
        allowed = allowed & (cols[None, :] > rows[:, None] - window)  # HF: q - W < k
    allowed = allowed[None]
    if seg_q is not None:
        assert seg_k is not None, "seg_q and seg_k come together"
        allowed = allowed & (seg_q[:, :, None] == seg_k[:, None, :])
    return allowed


def _softmax_attention(q: jax.Array, k: jax.Array, v: jax.Array, allowed: jax.Array, cfg: ModelConfig) -> jax.Array:
    """q ``[B, C, K, G, hd]``; k, v ``[B, S, K, hd]``; allowed ``[B|1, C, S]`` → ``[B, C, K, G, hd]``.
    Scores and softmax in float32, scaled after the matmul (as HF does)."""
    scores = jnp.einsum("bqkgd,bskd->bkgqs", q, k, preferred_element_type=jnp.float32)
    scores = scores * (cfg.head_dim**-0.5)
    scores = jnp.where(allowed[:, None, None], scores, MASK_VALUE)
    probs = jax.nn.softmax(scores, axis=-1).astype(q.dtype)
    return jnp.einsum("bkgqs,bskd->bqkgd", probs, v)


def attend_xla(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    window: int | None,
    cfg: ModelConfig,
    slice_keys: bool = True,
) -> jax.Array:
    """The jnp implementation (see the module doc); shapes as ``attend``.

    With ``cfg.attention_chunk = C`` the queries are processed C at a time under
    ``jax.checkpoint`` (memory-efficient attention, Rabe & Staats 2021): one chunk's ``[.., C, S]``
    scores are the largest live attention buffer in forward *and* backward. Written by hand
    because JAX has no such fallback for arbitrary (sliding-window x document) masks outside
    accelerator kernels. ``slice_keys=False`` scores every chunk against all T keys (the path
    before key slicing; the tests hold the two equal).
    """
    B, T = q.shape[:2]
    C = cfg.attention_chunk if cfg.attention_chunk is not None and cfg.attention_chunk < T else T
    if T % C:
        raise ValueError(f"sequence length {T} is not a multiple of attention_chunk={C}")
    if window is not None and window >= T:
        window = None  # every causal key is inside the window
    S = T if window is None or not slice_keys else min(T, window + C - 1)

    def one_chunk(q0: jax.Array | int, qc: jax.Array) -> jax.Array:
        # keys [q0 - W + 1, q0 + C) ⊆ [start, start + S): clamped into [0, T) it still covers them
        start = 0 if S == T or window is None else jnp.clip(q0 - window + 1, 0, T - S)  # S < T: a window
        kc, vc = (
            (k, v)
            if S == T
            else (jax.lax.dynamic_slice_in_dim(k, start, S, 1), jax.lax.dynamic_slice_in_dim(v, start, S, 1))
        )
        seg_q = seg_k = None
        if segment_ids is not None:
            seg_q = segment_ids if C == T else jax.lax.dynamic_slice_in_dim(segment_ids, q0, C, 1)
            seg_k = segment_ids if S == T else jax.lax.dynamic_slice_in_dim(segment_ids, start, S, 1)
        rows, cols = q0 + jnp.arange(C), start + jnp.arange(S)
        return _softmax_attention(qc, kc, vc, visible(rows, cols, window, seg_q, seg_k), cfg)

    if C == T:
        return one_chunk(0, q)
    n = T // C
    qs = jnp.moveaxis(q.reshape(B, n, C, *q.shape[2:]), 1, 0)  # [n, B, C, K, G, hd]
    starts = jnp.arange(n, dtype=jnp.int32) * C
    out = jax.lax.map(jax.checkpoint(lambda a: one_chunk(*a)), (starts, qs))  # [n, B, C, K, G, hd]
    return jnp.moveaxis(out, 0, 1).reshape(q.shape)


# -------------------------------------------------------------------------------------- splash


def splash_mask(seq_len: int, window: int | None) -> splash.Mask:
    """The kernel's static mask for one head: HF's window ``q - W < k <= q`` is
    ``LocalMask(window_size=(W - 1, 0))`` (left W - 1 keys, none to the right); full layers causal."""
    if window is None or window >= seq_len:
        return splash.CausalMask((seq_len, seq_len))
    return splash.LocalMask((seq_len, seq_len), window_size=(window - 1, 0), offset=0)


@functools.cache
def splash_kernel(
    seq_len: int,
    window: int | None,
    group: int,
    block_q: int,
    block_kv: int,
    interpret: bool,
    block_kv_compute: int | None = None,
    fused_bwd: bool = False,
    layouts: tuple[str, str, str] = ("head_dim_minor",) * 3,
) -> splash.splash_attention_kernel.SplashAttentionKernel:
    """The MQA splash kernel for ``group`` query heads over one kv head, cached by its static key
    (``fused_bwd``: one dq/dk/dv backward kernel instead of a dq and a dkv kernel; ``layouts``: the
    q, k, v layouts, names of ``model.config.QKV_LAYOUTS``).

    Built as concrete numpy data even when first asked for inside a trace (``ensure_compile_time_eval``,
    then ``np.asarray`` on its mask-info leaves): a kernel built inside a trace holds tracers, and
    caching it leaks them (``UnexpectedTracerError`` in the next trace).
    """
    sizes = splash.BlockSizes(
        **_block_fields(block_q, block_kv, block_kv_compute),
        block_q_dq=None if fused_bwd else block_q,  # the fused kernel computes dq too
        block_kv_dq=None if fused_bwd else block_kv,
        use_fused_bwd_kernel=fused_bwd,
        **_layout_fields(splash.QKVLayout, layouts),
    )
    mask = splash.MultiHeadMask([splash_mask(seq_len, window)] * group)
    with jax.ensure_compile_time_eval():
        kernel = splash.make_splash_mqa_single_device(
            mask, block_sizes=sizes, interpret=interpret, residual_checkpoint_name=ATTN_OUT
        )
    return jax.tree.map(np.asarray, kernel)


def _block_fields(block_q: int, block_kv: int, block_kv_compute: int | None) -> dict[str, Any]:
    """The forward and dkv block sizes JAX's and tokamax's splash configs share (the same names)."""
    compute = min(block_kv_compute or block_kv, block_kv)  # a sequence shorter than the block: one block
    return {
        "block_q": block_q,
        "block_kv": block_kv,
        "block_kv_compute": compute,
        "block_q_dkv": block_q,
        "block_kv_dkv": block_kv,
        "block_kv_dkv_compute": compute,
    }


def _layout_fields(enum: Any, layouts: tuple[str, str, str]) -> dict[str, Any]:
    """``{q_layout, k_layout, v_layout}`` of a kernel's block-size config, from layout names."""
    return {f"{x}_layout": enum[name.upper()] for x, name in zip("qkv", layouts)}


@functools.cache
def tokamax_splash_kernel(
    seq_len: int,
    window: int | None,
    block_q: int,
    block_kv: int,
    interpret: bool,
    block_kv_compute: int | None = None,
    layouts: tuple[str, str, str] = ("head_dim_minor",) * 3,
) -> Any:
    """tokamax's MQA splash kernel (its only backward is the fused one), cached as ``splash_kernel``
    is and for the same reason built as concrete numpy data. Called as JAX's: ``kernel(q [G, T, hd],
    k [T, hd], v [T, hd], segment_ids=...)``; one 2-D mask serves every query head. Its module is
    tokamax's private path (``tokamax._src``), as MaxText imports it: 0.0.x has no public one."""
    try:
        # optional: tokamax is not a dependency
        from tokamax._src.ops.experimental.tpu.splash_attention import (
            splash_attention_kernel as tk,
        )
        from tokamax._src.ops.experimental.tpu.splash_attention import (
            splash_attention_mask as tm,
        )
    except ImportError as e:
        raise ImportError(TOKAMAX_MISSING) from e
    config = tk.SplashConfig(
        **_block_fields(block_q, block_kv, block_kv_compute),
        use_fused_bwd_kernel=True,
        interpret=interpret,
        **_layout_fields(tk.QKVLayout, layouts),
    )
    if window is None or window >= seq_len:
        mask = tm.CausalMask((seq_len, seq_len))
    else:
        mask = tm.LocalMask((seq_len, seq_len), window_size=(window - 1, 0), offset=0)
    with jax.ensure_compile_time_eval():
        kernel = tk.make_splash_mqa_single_device(mask, config=config)
    return jax.tree.map(np.asarray, kernel)


def tokamax_segment_ids(q: jax.Array, kv: jax.Array) -> Any:
    """tokamax's own ``SegmentIds`` (its kernel's argument type)."""
    from tokamax._src.ops.experimental.tpu.splash_attention import base  # optional: tokamax is not a dependency

    return base.SegmentIds(q=q, kv=kv)


# The fused backward kernel writes each query block's dq once per key block and sums the partials
# after it: a buffer of rows x heads x (T / block_kv) x T x head_dim in bf16 (fused_dq_bytes), which
# grows with T²: 256 MiB for the stock proxy at 8,192 (1024 x 2048 blocks), 4 GiB at 32,768, 16 GiB at
# 65,536 (trainer.compile for v5e:1x1). Above this budget the separate dq and dkv kernels run instead
# (no such buffer; on the chip at 8k the fused one was 1.6-2.7% faster, bench/RESULTS.md).
FUSED_DQ_BUDGET = 2**30


def fused_dq_bytes(rows: int, heads: int, seq_len: int, block_kv: int, head_dim: int) -> int:
    """Bytes of the fused backward kernel's per-key-block dq partials (see FUSED_DQ_BUDGET)."""
    return rows * heads * -(-seq_len // block_kv) * seq_len * head_dim * 2


def _batch_shards(rules: Any, mesh: jax.sharding.Mesh | None) -> int:
    """Devices the batch rows are split over inside splash's shard_map (1 without a mesh)."""
    if mesh is None or rules is None:
        return 1
    batch = _splash_specs(rules)[1][0]
    axes = () if batch is None else (batch,) if isinstance(batch, str) else tuple(batch)
    return int(np.prod([mesh.shape[a] for a in axes])) if axes else 1


def _splash_specs(rules: Any) -> tuple[PartitionSpec, PartitionSpec]:
    """shard_map specs of (q/out ``[B, K, G, T, hd]``, segment ids ``[B, T]``) from the logical rules."""
    spec = nn.logical_to_mesh_axes(("act_batch", "act_kv_heads", "act_length"), rules)
    assert spec is not None  # None only for no names
    batch, heads, length = spec
    if length is not None:
        raise ValueError(
            f"splash attention holds whole sequences per device, but the sharding rules lay "
            f"act_length on {length!r}: set act_length to None or attention_impl=xla"
        )
    return PartitionSpec(batch, heads, None, None, None), PartitionSpec(batch, None)


def attend_splash(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    window: int | None,
    cfg: ModelConfig,
    interpret: bool,
    rules: Any = None,
    mesh: jax.sharding.Mesh | None = None,
) -> jax.Array:
    """The splash implementation (see the module doc); shapes as ``attend``."""
    B, T, K, G, hd = q.shape
    block_q, block_kv = splash_blocks(cfg, T)
    window = window if window is not None and window < T else None
    layouts = (cfg.splash_q_layout, cfg.splash_k_layout, cfg.splash_v_layout)
    if cfg.splash_kernel == "tokamax":
        kernel = tokamax_splash_kernel(T, window, block_q, block_kv, interpret, cfg.splash_block_kv_compute, layouts)
        segment_ids_of = tokamax_segment_ids
    else:
        rows = B // _batch_shards(rules, mesh)  # one device's rows: what the kernel's buffers hold
        fused = cfg.splash_fused_bwd and fused_dq_bytes(rows, G * K, T, block_kv, hd) <= FUSED_DQ_BUDGET
        kernel = splash_kernel(T, window, G, block_q, block_kv, interpret, cfg.splash_block_kv_compute, fused, layouts)
        segment_ids_of = splash.SegmentIds
    # the kernel does not scale the scores: scale q (in float32, then back to the compute dtype)
    q = (q.astype(jnp.float32) * hd**-0.5).astype(q.dtype)
    q = jnp.transpose(q, (0, 2, 3, 1, 4))  # [B, K, G, T, hd]
    k, v = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))  # [B, K, T, hd]

    # one device's rows and kv heads
    def local(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array | None = None) -> Any:
        # q [K, G, T, hd], k/v [K, T, hd], seg [T] or None (the kernel's output: Any in its stubs)
        def one_row(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array | None) -> Any:
            if cfg.seq_chunk is not None and cfg.splash_kernel == "jax":  # the long-context options
                return jax.vmap(lambda qh, kh, vh: residuals_cut(kernel, segment_ids_of, qh, kh, vh, seg))(q, k, v)
            ids = None if seg is None else segment_ids_of(q=seg, kv=seg)
            return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=ids))(q, k, v)

        return jax.vmap(one_row, in_axes=(0, 0, 0, None if seg is None else 0))(q, k, v, seg)

    args = (q, k, v) if segment_ids is None else (q, k, v, segment_ids.astype(jnp.int32))
    if mesh is None or rules is None:
        out = local(*args)
    else:
        qspec, segspec = _splash_specs(rules)
        kvspec = PartitionSpec(*qspec[:2], None, None)
        in_specs = (qspec, kvspec, kvspec) + (() if segment_ids is None else (segspec,))
        # check_vma=False: pallas_call has no varying-manual-axes rule (as in MaxText)
        out = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=qspec, check_vma=False)(*args)
    return jnp.transpose(out, (0, 3, 1, 2, 4))  # [B, T, K, G, hd]


def residuals_cut(
    kernel: Any, segment_ids_of: Any, q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array | None
) -> Any:
    """``kernel(q, k, v, segment_ids=seg)`` whose saved output and logsumexp are cut where the kernel
    writes them: the kernel's logsumexp is lane-wide (``[H, T, 128]`` float32, 1 GiB a 7B layer at
    65,536 tokens) and sliced to ``[H, T]`` by JAX; left alone XLA fused that slice into the backward
    pass and kept the lane-wide buffer alive in between. Here both residuals pass an optimization
    barrier right after the kernel (so the slice runs there) and are named ``ATTN_OUT`` again (what
    the long-context remat policies save). The same function and gradients."""

    def call(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array | None) -> Any:
        return kernel(q, k, v, segment_ids=None if seg is None else segment_ids_of(q=seg, kv=seg))

    @jax.custom_vjp
    def run(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array | None) -> Any:
        return call(q, k, v, seg)

    def fwd(q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array | None) -> tuple[Any, Any]:
        out, vjp = jax.vjp(call, q, k, v, seg)
        leaves, tree = jax.tree.flatten(vjp)
        cut = [i for i, x in enumerate(leaves) if x is out or (x.dtype == jnp.float32 and x.shape == out.shape[:-1])]
        kept = jax.lax.optimization_barrier([leaves[i] for i in cut])
        for i, x in zip(cut, kept):
            leaves[i] = checkpoint_name(x, ATTN_OUT)
        return next((leaves[i] for i in cut if leaves[i].shape == out.shape), out), jax.tree.unflatten(tree, leaves)

    def bwd(vjp: Any, dout: jax.Array) -> Any:
        return vjp(dout)

    run.defvjp(fwd, bwd)
    return run(q, k, v, seg)
