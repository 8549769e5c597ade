"""olmax's training step against OLMo-core's, update for update: the reference curves are made by
OLMo-core 3.0.0 itself (`bench/olmo_reference.py`: its Transformer, TransformerTrainModule,
SkipStepAdamW, CosWithWarmup / LinearWithWarmup, Trainer and data loader, on the CPU) from the
olmax run's own initial weights and token files; the run side is `trainer.main.main`, the CLI's
entry point. Float32 on both sides. The same fixture builds bench.olmo_lessons' three runs and their
reference: the case study's lessons against OLMo-core where a correct run stays within 2e-5 of it.
The learning rate is compared with `==`: both log OLMo-core's scheduler's Python float.

The bounds are the measured differences (README "Fidelity", trainer/README.md) with a margin for
other CPUs' rounding; they are not tolerances chosen to pass. Where they come from: both sides
compute the same float32 arithmetic in another order (XLA vs PyTorch kernels), ~1e-7 relative per
op. The one larger figure is a handful of embedding entries of rare ids: Adam divides a gradient
by its own magnitude (m / (sqrt(v) + eps)), so an entry whose gradient is ~1e-9 (a near-cancelled
sum, ~1e-7 of its row's largest) moves by a sizeable fraction of the learning rate on either side
while its two roundings differ by tens of percent (measured: torch 5.2e-9, XLA 6.2e-9 after
clipping, at step 1, row 219, column 25); every other tensor stays within ~1e-5.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from bench import olmo_lessons
from bench import olmo_reference as ref_lib
from bench import olmo_step_for_step as sfs
from bench.olmo_step_for_step import EMBED, SPIKE_STEP, STAGE2_STEPS, STEPS, TINY, L
from tests.shared import build_once
from trainer.config.schema import load_config

# The largest differences measured over the four scenarios (`python -m bench.olmo_step_for_step`,
# bench/RESULTS.md), and the bounds: ~3-5x those, for other CPUs' rounding.
LOSS_ABS = 5e-6  # per-step train CE, nats (measured ≤ 1.43e-6)
Z_ABS = 1e-9  # per-step z-loss term (measured ≤ 1.5e-10)
GRAD_REL = 2e-5  # per-step pre-clip grad norm, relative (measured ≤ 3.9e-6)
HELDOUT_ABS = 5e-6  # held-out CE (measured ≤ 7.1e-7)
PARAM_ABS = 5e-5  # every tensor but the embedding, max abs after the last update (measured ≤ 7.2e-6)
EMBED_ABS = 3e-3  # the embedding's few rare-id entries (measured ≤ 3.1e-4 here, 2.7e-3 with window 32)
EMBED_REL = 1e-3  # the embedding's difference norm / its norm (measured ≤ 1.0e-4)


# bench.olmo_lessons' correct run against OLMo-core over its 150 updates (37.5 epochs of a 16-instance
# slice, lr 1e-3): the bound that makes its lessons' FAILs mean something (measured ≤ 1.9e-5 train CE,
# ≤ 2.0e-5 held-out; the small late gradients of a memorised slice round further apart than scenario a's)
LESSONS_ABS = 1e-4


@pytest.fixture(scope="session")
def both(tmp_path_factory) -> dict:
    return build_once(tmp_path_factory, "olmo_reference", olmo_lessons.build)


def diffs(both: dict, name: str) -> dict[str, np.ndarray]:
    return sfs.differences(both["runs"][name][0], both["refs"][name][0])


def final_params(both: dict, name: str) -> tuple[dict, dict]:
    run_dir, overrides, steps = both["runs"][name]
    return sfs.final_params(run_dir, overrides, steps, both["refs"][name][1])


def assert_step_for_step(d: dict[str, np.ndarray]) -> None:
    assert np.abs(d["loss"]).max() <= LOSS_ABS, np.abs(d["loss"]).max()
    assert np.abs(d["z"]).max() <= Z_ABS, np.abs(d["z"]).max()
    assert np.abs(d["grad_rel"]).max() <= GRAD_REL, np.abs(d["grad_rel"]).max()
    # the learning rate: exact. Both log the scheduler's Python float (olmax computes OLMo-core's
    # get_lr on the host, trainer.optim.make_schedule) and multiply the update by its float32 rounding
    assert (d["lr"] == 0.0).all(), d["lr"]
    assert np.abs(d["heldout"]).max() <= HELDOUT_ABS, d["heldout"]
    assert (d["skipped"] == d["skipped_ref"]).all()


def assert_params_close(flat: dict, ref: dict) -> None:
    for k in flat:
        diff = np.abs(flat[k] - ref[k]).max()
        if k == EMBED:
            assert diff <= EMBED_ABS, (k, diff)
            assert np.linalg.norm(flat[k] - ref[k]) / np.linalg.norm(ref[k]) <= EMBED_REL
        else:
            assert diff <= PARAM_ABS, (k, diff)


# ------------------------------------------------------------------------------------------------


def test_olmo_cores_transformer_gets_olmax_initial_weights_and_gives_its_logits(both):
    """The weights path both ways (olmax -> HF -> OLMo-core -> HF -> olmax) is exact, and OLMo-core's
    model (sliding windows of 8 in a 32-token sequence, the last layer full) computes olmax's logits."""
    import jax
    import jax.numpy as jnp
    import torch

    import model

    cfg = load_config(TINY, both["runs"]["a"][1])
    mc = cfg.model_cfg()
    assert mc.sliding_window < L and mc.layers == ("sliding_attention",) * 3 + ("full_attention",)
    params = ref_lib.initial_params(cfg)
    state = ref_lib.to_olmo_state(mc, params)
    back = ref_lib.from_olmo_state(mc, state)
    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(back)):
        np.testing.assert_array_equal(a, b)
    olmo = ref_lib.model_config(mc).build(init_device="cpu")
    olmo.load_state_dict(state)
    tokens = np.random.default_rng(0).integers(0, 500, (2, L))
    with torch.no_grad():
        theirs = olmo(torch.as_tensor(tokens)).numpy()
    ours = np.asarray(model.forward(mc, jax.tree.map(jnp.asarray, params), jnp.asarray(tokens, jnp.int32), None, None))
    assert np.abs(theirs - ours).max() <= 5e-6  # measured 6.7e-7


