"""Context parallelism: each device holds ``seq_len / C`` positions of its rows (mesh axis ``context``
of size C); attention all-gathers K and V over that axis (the scheme that handles sliding windows:
a query's keys may sit on any device, and a window needs no ring schedule).

**Layout (zig-zag load balancing).** Causal attention over a sequence cut into C contiguous pieces
gives the last device C times the first one's work. The sequence is instead cut into 2C chunks of
``L = T / 2C``, and device i holds chunks i and 2C - 1 - i (an early and a late one: equal causal
work on every device; a sliding-window layer's work is even anyway). ``to_layout`` maps a natural
``[.., T, ..]`` array into that order (device-major: device 0's two chunks, then device 1's, ...),
``from_layout`` back. Striped sharding (token t on device t mod C) balances as well, but a splash
query block then spans C times as many original positions, so a sliding layer's blocks touch
~(W + C·block_q) keys instead of ~(W + block_q): zig-zag keeps every block contiguous and the
kernel's block sparsity what it is unsharded. (Megatron's and MaxText's load-balanced context
parallelism use the same 2C-chunk order.)

The trainer lays out a batch on the device (``trainer.step``): tokens, RoPE positions (the real
ones, permuted with their tokens), segment ids, and the next-token targets and their mask, taken
*before* the permutation; the loss sums are sums over positions, so they do not depend on the order.
Nothing on the host changes (the loader, its host slices, the data log).

**Attention** (``attend``, inside ``shard_map`` over batch, context and kv-head axes): each device
all-gathers its rows' K, V (and segment ids) over ``context`` (the backward pass: a reduce-scatter),
puts them back in natural order, and attends its local queries to all T keys with the mask taken
at the queries' *original* indices: causal, ``q - W < k`` in sliding layers, equal segment ids.

* ``xla``: per local chunk (original start ``i·L`` or ``(2C-1-i)·L``), ``attention_chunk`` queries
  at a time, a sliding layer slicing its ``W + chunk - 1`` keys as ``model.attention.attend_xla``.
* ``splash``: JAX's kernel built for the whole ``[T, T]`` mask with ``q_seq_shards = C`` (its
  mask-info arrays are split by query block over ``context``: ``manual_sharding_spec``) and the
  mask's ``q_sequence`` (the original index of each query row, which the kernel's mask function
  reads) set to the layout's order. K and V are natural, so ``CausalMask`` and ``LocalMask`` apply
  as they are; only their rows are permuted. Each device's slice holds its own queries' blocks.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from jax.ad_checkpoint import checkpoint_name
from jax.experimental.pallas.ops.tpu import splash_attention as splash
from jax.sharding import NamedSharding, PartitionSpec

from model import attention as attn
from model.axis_rules import CONTEXT, ShardingConfig
from model.config import ModelConfig


def context_size(mesh: jax.sharding.Mesh | None) -> int:
    """C: the size of the mesh's ``context`` axis (1 when it has none)."""
    return 1 if mesh is None else int(dict(mesh.shape).get(CONTEXT, 1))


def active(rules: Any, mesh: jax.sharding.Mesh | None) -> bool:
    """Whether activations are laid out along ``context`` (the rules put ``act_length`` on it)."""
    return context_size(mesh) > 1 and rules is not None and dict(rules).get("act_length") == CONTEXT


def sharding_config(base: ShardingConfig | None = None) -> ShardingConfig:
    """The logical rules of a context-parallel run: sequence positions over ``context``, and the
    weights' ``embed`` dimension over ``fsdp`` and ``context`` together (the context devices would
    otherwise each hold a copy of what their fsdp group shards: MaxText's rules do the same)."""
    base = base or ShardingConfig()
    embed = base.embed if isinstance(base.embed, tuple) else (base.embed,) if base.embed else ()
    return dataclasses.replace(base, act_length=CONTEXT, embed=(*embed, CONTEXT))


def loss_rules(sharding: ShardingConfig) -> tuple:
    """Rules for the loss over ``rows_of``'s ``[B·C, T/C]`` rows: the rows over the batch axes and
    ``context``, positions unsharded (each device's own positions are its rows)."""
    batch = sharding.act_batch if isinstance(sharding.act_batch, tuple) else (sharding.act_batch,)
    return dataclasses.replace(sharding, act_batch=(*batch, CONTEXT), act_length=None).rules


