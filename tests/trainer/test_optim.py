"""AdamW wiring, optimizer-state precision, the skip step and the loss."""

from __future__ import annotations

import logging

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from tests import fast_compile
from trainer import loss as loss_lib
from trainer import optim
from trainer.config.schema import check_state_precision, load_config

# The updates compared here with each other or with optax's (JAX too, in this process) are compiled
# alike, at LLVM level 0 (tests/fast_compile.py).
FAST = fast_compile.OPTIONS


def _params(dtype=jnp.float32):
    k = jax.random.split(jax.random.key(0), 3)
    return {
        "embed": jax.random.normal(k[0], (5, 3), dtype),
        "layers": {"w": jax.random.normal(k[1], (3, 3), dtype)},
        "lm_head": jax.random.normal(k[2], (3, 5), dtype),
    }


def _grads(seed, params):
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.key(seed), len(leaves))
    return jax.tree.unflatten(tree, [3.0 * jax.random.normal(k, x.shape, x.dtype) for k, x in zip(keys, leaves)])


def _apply(tx, params, state, grads, lr, loss=1.0):
    """One update as trainer.step makes it: the host's learning rate (make_schedule's), as float32."""
    updates, state = tx.update(grads, state, params, loss=loss)
    lr = jnp.float32(lr)
    return jax.tree.map(lambda p, u: p - lr * u, params, updates), state


def test_optimizer_equals_optax_adamw_with_clipping_and_embed_excluded_from_decay():
    cfg = load_config(None, ["lr=1e-2", "schedule.warmup_steps=2", "steps=6"])
    tx, sched = optim.make_optimizer(cfg), optim.make_schedule(cfg)
    o = cfg.optimizer
    mask = {"embed": jax.tree.map(lambda _: False, _params()["embed"]), "layers": {"w": True}, "lm_head": True}
    ref = optax.chain(
        optax.clip_by_global_norm(o.clip_norm),
        optax.adamw(
            lambda count: jnp.asarray([sched(s) for s in range(6)], jnp.float32)[count],
            b1=o.b1,
            b2=o.b2,
            eps=o.eps,
            weight_decay=o.weight_decay,
            mask=mask,
        ),
    )
    params = ref_params = _params()
    state, ref_state = tx.init(params), ref.init(ref_params)
    ours = jax.jit(lambda p, s, g, lr: _apply(tx, p, s, g, lr), compiler_options=FAST)
    theirs = jax.jit(ref.update, compiler_options=FAST)
    for step in range(6):
        g = _grads(step, params)
        params, state = ours(params, state, g, np.float32(sched(step)))
        u, ref_state = theirs(g, ref_state, ref_params)
        ref_params = optax.apply_updates(ref_params, u)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(ref_params)):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_embedding_gets_no_weight_decay():
    cfg = load_config(
        None, ["lr=0.1", "schedule.kind=constant", "schedule.warmup_steps=0", "optimizer.weight_decay=0.5"]
    )
    tx, sched = optim.make_optimizer(cfg), optim.make_schedule(cfg)
    params = _params()
    zero = jax.tree.map(jnp.zeros_like, params)
    new, _ = jax.jit(lambda p, s, g: _apply(tx, p, s, g, sched(0)), compiler_options=FAST)(
        params, tx.init(params), zero
    )
    np.testing.assert_array_equal(new["embed"], params["embed"])
    np.testing.assert_allclose(new["lm_head"], params["lm_head"] * (1 - 0.1 * 0.5), rtol=1e-6)


def test_optimizer_state_is_float32_by_default_even_for_bf16_params():
    cfg = load_config(None)
    state = optim.make_optimizer(cfg).init(_params(jnp.bfloat16))
    floats = [d for _, d, _ in optim.state_dtypes(state) if d not in ("int32", "bool")]
    assert floats and set(floats) == {"float32"}
    optim.check_and_log_state(cfg, state)  # accepted