def test_olmax_skip_rule_is_olmo_cores_get_step_factor():
    """The same losses and grad norms through OLMo-core's SkipStepOptimizer and olmax's skip step:
    the same decision at every step (sample std, one-sided, its history rule), spikes included."""
    import jax
    import jax.numpy as jnp
    import torch
    from olmo_core.optim.skip_step_optimizer import SkipStepOptimizer

    from trainer import optim

    window, sigma = 16, 3.0
    cfg = load_config(None, ["skip_step.enabled=true", f"skip_step.window={window}", f"skip_step.sigma={sigma}"])
    assert cfg.skip_step.history_needed == window // 2 - 1
    tx = optim.skip_step(optax_identity(), sigma, window, cfg.skip_step.history_needed)
    params = {"w": jnp.zeros([1])}
    state = tx.init(params)
    update = jax.jit(lambda g, s, loss: tx.update(g, s, params, loss=loss))
    theirs = SkipStepOptimizer(
        [torch.zeros(1, requires_grad=True)], {}, rolling_interval_length=window, sigma_factor=int(sigma)
    )
    rng = np.random.default_rng(3)
    loss = 3.0 + 0.1 * rng.standard_normal(60)
    norm = 1.0 + 0.05 * rng.standard_normal(60)
    loss[[5, 20, 33]] += [5.0, 0.45, 5.0]  # before the history is full, near 3 sigma, far above
    norm[[27, 40]] += [1.0, 0.2]
    decisions = []
    for x, n in zip(loss, norm):
        theirs.latest_loss = torch.tensor(float(np.float32(x)))
        theirs.latest_grad_norm = torch.tensor(float(np.float32(n)))
        skipped_theirs = bool(theirs.step_skipped)
        _, state = update({"w": jnp.full([1], n, jnp.float32)}, state, np.float32(x))
        assert bool(state.last_skipped) == skipped_theirs
        decisions.append(skipped_theirs)
    assert not decisions[5] and decisions[33] and decisions[27]  # the rule is exercised both ways


def optax_identity():
    import optax

    return optax.identity()