def check(seq_len: int, context: int) -> None:
    """ValueError unless ``seq_len`` cuts into the layout's 2C equal chunks."""
    if context > 1 and seq_len % (2 * context):
        raise ValueError(
            f"mesh.context={context} needs seq_len divisible by 2 x context = {2 * context} (the zig-zag "
            f"layout's chunks); seq_len {seq_len} is not"
        )


# ------------------------------------------------------------------------------------- layout


def _xp(x: Any) -> Any:
    return np if isinstance(x, np.ndarray) else jnp


def to_layout(x: Any, C: int, axis: int = 1) -> Any:
    """Natural order → the zig-zag layout along ``axis`` (numpy or jax): chunk order
    ``0, 2C-1, 1, 2C-2, ...``, so that device i's contiguous ``T / C`` hold chunks i and 2C-1-i."""
    if C == 1:
        return x
    xp, shape = _xp(x), x.shape
    L = shape[axis] // (2 * C)
    xs = x.reshape(*shape[:axis], 2 * C, L, *shape[axis + 1 :])
    front = xp.take(xs, np.arange(C), axis=axis)
    back = xp.flip(xp.take(xs, np.arange(C, 2 * C), axis=axis), axis=axis)
    return xp.stack([front, back], axis=axis + 1).reshape(shape)


def from_layout(x: Any, C: int, axis: int = 1) -> Any:
    """The zig-zag layout → natural order along ``axis`` (``to_layout``'s inverse)."""
    if C == 1:
        return x
    xp, shape = _xp(x), x.shape
    L = shape[axis] // (2 * C)
    xs = x.reshape(*shape[:axis], C, 2, L, *shape[axis + 1 :])
    front = xp.take(xs, 0, axis=axis + 1)
    back = xp.flip(xp.take(xs, 1, axis=axis + 1), axis=axis)
    return xp.concatenate([front, back], axis=axis).reshape(shape)


def layout_index(seq_len: int, C: int) -> np.ndarray:
    """int32 ``[T]``: the original position of each position of the layout."""
    return to_layout(np.arange(seq_len, dtype=np.int32)[None], C)[0]


def rows_of(x: jax.Array, C: int) -> jax.Array:
    """``[B, T, ...]`` in the layout → ``[B·C, T/C, ...]``: each device's positions of a row become a
    row of their own (no data moves: row b·C + i is device i's part of row b)."""
    B, T = x.shape[:2]
    return x.reshape(B * C, T // C, *x.shape[2:])


# ----------------------------------------------------------------------------------- attention


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    segment_ids: jax.Array | None,
    window: int | None,
    cfg: ModelConfig,
    rules: Any,
    mesh: jax.sharding.Mesh,
) -> jax.Array:
    """``model.attention.attend`` for activations in the layout, T sharded over ``context``: q
    ``[B, T, K, G, hd]``, k/v ``[B, T, K, hd]``, segment_ids ``[B, T]`` or None → ``[B, T, K, G, hd]``."""
    platform = attn.platform_of(mesh)
    impl = attn.resolve_impl(cfg.attention_impl, platform)
    C, T = context_size(mesh), q.shape[1]
    check(T, C)
    window = window if window is not None and window < T else None
    spec = nn.logical_to_mesh_axes(("act_batch", "act_kv_heads"), rules)
    assert spec is not None  # None only for no names
    batch, heads = spec
    qspec = PartitionSpec(batch, CONTEXT, heads, None, None)
    kvspec, segspec = PartitionSpec(batch, CONTEXT, heads, None), PartitionSpec(batch, CONTEXT)
    segs = () if segment_ids is None else (segment_ids.astype(jnp.int32),)
    in_specs: tuple = (qspec, kvspec, kvspec) + (() if segment_ids is None else (segspec,))
    with jax.named_scope(attn.SCOPE):
        if impl == "xla":
            local = functools.partial(_local_xla, C=C, window=window, cfg=cfg)
            out = jax.shard_map(local, mesh=mesh, in_specs=in_specs, out_specs=qspec)(q, k, v, *segs)
            return checkpoint_name(out, attn.ATTN_OUT)
        if cfg.splash_kernel != "jax":
            raise ValueError("context parallelism runs JAX's splash kernel: set splash_kernel=jax")
        rows = q.shape[0] // _ways(batch, mesh)
        kernel = cp_splash_kernel(cfg, T, window, q.shape[3], C, rows * q.shape[2], platform == "cpu")
        kspec = kernel.manual_sharding_spec(NamedSharding(mesh, PartitionSpec(None, CONTEXT)))
        local = functools.partial(_local_splash, C=C)
        # check_vma=False: pallas_call has no varying-manual-axes rule (as in model.attention)
        return jax.shard_map(local, mesh=mesh, in_specs=(kspec, *in_specs), out_specs=qspec, check_vma=False)(
            kernel, q, k, v, *segs
        )