def test_bf16_optimizer_state_is_refused_without_opt_in():
    for key in ("optimizer.mu_dtype=bfloat16", "optimizer.nu_dtype=bfloat16"):
        cfg = load_config(None, [key])
        # Once at the CLI, from the config alone (before JAX starts) ...
        with pytest.raises(ValueError, match=f"refusing low-precision optimizer state \\({key.split('.')[1]}"):
            check_state_precision(cfg)
        # ... and once on the state a run starts from, whatever made it.
        state = optim.make_optimizer(cfg).init(_params())
        with pytest.raises(ValueError, match="refusing low-precision optimizer state: 3 leaves below float32"):
            optim.check_and_log_state(cfg, state)
    # Low precision from the params themselves is caught by the leaf check.
    cfg = load_config(None, ["optimizer.mu_dtype=float32"])
    low = jax.tree.map(lambda x: x.astype(jnp.bfloat16), optax.scale_by_adam().init(_params()))
    with pytest.raises(ValueError, match="leaves below float32"):
        optim.check_and_log_state(cfg, low)


def test_optimizer_state_logs_one_summary_line_at_info_and_each_leaf_at_debug(caplog):
    cfg = load_config(None)
    state = optim.make_optimizer(cfg).init(_params())
    n = len(jax.tree.leaves(state))
    with caplog.at_level(logging.DEBUG, logger=optim.log.name):
        optim.check_and_log_state(cfg, state)
    info = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert len(info) == 1 and info[0].startswith(f"optimizer state: {n} leaves by dtype")
    assert len(debug) == n and all(m.startswith("opt_state") for m in debug)


def test_bf16_optimizer_state_with_opt_in_keeps_its_dtype_across_updates():
    cfg = load_config(
        None, ["optimizer.mu_dtype=bfloat16", "optimizer.nu_dtype=bfloat16", "allow_low_precision_optimizer_state=true"]
    )
    tx, sched = optim.make_optimizer(cfg), optim.make_schedule(cfg)
    params = _params()
    state = tx.init(params)
    params, state = _apply(tx, params, state, _grads(1, params), sched(0))
    adam = state[1]
    assert {x.dtype for x in jax.tree.leaves(adam.mu)} == {jnp.dtype(jnp.bfloat16)}
    assert {x.dtype for x in jax.tree.leaves(adam.nu)} == {jnp.dtype(jnp.bfloat16)}


def test_skip_step_drops_an_outlier_update_and_leaves_adam_state_untouched():
    cfg = load_config(
        None,
        [
            "skip_step.enabled=true",
            "skip_step.window=16",
            "skip_step.min_history=8",
            "schedule.kind=constant",
            "schedule.warmup_steps=0",
            "lr=1e-2",
        ],
    )
    tx = optim.make_optimizer(cfg)
    update = jax.jit(lambda g, s, p, loss: tx.update(g, s, p, loss=loss), compiler_options=FAST)
    params = _params()
    state = tx.init(params)
    rng = np.random.default_rng(0)
    for step in range(12):
        updates, state = update(_grads(step, params), state, params, 2.0 + 0.01 * rng.standard_normal())
        assert not bool(state.last_skipped)
    before = state
    updates, state = update(_grads(99, params), state, params, 50.0)  # loss spike
    assert bool(state.last_skipped) and int(state.skipped) == 1
    assert all(float(jnp.abs(u).max()) == 0.0 for u in jax.tree.leaves(updates))
    for a, b in zip(jax.tree.leaves(before.inner_state), jax.tree.leaves(state.inner_state)):
        np.testing.assert_array_equal(a, b)
    huge = jax.tree.map(lambda g: 1e4 * g, _grads(100, params))  # grad-norm spike, normal loss
    updates, state = update(huge, state, params, 2.0)
    assert bool(state.last_skipped) and int(state.skipped) == 2
    updates, state = update(_grads(101, params), state, params, 2.0)
    assert not bool(state.last_skipped)
    assert any(float(jnp.abs(u).max()) > 0 for u in jax.tree.leaves(updates))