def test_step_for_step_olmax_trains_as_olmo_core(both, tmp_path):
    run_dir = both["runs"]["a"][0]
    d = diffs(both, "a")
    assert len(d["loss"]) == STEPS
    lr = d["lr_ref"]
    assert lr.argmax() == 9 and lr[-1] < lr.max() / 2  # warmup (10 steps), then the cosine decay
    assert d["loss_ref"][-5:].mean() < d["loss_ref"][:5].mean() - 1.0  # it learns
    assert_step_for_step(d)
    assert_params_close(*final_params(both, "a"))
    out = tmp_path / "compare"
    from compare import cli

    assert cli.main([run_dir, both["refs"]["a"][0], "--out", str(out)]) == 0  # PASS at default tolerances
    result = json.loads((out / "compare.json").read_text())
    assert result["verdict"]["passed"] is True and "val" in result["sets"]
    assert result["aligned"]["loss"]["points"] == STEPS
    assert result["aligned"]["loss"]["max_abs_diff"] <= LOSS_ABS
    page = (out / "compare.html").read_text()
    assert "Training loss" in page and page.count("<svg") >= 4  # both curves drawn on each overlay


def test_the_reference_records_the_norm_it_clips_by_summed_in_float64(both):
    """bench.olmo_reference logs, beside OLMo-core's own grad norm (torch's float32 `get_total_norm`),
    the same pre-clip gradients' norm summed in float64 (GRAD_NORM_F64) at every update: at these
    shapes (512 ids) the two agree to float32 rounding (measured ≤ 1.4e-6 here, ≤ 3.9e-6 over the
    fixture's 256 updates), so it is the same quantity, and it is the pre-clip one (updates with a norm
    above clip_norm 1.0, which the clipped gradients' would not show); at a 100k-row LM head OLMo-core's
    float32 one is low (bench.olmo_scale, tests/bench/test_olmo_scale.py)."""
    rows = sfs.ref_rows(both["refs"]["a"][0])
    updates = [s for s in sorted(rows) if ref_lib.CE in rows[s]]
    assert len(updates) == STEPS
    for s in updates:
        own, f64 = rows[s][ref_lib.GRAD_NORM], rows[s][ref_lib.GRAD_NORM_F64]
        assert abs(own / f64 - 1) <= 1e-5, (s, own, f64)
    assert max(rows[s][ref_lib.GRAD_NORM_F64] for s in updates) > 2.0  # clipped updates: pre-clip norms
    first = sfs.rows_of(both["runs"]["a"][0])[0]  # olmax's update 1 (its step 0): the same weights
    assert abs(first["grad_norm"] / rows[1][ref_lib.GRAD_NORM_F64] - 1) <= 1e-6


def test_a_planted_loss_spike_is_skipped_by_both_at_the_same_step(both):
    d = diffs(both, "skip")
    assert list(np.flatnonzero(d["skipped_ref"])) == [SPIKE_STEP]  # OLMo-core skips the spike, only it
    assert list(np.flatnonzero(d["skipped"])) == [SPIKE_STEP]
    others = np.delete(d["loss_ref"], SPIKE_STEP)
    assert d["loss_ref"][SPIKE_STEP] > others.max() + 1.0  # a real spike
    assert_step_for_step(d)  # the curves together before and after it
    assert_params_close(*final_params(both, "skip"))


def test_stage2_from_a_stage1_checkpoint_with_its_adam_state_in_4_microbatches(both):
    """olmax init_from stage 1's last checkpoint (params and Adam state) against OLMo-core loading the
    same state (TransformerTrainModule.load_state_dict, as load_optim_state=True does), a linear decay
    to 0 without warmup; olmax accumulates 4 microbatches, OLMo-core's rank_microbatch_size is one
    instance (4 per batch)."""
    _, overrides, _ = both["runs"]["s2"]
    cfg = load_config(TINY, overrides)
    assert cfg.microbatches == 4 and cfg.checkpoint.init_from.endswith(f"checkpoints/{STEPS}")
    d = diffs(both, "s2")
    assert len(d["loss"]) == STAGE2_STEPS
    lr = d["lr_ref"]
    assert lr[0] == pytest.approx(2e-3 * (1 - 1 / STAGE2_STEPS)) and lr[-1] == 0.0  # linear to 0, no warmup
    assert_step_for_step(d)
    assert_params_close(*final_params(both, "s2"))