def _ways(axes: Any, mesh: jax.sharding.Mesh) -> int:
    names = () if axes is None else (axes,) if isinstance(axes, str) else tuple(axes)
    return int(np.prod([mesh.shape[a] for a in names])) if names else 1


def _gather(x: jax.Array, C: int) -> jax.Array:
    """A device's layout part ``[b, T/C, ...]`` → the whole rows ``[b, T, ...]`` in natural order."""
    return from_layout(jax.lax.all_gather(x, CONTEXT, axis=1, tiled=True), C)


def _chunk_starts(C: int) -> tuple[jax.Array, jax.Array]:
    """Original start of this device's two chunks, over ``L = T/2C``-position units: (i, 2C-1-i)."""
    i = jax.lax.axis_index(CONTEXT)
    return i, 2 * C - 1 - i


def _local_xla(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    seg: jax.Array | None = None,
    *,
    C: int,
    window: int | None,
    cfg: ModelConfig,
) -> jax.Array:
    """One device: its queries ``[b, T/C, K, G, hd]`` (two chunks) against all T gathered keys."""
    k, v = _gather(k, C), _gather(v, C)
    seg_k = None if seg is None else _gather(seg, C)
    L = q.shape[1] // 2
    outs = []
    for j, start in enumerate(_chunk_starts(C)):
        part = slice(j * L, (j + 1) * L)
        seg_q = None if seg is None else seg[:, part]
        outs.append(_chunk_xla(q[:, part], start * L, k, v, seg_q, seg_k, window, cfg))
    return jnp.concatenate(outs, axis=1)


def _chunk_xla(
    q: jax.Array,
    q_start: jax.Array,
    k: jax.Array,
    v: jax.Array,
    seg_q: jax.Array | None,
    seg_k: jax.Array | None,
    window: int | None,
    cfg: ModelConfig,
) -> jax.Array:
    """Queries at original positions ``[q_start, q_start + L)`` against natural k/v ``[b, T, K, hd]``
    (``attend_xla``'s chunking and key slicing, with the queries offset)."""
    B, L = q.shape[:2]
    T = k.shape[1]
    Ca = cfg.attention_chunk if cfg.attention_chunk is not None and cfg.attention_chunk < L else L
    Ca = Ca if L % Ca == 0 else L
    S = T if window is None else min(T, window + Ca - 1)

    def one(c0: jax.Array, qc: jax.Array) -> jax.Array:
        q0 = q_start + c0  # original position of the chunk's first query
        start = 0 if S == T or window is None else jnp.clip(q0 - window + 1, 0, T - S)  # S < T: a window
        kc, vc = (k, v) if S == T else (jax.lax.dynamic_slice_in_dim(a, start, S, 1) for a in (k, v))
        sq = sk = None
        if seg_q is not None and seg_k is not None:
            sq = seg_q if Ca == L else jax.lax.dynamic_slice_in_dim(seg_q, c0, Ca, 1)
            sk = seg_k if S == T else jax.lax.dynamic_slice_in_dim(seg_k, start, S, 1)
        rows, cols = q0 + jnp.arange(Ca), start + jnp.arange(S)
        return attn._softmax_attention(qc, kc, vc, attn.visible(rows, cols, window, sq, sk), cfg)

    if Ca == L:
        return one(jnp.zeros([], jnp.int32), q)
    n = L // Ca
    qs = jnp.moveaxis(q.reshape(B, n, Ca, *q.shape[2:]), 1, 0)
    out = jax.lax.map(jax.checkpoint(lambda a: one(*a)), (jnp.arange(n, dtype=jnp.int32) * Ca, qs))
    return jnp.moveaxis(out, 0, 1).reshape(q.shape)