def test_the_fused_update_selects_the_same_values_as_the_conditional_skip_step():
    """fused_update (jnp.where instead of lax.cond in the skip step): bit-identical parameters,
    updates and state over normal steps, a loss spike and a grad-norm spike (both skipped); the
    jitted step holds no conditional (what lets XLA fuse it), and the record leaves the key out
    while it is off."""
    base = ["skip_step.enabled=true", "skip_step.window=16", "skip_step.min_history=8", "lr=1e-2"]
    txs = [optim.make_optimizer(load_config(None, [*base, f"fused_update={on}"])) for on in ("false", "true")]
    sched = optim.make_schedule(load_config(None, base))
    steps = [
        jax.jit(lambda p, s, g, lr, loss, tx=tx: _apply(tx, p, s, g, lr, loss), compiler_options=FAST) for tx in txs
    ]
    params = [_params(), _params()]
    states = [tx.init(p) for tx, p in zip(txs, params)]
    rng = np.random.default_rng(0)
    for i in range(14):
        grads = _grads(i, params[0]) if i != 13 else jax.tree.map(lambda g: 1e4 * g, _grads(i, params[0]))
        loss = 50.0 if i == 12 else 2.0 + 0.01 * rng.standard_normal()
        for k in (0, 1):
            params[k], states[k] = steps[k](params[k], states[k], grads, sched(i), loss)
        assert bool(states[1].last_skipped) == (i >= 12)
        for a, b in zip(jax.tree.leaves((params[0], states[0])), jax.tree.leaves((params[1], states[1]))):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    args = (params[0], states[0], _grads(0, params[0]))
    programs = [str(jax.make_jaxpr(lambda p, s, g, tx=tx: tx.update(g, s, p, loss=1.0))(*args)) for tx in txs]
    assert "cond[" in programs[0] and "cond[" not in programs[1]
    assert "fused_update" not in load_config(None, base).to_dict()
    assert load_config(None, [*base, "fused_update=true"]).to_dict()["fused_update"] is True


