"""olmax's training step against OLMo-core's, update for update: the reference curves are made by
OLMo-core 3.0.0 itself (`bench/olmo_reference.py`: its Transformer, TransformerTrainModule,
SkipStepAdamW, CosWithWarmup / LinearWithWarmup, Trainer and data loader, on the CPU) from the
olmax run's own initial weights and token files; the run side is `trainer.main.main`, the CLI's
entry point. Float32 on both sides.

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
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import olmo_reference as ref_lib
from tests.shared import build_once
from tests.trainer.olmo_reference_data import recipe, write_data
from trainer.config.schema import load_config

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "trainer/configs/tiny.yaml")
L, G = 32, 4
STEPS, MB_STEPS, SKIP_STEPS, STAGE2_STEPS = 50, 30, 36, 20
SPIKE_STEP = 30  # 0-based olmax step (OLMo-core's step 31): after the 19 earlier steps window 40 needs
# OLMo-core's rolling_interval_length 40 (it may skip from its 20th loss) and sigma 3 (the spike, ~2x the
# loss, must stand out of a history that still holds the first steps' fall)
SKIP = ["skip_step.window=40", "skip_step.sigma=3"]
STAGE2 = [
    "schedule.kind=linear",
    "schedule.warmup_steps=0",
    "schedule.final_lr_ratio=0.0",
    "lr=2e-3",
    "seed=1337",
]

# Measured on this machine (see the module doc); the bounds leave room for other CPUs' rounding.
LOSS_ABS = 1e-5  # per-step train CE, nats (measured ≤ 1.4e-6)
Z_ABS = 1e-8  # per-step z-loss term (measured ≤ 1.2e-10)
GRAD_REL = 1e-4  # per-step pre-clip grad norm, relative (measured ≤ 3.8e-6)
# the learning rate, in float32 ulps of OLMo-core's (measured ≤ 4, relative ≤ 5e-7): olmax's schedule is
# optax's, evaluated in float32 under jit (jnp.cos); OLMo-core's CosWithWarmup.get_lr is Python floats
# (math.cos, float64); both apply it to float32 tensors
LR_ULPS = 8
HELDOUT_ABS = 1e-5  # held-out CE (measured ≤ 1.8e-6)
PARAM_ABS = 1e-4  # every tensor but the embedding, max abs after the last update (measured ≤ 4.2e-6)
EMBED_ABS = 1e-2  # the embedding's few rare-id entries (measured ≤ 2.7e-3; see the module doc)
EMBED_REL = 1e-2  # the embedding's difference norm / its norm


def _olmax_overrides(manifest: str, steps: int, *extra: str) -> list[str]:
    return recipe(manifest, steps, *extra)


def _build(root: Path) -> dict:
    data = write_data(str(root / "data"), L)
    spiked = write_data(str(root / "spiked"), L, seed=1, spike=(SPIKE_STEP, 0, G))
    runs = root / "runs"
    a = str(runs / "a")
    olmax = {
        "a": (a, _olmax_overrides(data, STEPS)),
        "mb": (str(runs / "mb"), _olmax_overrides(data, MB_STEPS, "microbatches=4")),
        "skip": (str(runs / "skip"), _olmax_overrides(spiked, SKIP_STEPS, *SKIP)),
        "s2": (
            str(runs / "s2"),
            _olmax_overrides(data, STAGE2_STEPS, *STAGE2, f"checkpoint.init_from={a}/checkpoints/{STEPS}"),
        ),
    }
    spec = root / "runs.json"
    spec.write_text(json.dumps({"config": TINY, "runs": list(olmax.values())}))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    # the olmax runs in one process beside this one (2 cores: the references train meanwhile)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.trainer.olmo_reference_runs", str(spec)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    refs = {}
    try:
        for name in ("a", "mb", "skip"):
            out = str(root / f"ref_{name}.jsonl")
            state = str(root / f"ref_{name}.npz")
            overrides = olmax[name][1]
            if name == "a":  # the command itself, as a user runs it
                assert ref_lib.main(["--config", TINY, "--out", out, "--state", state, *overrides]) == 0
            else:
                ref_lib.run(load_config(TINY, overrides), out, str(root / f"work_{name}"), state)
            refs[name] = (out, state)
        log, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, log[-3000:]
    # stage 2 starts from the olmax stage-1 checkpoint (params and Adam state), so after run a
    out, state = str(root / "ref_s2.jsonl"), str(root / "ref_s2.npz")
    ref_lib.run(load_config(TINY, olmax["s2"][1]), out, str(root / "work_s2"), state)
    refs["s2"] = (out, state)
    return {"olmax": olmax, "refs": refs, "data": data, "spiked": spiked}


@pytest.fixture(scope="session")
def both(tmp_path_factory) -> dict:
    return build_once(tmp_path_factory, "olmo_reference", _build)


def rows_of(run_dir: str) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, Path(run_dir, "metrics.jsonl").read_text().splitlines())}


def ref_rows(path: str) -> dict[int, dict]:
    return {r[ref_lib.STEP]: r for r in map(json.loads, Path(path).read_text().splitlines())}


def differences(run_dir: str, ref_path: str) -> dict[str, np.ndarray]:
    """Per update (olmax step s = OLMo-core's step s + 1): run − reference."""
    run, ref = rows_of(run_dir), ref_rows(ref_path)
    assert sorted(s + 1 for s in run) == sorted(s for s in ref if ref_lib.CE in ref[s])
    steps = sorted(run)
    pick = lambda key, rkey: (
        np.array([run[s][key] for s in steps], np.float64),
        np.array([ref[s + 1][rkey] for s in steps], np.float64),
    )
    loss, rloss = pick("loss", ref_lib.CE)
    z, rz = pick("z_loss", ref_lib.Z)
    gn, rgn = pick("grad_norm", ref_lib.GRAD_NORM)
    lr, rlr = pick("lr", ref_lib.LR)
    sk, rsk = pick("skipped", ref_lib.SKIPPED)
    held = [
        (s, run[s]["heldout/val/loss"], ref[s + 1][ref_lib.HELDOUT.format(label="val")])
        for s in steps
        if "heldout/val/loss" in run[s]
    ]
    assert held and all(ref_lib.HELDOUT.format(label="val") in ref[s + 1] for s, _, _ in held)
    return {
        "loss": loss - rloss,
        "loss_ref": rloss,
        "z": z - rz,
        "grad_rel": gn / rgn - 1,
        # olmax evaluates its schedule in float32 under jit, OLMo-core in Python floats: the
        # learning rate applied is float32 on both sides, so "exact" is to float32's resolution
        "lr_ulps": np.abs(lr.astype(np.float32) - rlr.astype(np.float32)) / np.spacing(rlr.astype(np.float32)),
        "lr_ref": rlr,
        "skipped": sk,
        "skipped_ref": rsk,
        "heldout": np.array([a - b for _, a, b in held]),
    }


def final_params(both: dict, name: str, steps: int) -> tuple[dict, dict]:
    """(olmax's params after its last update, OLMo-core's), olmax's layout, flat."""
    import jax

    run_dir, overrides = both["olmax"][name]
    params, _ = ref_lib.restore_step(load_config(TINY, overrides), f"{run_dir}/checkpoints/{steps}")
    flat = {
        "/".join(str(getattr(k, "key", k)) for k in p): np.asarray(v)
        for p, v in jax.tree_util.tree_flatten_with_path(params)[0]
    }
    ref = dict(np.load(both["refs"][name][1]))
    assert flat.keys() == ref.keys()
    return flat, ref


def assert_step_for_step(d: dict[str, np.ndarray]) -> None:
    assert np.abs(d["loss"]).max() <= LOSS_ABS, np.abs(d["loss"]).max()
    assert np.abs(d["z"]).max() <= Z_ABS, np.abs(d["z"]).max()
    assert np.abs(d["grad_rel"]).max() <= GRAD_REL, np.abs(d["grad_rel"]).max()
    assert d["lr_ulps"].max() <= LR_ULPS, d["lr_ulps"].max()
    assert np.abs(d["heldout"]).max() <= HELDOUT_ABS, d["heldout"]
    assert (d["skipped"] == d["skipped_ref"]).all()


def assert_params_close(flat: dict, ref: dict) -> None:
    for k in flat:
        diff = np.abs(flat[k] - ref[k]).max()
        if k == "embed/embedding":
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

    cfg = load_config(TINY, both["olmax"]["a"][1])
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
    run_dir = both["olmax"]["a"][0]
    d = differences(run_dir, both["refs"]["a"][0])
    assert len(d["loss"]) == STEPS
    lr = d["lr_ref"]
    assert lr.argmax() == 9 and lr[-1] < lr.max() / 2  # warmup (10 steps), then the cosine decay
    assert d["loss_ref"][-5:].mean() < d["loss_ref"][:5].mean() - 1.0  # it learns
    assert_step_for_step(d)
    assert_params_close(*final_params(both, "a", STEPS))
    out = tmp_path / "compare"
    from trainer.compare import cli

    assert cli.main([run_dir, both["refs"]["a"][0], "--out", str(out)]) == 0  # PASS at default tolerances
    result = json.loads((out / "compare.json").read_text())
    assert result["verdict"]["passed"] is True and "val" in result["sets"]
    assert result["aligned"]["loss"]["points"] == STEPS
    assert result["aligned"]["loss"]["max_abs_diff"] <= LOSS_ABS
    page = (out / "compare.html").read_text()
    assert "Training loss" in page and page.count("<svg") >= 4  # both curves drawn on each overlay


def test_microbatches_olmax_4_against_olmo_cores_rank_microbatch_size(both):
    d = differences(both["olmax"]["mb"][0], both["refs"]["mb"][0])
    assert len(d["loss"]) == MB_STEPS
    assert_step_for_step(d)
    assert_params_close(*final_params(both, "mb", MB_STEPS))


def test_a_planted_loss_spike_is_skipped_by_both_at_the_same_step(both):
    d = differences(both["olmax"]["skip"][0], both["refs"]["skip"][0])
    assert list(np.flatnonzero(d["skipped_ref"])) == [SPIKE_STEP]  # OLMo-core skips the spike, only it
    assert list(np.flatnonzero(d["skipped"])) == [SPIKE_STEP]
    others = np.delete(d["loss_ref"], SPIKE_STEP)
    assert d["loss_ref"][SPIKE_STEP] > others.max() + 1.0  # a real spike
    assert_step_for_step(d)  # the curves together before and after it
    assert_params_close(*final_params(both, "skip", SKIP_STEPS))


def test_stage2_from_a_stage1_checkpoint_with_its_adam_state(both):
    d = differences(both["olmax"]["s2"][0], both["refs"]["s2"][0])
    assert len(d["loss"]) == STAGE2_STEPS
    lr = d["lr_ref"]
    assert lr[0] == pytest.approx(2e-3 * (1 - 1 / STAGE2_STEPS)) and lr[-1] == 0.0  # linear to 0, no warmup
    assert_step_for_step(d)
    assert_params_close(*final_params(both, "s2", STAGE2_STEPS))