@functools.cache
def _splash_kernel(
    seq_len: int,
    window: int | None,
    group: int,
    C: int,
    blocks: tuple[int, int, int | None],
    interpret: bool,
    fused_bwd: bool,
    layouts: tuple[str, str, str],
) -> splash.splash_attention_kernel.SplashAttentionKernel:
    """The MQA splash kernel over the whole ``[T, T]`` mask, its rows in the layout's order, its
    mask info split in C query shards (see the module doc); concrete numpy leaves, cached, as
    ``model.attention.splash_kernel``."""
    block_q, block_kv, compute = blocks
    sizes = splash.BlockSizes(
        **attn._block_fields(block_q, block_kv, compute),
        block_q_dq=None if fused_bwd else block_q,
        block_kv_dq=None if fused_bwd else block_kv,
        use_fused_bwd_kernel=fused_bwd,
        **attn._layout_fields(splash.QKVLayout, layouts),
    )
    mask: Any = attn.splash_mask(seq_len, window)  # a CausalMask or LocalMask (a _ComputableMask)
    mask.q_sequence = layout_index(seq_len, C)  # the original index of each query row (hashed with the mask)
    with jax.ensure_compile_time_eval():
        kernel = splash.make_splash_mqa(
            splash.MultiHeadMask([mask] * group),
            block_sizes=sizes,
            head_shards=1,
            q_seq_shards=C,
            interpret=interpret,
            residual_checkpoint_name=attn.ATTN_OUT,
        )
    return jax.tree.map(np.asarray, kernel)


def cp_splash_kernel(
    cfg: ModelConfig, T: int, window: int | None, group: int, C: int, row_heads: int, interpret: bool
) -> splash.splash_attention_kernel.SplashAttentionKernel:
    """The kernel for ``cfg`` at sequence length T over C shards (``row_heads``: rows x kv heads on
    one device, what sizes the fused backward's dq buffer: ``model.attention.FUSED_DQ_BUDGET``)."""
    block_q = attn.splash_blocks(cfg, T // C)[0]  # a device's queries: T / C rows
    block_kv = attn.splash_blocks(cfg, T)[1]  # the gathered keys: all T
    dq_bytes = row_heads * group * -(-T // block_kv) * (T // C) * cfg.head_dim * 2
    fused = cfg.splash_fused_bwd and dq_bytes <= attn.FUSED_DQ_BUDGET
    layouts = (cfg.splash_q_layout, cfg.splash_k_layout, cfg.splash_v_layout)
    blocks = (block_q, block_kv, cfg.splash_block_kv_compute)
    return _splash_kernel(T, window, group, C, blocks, interpret, fused, layouts)


def _local_splash(
    kernel: Any, q: jax.Array, k: jax.Array, v: jax.Array, seg: jax.Array | None = None, *, C: int
) -> jax.Array:
    """One device: its query shard ``[b, T/C, K, G, hd]`` through its slice of the kernel's mask
    info, against all T gathered keys in natural order."""
    k, v = _gather(k, C), _gather(v, C)
    seg_k = None if seg is None else _gather(seg, C)
    hd = q.shape[-1]
    q = (q.astype(jnp.float32) * hd**-0.5).astype(q.dtype)  # the kernel does not scale the scores
    q = jnp.transpose(q, (0, 2, 3, 1, 4))  # [b, K, G, Tq, hd]
    k, v = jnp.transpose(k, (0, 2, 1, 3)), jnp.transpose(v, (0, 2, 1, 3))  # [b, K, T, hd]

    def one_row(q: jax.Array, k: jax.Array, v: jax.Array, sq: jax.Array | None, sk: jax.Array | None) -> Any:
        ids = None if sq is None or sk is None else splash.SegmentIds(q=sq, kv=sk)
        return jax.vmap(lambda qh, kh, vh: kernel(qh, kh, vh, segment_ids=ids))(q, k, v)

    axes = (0, 0, 0, None, None) if seg is None else (0, 0, 0, 0, 0)
    out = jax.vmap(one_row, in_axes=axes)(q, k, v, seg, seg_k)
    return jnp.transpose(out, (0, 3, 1, 2, 4))  # [b, Tq, K, G, hd]