def test_the_lessons_fail_against_olmo_core_where_a_correct_run_passes(both, tmp_path):
    """bench.olmo_lessons' acceptance on its runs: olmax correct → compare PASS against
    OLMo-core's curve (and step for step within LESSONS_ABS over 150 updates: float32 rounding moves
    nothing there); bf16 Adam moments → FAIL; double sharding → held-out FAIL while its training loss
    looks better than OLMo-core's (half the slice, each instance twice as often: memorised further)."""
    lessons = both["lessons"]
    d = sfs.differences(lessons["runs"]["correct"], lessons["ref"])
    assert len(d["loss"]) == olmo_lessons.STEPS and (d["lr"] == 0.0).all()
    assert d["loss_ref"][-10:].mean() < d["loss_ref"][:10].mean() - 3.0  # the slice is memorised
    assert np.abs(d["loss"]).max() <= LESSONS_ABS and np.abs(d["heldout"]).max() <= LESSONS_ABS, d["heldout"]
    rows = olmo_lessons.judge(lessons["runs"], lessons["ref"], tmp_path)
    assert olmo_lessons.acceptance(rows) == [], rows
    assert rows["bf16_moments"]["heldout_max_abs_diff"] > 100 * LESSONS_ABS  # the lesson, not rounding
    assert rows["double_sharding"]["heldout_final_diff"] > 0.05  # held-out worse at the end ...
    assert rows["double_sharding"]["train_gap_final_smoothed"] < -0.05  # ... while training loss looks better


def test_the_lessons_acceptance_names_what_does_not_hold():
    acceptance = olmo_lessons.acceptance
    good = {
        "correct": {"compare": "PASS"},
        "bf16_moments": {"compare": "FAIL"},
        "double_sharding": {"compare": "FAIL", "train_gap_final_smoothed": -0.2},
    }
    assert acceptance(good) == []
    worse_train = {**good, "double_sharding": {"compare": "FAIL", "train_gap_final_smoothed": 0.1}}
    assert acceptance(worse_train) == [
        "double_sharding: its training loss does not look better than the reference's (gap 0.1)"
    ]
    assert acceptance({**good, "correct": {"compare": "FAIL"}}) == ["correct: compare FAIL, expected PASS"]


@pytest.mark.parametrize(
    "override, said",
    [
        ("document_masking=true", "document_masking must be false"),
        ("data_order=grain", "data_order='grain'"),
        ("schedule.step_offset=0", "schedule.step_offset=0"),
        ("skip_step.min_history=5", "skip_step.min_history=5"),
        ("skip_step.sigma=2.5", "skip_step.sigma=2.5"),
        ("model_overrides.compute_dtype=bfloat16", "float32"),
    ],
)
def test_the_reference_refuses_what_olmo_core_cannot_run_here_in_one_line(tmp_path, capsys, override, said):
    overrides = sfs.recipe(str(tmp_path / "manifest.json"), 5, override)
    assert ref_lib.main(["--config", TINY, "--out", str(tmp_path / "ref.jsonl"), *overrides]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err
    assert not (tmp_path / "ref.jsonl").exists()


def test_the_reference_checks_where_it_writes_before_it_trains(tmp_path, capsys):
    overrides = sfs.recipe(str(tmp_path / "manifest.json"), 5)
    assert ref_lib.main(["--config", TINY, "--out", str(tmp_path / "no" / "ref.jsonl"), *overrides]) == 2
    assert "does not exist" in capsys.readouterr().err


@pytest.mark.parametrize(
    "changes, said",
    [
        # olmax's init_from refuses the changed setting by name (trainer.checkpointing.resume) ...
        (["skip_step.window=16"], "its run's settings differ from this config's: skip_step.window: checkpoint has 128"),
        # ... and, allowed by name, the skip step's history buffers the window shapes (rules.shape_differences)
        (
            ["skip_step.window=16", "checkpoint.init_from_allow_changes=[skip_step.window]"],
            "holds other arrays than this config makes: opt_state: grad_norms: checkpoint has shape (128,), "
            "config makes (16,)",
        ),
    ],
)
def test_the_reference_refuses_an_init_from_olmax_refuses_in_one_line_before_olmo_core_runs(
    both, tmp_path, capsys, changes, said
):
    """A stage 2 whose skip_step.window differs from stage 1's: one `error:` line (exit 2) naming the
    setting, as olmax's trainer refuses it, not orbax's shape error from inside OLMo-core's run."""
    _, overrides, _ = both["runs"]["s2"]
    out = tmp_path / "ref.jsonl"
    assert ref_lib.main(["--config", TINY, "--out", str(out), *overrides, *changes]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err
    assert not out.exists()