def test_loss_counts_only_non_pad_targets_and_adds_z_loss():
    rng = np.random.default_rng(0)
    B, T, V = 2, 6, 11
    logits = jnp.asarray(rng.standard_normal((B, T, V)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    mask = jnp.asarray([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], jnp.int32)
    sums = loss_lib.loss_sums(logits, tokens, mask)
    lp = jax.nn.log_softmax(np.asarray(logits, np.float64)[:, :-1], axis=-1)
    ce = -np.take_along_axis(np.asarray(lp), np.asarray(tokens)[:, 1:, None], -1)[..., 0]
    m = np.asarray(mask)[:, 1:]
    assert float(sums.tokens) == m.sum() == 8
    np.testing.assert_allclose(float(sums.ce), (ce * m).sum(), rtol=1e-5)
    total, parts = loss_lib.objective(sums, 1e-5)
    lse = np.log(np.exp(np.asarray(logits, np.float64)[:, :-1]).sum(-1))
    np.testing.assert_allclose(float(parts["z_loss"]), 1e-5 * (lse**2 * m).sum() / 8, rtol=1e-5)
    np.testing.assert_allclose(float(total), (ce * m).sum() / 8 + float(parts["z_loss"]), rtol=1e-6)
    # Logits that predict PAD positions do not matter.
    changed = logits.at[0, 4:].set(100.0)
    assert float(loss_lib.loss_sums(changed, tokens, mask).ce) == float(sums.ce)


def test_a_new_stage_keeps_adam_state_but_starts_the_skip_history_anew():
    """checkpoint.init_from: OLMo-core's skip-step history is not in the optimizer state it loads, so a
    stage 2 judges its steps by its own history alone; Adam's moments and count go on."""
    cfg = load_config(None, ["skip_step.enabled=true", "skip_step.window=16"])
    tx = optim.make_optimizer(cfg)
    params = _params()
    state = tx.init(params)
    update = jax.jit(lambda g, s, p, loss: tx.update(g, s, p, loss=loss), compiler_options=FAST)
    for step in range(10):
        _, state = update(_grads(step, params), state, params, 2.0 + step)
    fresh = optim.without_skip_history(state)
    assert int(state.seen) == 10 and int(fresh.seen) == 0 and int(fresh.skipped) == 0
    assert float(jnp.abs(fresh.losses).max()) == 0.0 and float(jnp.abs(fresh.grad_norms).max()) == 0.0
    for a, b in zip(jax.tree.leaves(state.inner_state), jax.tree.leaves(fresh.inner_state)):
        np.testing.assert_array_equal(a, b)
    plain = optim.make_optimizer(load_config(None, []))
    no_skip = plain.init(params)
    assert optim.without_skip_history(no_skip) is no_skip


@pytest.mark.parametrize(
    "overrides",
    [
        ["schedule.kind=cosine", "schedule.warmup_steps=10", "schedule.final_lr_ratio=0.1", "schedule.step_offset=1"],
        ["schedule.kind=cosine", "schedule.warmup_steps=0", "schedule.final_lr_ratio=0.0", "schedule.decay_steps=37"],
        ["schedule.kind=linear", "schedule.warmup_steps=7", "schedule.final_lr_ratio=0.25", "schedule.step_offset=1"],
        ["schedule.kind=linear", "schedule.warmup_steps=0", "schedule.final_lr_ratio=0.0", "lr=2.0712e-4"],
        ["schedule.kind=constant", "schedule.warmup_steps=9", "schedule.step_offset=1"],
    ],
)
def test_learning_rate_is_olmo_cores_scheduler_bit_for_bit(overrides):
    """make_schedule(cfg)(s) == OLMo-core's own scheduler's get_lr at current = s + step_offset,
    t_max = decay_steps, for every step of the run and past it: the same Python float (a float32
    schedule under jit was up to 5 float32 ulps off)."""
    from olmo_core.optim import ConstantWithWarmup, CosWithWarmup, LinearWithWarmup

    cfg = load_config(None, ["lr=3e-3", "steps=50", *overrides])
    s = cfg.schedule
    theirs = {
        "cosine": CosWithWarmup(warmup=s.warmup_steps, alpha_f=s.final_lr_ratio, t_max=cfg.decay_steps),
        "linear": LinearWithWarmup(warmup=s.warmup_steps, alpha_f=s.final_lr_ratio, t_max=cfg.decay_steps),
        "constant": ConstantWithWarmup(warmup=s.warmup_steps),
    }[s.kind]
    ours = optim.make_schedule(cfg)
    lrs = [ours(step) for step in range(cfg.steps + 5)]
    assert all(type(x) is float for x in lrs)
    assert lrs == [theirs.get_lr(cfg.lr, step + s.step_offset, cfg.decay_steps) for step in range(cfg.steps + 5)]
    assert len(set(lrs)) > 5 and min(lrs) >= 0.0  # a schedule that moves, never an ascent step


def test_olmo_core_multiplies_the_update_by_the_learning_rate_rounded_to_float32():
    """What both sides apply: OLMo-core's SkipStepAdamW takes the scheduler's Python float and torch's
    CPU kernels use it as a float32 operand (step_size = lr / bias_correction1, a float32 tensor),
    as olmax's step multiplies by np.float32(lr). With betas (0, 0), eps 0 and no decay, one step
    from p = 0 with gradient 1 moves p by exactly -step_size: -float32(lr), not the float64 value."""
    import torch
    from olmo_core.optim import SkipStepAdamW

    lr = 3e-3 * (1 + np.cos(np.pi * 7 / 40)) / 2  # a scheduled value float32 cannot hold
    assert float(np.float32(lr)) != lr
    p = torch.zeros(1, requires_grad=True)
    opt = SkipStepAdamW([p], lr=lr, betas=(0.0, 0.0), eps=0.0, weight_decay=0.0)
    p.grad = torch.ones(1)
    opt.step()
    assert p.item() == -float(np.float32(lr))
