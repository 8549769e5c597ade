"""AdamW with fp32 moments, the OLMo 3 schedules and the optional skip step — all optax.

The transformation returns *unscaled* updates (clip → Adam → decoupled weight decay); the train
step multiplies them by ``-lr``, the learning rate the loop computes on the host for its own step
counter (``make_schedule``: OLMo-core's schedulers, exactly) and passes in. Keeping the learning
rate out of the optimizer state means a stage-2 run can start from a stage-1 optimizer state (Adam
moments and bias-correction count) with a fresh schedule.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from trainer.config.schema import TrainConfig
from trainer.mesh import PyTree

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- schedules

Schedule = Callable[[int], float]


def make_schedule(cfg: TrainConfig) -> Schedule:
    """The learning rate of update ``step`` (0-based, updates already applied), a Python float
    computed on the host: OLMo-core's scheduler (``CosWithWarmup``, ``LinearWithWarmup``,
    ``ConstantWithWarmup`` of ai2-olmo-core 3.0.0, ``olmo_core/optim/scheduler.py``) at its
    ``current`` = step + ``schedule.step_offset`` with ``t_max`` = ``decay_steps``, operation for
    operation in float64, so the value is bit-equal to the one OLMo-core's trainer logs
    (tests/trainer/test_config.py, tests/trainer/test_olmo_reference.py). The train step receives
    it as a float32 scalar (``trainer.step``): what both frameworks multiply the update by is the
    float64 value rounded once to float32 (torch's CPU kernels take a Python scalar operand of a
    float32 tensor as float32).

    Hand-written, not optax's schedules: those are jnp expressions, float32 under JAX's default
    (no x64) and in another operation order (measured: up to 5 float32 ulps from OLMo-core's)."""
    s = cfg.schedule
    kind, peak, alpha_f, warmup, t_max, offset = (
        s.kind,
        float(cfg.lr),
        float(s.final_lr_ratio),
        s.warmup_steps,
        cfg.decay_steps,
        s.step_offset,
    )
    return lambda step: _olmo_core_lr(kind, peak, alpha_f, warmup, t_max, int(step) + offset)


def _olmo_core_lr(kind: str, initial_lr: float, alpha_f: float, warmup: int, t_max: int, current: int) -> float:
    """``get_lr(initial_lr, current, t_max)`` of OLMo-core's scheduler of ``kind`` (its code, its
    order of operations; ``warmup_min_lr`` 0.0, its default)."""
    eta_min = initial_lr * alpha_f
    if kind == "constant":  # ConstantWithWarmup: warmup through current == warmup, then flat
        if warmup and current <= warmup:  # (warmup 0: flat; OLMo-core would divide by 0)
            return _linear_warmup(initial_lr, current, warmup)
        return initial_lr
    if current < warmup:
        return _linear_warmup(initial_lr, current, warmup)
    if current >= t_max:
        return eta_min
    current, t_max = current - warmup, t_max - warmup
    if kind == "cosine":  # CosWithWarmup
        return eta_min + (initial_lr - eta_min) * (1 + math.cos(math.pi * current / t_max)) / 2
    if kind == "linear":  # LinearWithWarmup
        return initial_lr - (initial_lr - eta_min) * (current / t_max)
    raise ValueError(f"schedule.kind={kind!r}")


def _linear_warmup(initial_lr: float, current: int, warmup: int, warmup_min_lr: float = 0.0) -> float:
    """OLMo-core's ``_linear_warmup``."""
    return warmup_min_lr + (initial_lr - warmup_min_lr) * min(current, warmup) / warmup


# ----------------------------------------------------------------------------- Adam with nu_dtype


def scale_by_adam(b1: float, b2: float, eps: float, mu_dtype: str, nu_dtype: str) -> optax.GradientTransformation:
    """``optax.scale_by_adam`` whose second moment is stored in ``nu_dtype``.

    optax 0.2.8 has ``mu_dtype`` but no ``nu_dtype``: its nu is created like the params and
    cast back to the dtype of the incoming state each update (``cast_like(nu, state.nu)``), so
    casting nu once at init is all it takes to pin its dtype.
    """
    inner = optax.scale_by_adam(b1=b1, b2=b2, eps=eps, mu_dtype=mu_dtype)
    nu = jnp.dtype(nu_dtype)

    def init_fn(params: optax.Params) -> optax.OptState:
        state = inner.init(params)
        return state._replace(nu=jax.tree.map(lambda x: x.astype(nu), state.nu))

    return optax.GradientTransformation(init_fn, inner.update)


# ----------------------------------------------------------------------------- skip step


class SkipStepState(NamedTuple):
    """Ring buffers of the last ``window`` losses and grad norms ([window] float32 each)."""

    losses: jax.Array
    grad_norms: jax.Array
    seen: jax.Array  # int32 []: updates observed (entries of the ring buffer filled = min(seen, window))
    skipped: jax.Array  # int32 []: updates skipped so far
    last_skipped: jax.Array  # bool []: whether the latest update was skipped
    inner_state: PyTree


def _exceeds(history: jax.Array, valid: jax.Array, value: jax.Array, sigma: float) -> jax.Array:
    """value - mean > sigma * std over the valid entries of history, std the *sample* standard
    deviation (n - 1), as OLMo-core's ``torch.std_mean`` computes it (its default correction=1)."""
    n = valid.sum()
    mean = jnp.where(valid, history, 0.0).sum() / jnp.maximum(n, 1)
    var = jnp.where(valid, (history - mean) ** 2, 0.0).sum() / jnp.maximum(n - 1, 1)
    return value - mean > sigma * jnp.sqrt(var)


def skip_step(
    inner: optax.GradientTransformation, sigma: float, window: int, min_history: int, select: bool = False
) -> optax.GradientTransformationExtraArgs:
    """OLMo 3 skip step around ``inner``: ``update(grads, state, params, loss=loss)``.

    If at least ``min_history`` earlier steps were seen and the loss or the (pre-clip) global
    grad norm is more than ``sigma`` standard deviations above its mean over the last ``window``
    steps (or is not finite), the update is zero and ``inner``'s state is left unchanged
    (``optax.conditionally_mask`` would decide from the step count only, not from the loss, hence
    this small wrapper). Every step's loss and norm enter the window, skipped or not, so a
    lasting level shift stops being an outlier once it fills the window.

    ``select``: compute ``inner``'s update every step and keep it or zeros / the old state with
    ``jnp.where`` instead of ``lax.cond`` (the config's ``fused_update``). The same values; a
    conditional's outputs are materialised, while selects let XLA fuse the whole update with the
    parameter step that follows into one pass over the state.
    """
    inner = optax.with_extra_args_support(inner)

    def init_fn(params: optax.Params) -> SkipStepState:
        zeros = jnp.zeros([window], jnp.float32)
        return SkipStepState(
            zeros, zeros, jnp.zeros([], jnp.int32), jnp.zeros([], jnp.int32), jnp.zeros([], bool), inner.init(params)
        )

    def update_fn(
        updates: optax.Updates,
        state: SkipStepState,
        params: optax.Params | None = None,
        *,
        loss: jax.Array,
        **extra: Any,
    ) -> tuple[optax.Updates, SkipStepState]:
        loss = jnp.asarray(loss, jnp.float32)
        norm = optax.tree.norm(updates).astype(jnp.float32)
        valid = jnp.arange(window) < state.seen
        outlier = _exceeds(state.losses, valid, loss, sigma) | _exceeds(state.grad_norms, valid, norm, sigma)
        bad = ~(jnp.isfinite(loss) & jnp.isfinite(norm))
        skip = (state.seen >= min_history) & (outlier | bad)
        if select:
            applied, stepped = inner.update(updates, state.inner_state, params, **extra)
            new_updates = jax.tree.map(lambda u: jnp.where(skip, jnp.zeros_like(u), u), applied)
            new_inner = jax.tree.map(lambda old, new: jnp.where(skip, old, new), state.inner_state, stepped)
        else:
            new_updates, new_inner = jax.lax.cond(
                skip,
                lambda: (optax.tree.zeros_like(updates), state.inner_state),
                lambda: inner.update(updates, state.inner_state, params, **extra),
            )
        slot = state.seen % window
        return new_updates, SkipStepState(
            losses=state.losses.at[slot].set(loss),
            grad_norms=state.grad_norms.at[slot].set(norm),
            seen=state.seen + 1,
            skipped=state.skipped + skip.astype(jnp.int32),
            last_skipped=skip,
            inner_state=new_inner,
        )

    return optax.GradientTransformationExtraArgs(init_fn, update_fn)


def without_skip_history(opt_state: PyTree) -> PyTree:
    """``opt_state`` with the skip step's history emptied (losses, grad norms, counts), Adam's state
    kept: a new stage (``checkpoint.init_from``) starts as OLMo-core's does, whose skip-step history
    (``SkipStepOptimizer._losses``/``_grad_norms``) is not part of the optimizer state it loads, so
    it judges stage 2's steps by stage 2's alone. Other states are returned as they are."""
    if not isinstance(opt_state, SkipStepState):
        return opt_state
    zero = lambda x: x & False if x.dtype == jnp.bool_ else x * 0  # keeps each leaf's sharding
    return opt_state._replace(
        losses=zero(opt_state.losses),
        grad_norms=zero(opt_state.grad_norms),
        seen=zero(opt_state.seen),
        skipped=zero(opt_state.skipped),
        last_skipped=zero(opt_state.last_skipped),
    )


# ----------------------------------------------------------------------------- AdamW


def decay_mask(params: PyTree, exclude: tuple[str, ...]) -> PyTree:
    """Pytree of bools like ``params``: False for every leaf under a top-level key in ``exclude``."""
    missing = [k for k in exclude if k not in params]
    if missing:
        raise KeyError(f"weight-decay exclusions {missing} are not top-level parameter keys {sorted(params)}")
    return {k: jax.tree.map(lambda _: k not in exclude, v) for k, v in params.items()}  # noqa: B023 - called at once


def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformationExtraArgs:
    """clip_by_global_norm → Adam (mu/nu dtypes) → decoupled weight decay (not on ``embed``),
    wrapped in the skip step when enabled. Call ``update(grads, state, params, loss=loss)``
    and scale the result by ``-lr``.

    Builds whatever mu/nu dtypes the config names: the config-level refusal of sub-fp32
    moments is ``trainer.config.schema.check_state_precision`` (run once, by the CLI, before JAX
    starts), and ``check_and_log_state`` refuses low-precision leaves after init/restore."""
    o = cfg.optimizer
    tx = optax.chain(
        optax.clip_by_global_norm(o.clip_norm),
        scale_by_adam(o.b1, o.b2, o.eps, o.mu_dtype, o.nu_dtype),
        optax.add_decayed_weights(o.weight_decay, mask=lambda p: decay_mask(p, o.decay_exclude)),
    )
    if cfg.skip_step.enabled:
        s = cfg.skip_step
        return skip_step(tx, s.sigma, s.window, s.history_needed, select=cfg.fused_update)
    return optax.with_extra_args_support(tx)


def state_dtypes(opt_state: PyTree) -> list[tuple[str, str, tuple[int, ...]]]:
    """(path, dtype, shape) of every optimizer-state leaf, in flatten order."""
    leaves = jax.tree_util.tree_flatten_with_path(opt_state)[0]
    return [(jax.tree_util.keystr(p), str(x.dtype), tuple(x.shape)) for p, x in leaves]


def check_and_log_state(cfg: TrainConfig, opt_state: PyTree) -> None:
    """The one leaf-dtype check, run once on the state the run starts from (fresh, restored or
    ``init_from``): refuse floating leaves below fp32 without the opt-in (this also catches
    low precision that did not come from mu/nu_dtype, e.g. bf16 params or a restored state).
    Logs one summary line at INFO and every leaf at DEBUG."""
    rows = state_dtypes(opt_state)
    counts: dict[str, int] = {}
    for path, dtype, shape in rows:
        log.debug("opt_state%s: %s%s", path, dtype, list(shape))
        counts[dtype] = counts.get(dtype, 0) + 1
    log.info("optimizer state: %d leaves by dtype %s (each leaf at DEBUG)", len(rows), counts)
    low = [p for p, d, _ in rows if jnp.issubdtype(jnp.dtype(d), jnp.floating) and jnp.finfo(jnp.dtype(d)).bits < 32]
    if low and not cfg.allow_low_precision_optimizer_state:
        raise ValueError(
            f"refusing low-precision optimizer state: {len(low)} leaves below float32, "
            f"e.g. opt_state{low[0]}; set allow_low_precision_optimizer_state: true to allow"
        )
