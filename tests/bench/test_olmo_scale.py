"""olmax against OLMo-core 3.0.0 at the real shapes, from OLMo-core's own init (`bench/olmo_scale.py`,
issue #58 items 3 and 4a): d_model 256, OLMo 3's 3:1 sliding/full layers with a window of 256 in
1024-token sequences, dolma2's 100,278 ids padded to AI2's 100,352 rows (every one scored), the
embedded sample's text in dolma2 ids; both trainers start from OLMo-core's `init_weights` (its
`init_seed` stream), imported by `trainer.convert from-olmo-core`, and each also trains in two
microbatches: its own rounding noise (the self-control) against which the cross differences are
bounded.

This test trains TEST_STEPS updates per run (4 runs: ~3 minutes on 2 free cores, most of it
compilation and OLMo-core's 100k-row LM head); `python -m bench.olmo_scale` trains the issue's 30
(figures in bench/RESULTS.md). Where the bounds come from: the differences on both sides are
float32 rounding of the same arithmetic in another order; the self-control changes only the
order (two microbatches' gradients summed instead of one batch's), so olmax against OLMo-core
within K self-gaps says that swapping the framework changes the run no more than regrouping a
sum does, up to K. K is stated with the figures it was measured on (module constants).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from bench import olmo_bounds as bounds
from bench import olmo_reference as ref_lib
from bench import olmo_scale as scale
from tests.shared import build_once
from trainer.config.schema import load_config
from trainer.convert.dcp_read import open_step

# ~3-4 minutes: the scale run, kept out of make test's 12 minutes; CI runs it (make test-extra)
pytestmark = pytest.mark.ci_extra

TEST_STEPS = 3
INITS = {"olmo-core": (1, 2)}
# cross ≤ K × the larger self-gap (olmax's or OLMo-core's, 1 vs 2 microbatches) for train CE and the
# non-embedding parameters. K = 10: measured ratios ≤ 3.2 (3 updates: train CE 5.7e-6 against
# olmax's 1.9e-6, the parameters' relative norm 9.5e-6 against 3.0e-6), so 10 leaves a margin for
# other CPUs' rounding, while a difference beyond the frameworks' own rounding noise (a wrong window
# or padding: ~1e-3 and more) fails.
K = 10.0
# The grad norm (float64 norms of both sides' gradients, below) joined them after its cause was found:
# measured 3 updates, cross 8.2e-6 / 1.1e-5 (1 / 2 microbatches) against olmax's self-gap 2.4e-6
# (ratios 3.4, 4.6; OLMo-core's own float32 norm: 2.6e-4, ratio 110) (notes of issue #58, scale2).
CONTROLLED = ("loss_abs", "params_rel_norm", "grad_norm_rel")
# Bounded absolutely only (the measured figures × ~4):
# - held-out CE: olmax's in-loop evaluation sums each batch's per-token CE in float32 (2046 tokens,
#   a sum of ~22,000: its resolution ~1e-6 per token, so olmax against itself is bit-equal under the
#   split, a blind control); the same parameters through olmax's forward summed in float64 match
#   OLMo-core's evaluation to 1.1e-8 (measured), the cross gap here is 3.9e-6;
# - the grad norm, against the reference's own pre-clip gradients' norm summed in float64
#   (bench.olmo_reference.GRAD_NORM_F64), not OLMo-core's logged one: torch's float32
#   `get_total_norm` on the CPU sums the LM head's 25.7M squared entries with a float32 accumulator
#   and comes out low (measured at update 1, same weights: its LM-head norm 1.95e-4 low, the total
#   1.06e-5 low, while the float64 sums of olmax's and OLMo-core's gradients agree to 3e-9): what the
#   earlier "grad-norm drift" was (notes of issue #58, scale2).
LOSS_ABS, HELDOUT_ABS, GRAD_REL, PARAMS_ABS = 2e-5, 2e-5, 1e-4, 1e-3
# update 1: the same weights and batch on both sides: the gradients' norms (float64 sums) agree to
# this (measured 3e-9 at OLMo-core's init on the bench's first batch), and OLMo-core's own float32
# one is off by more (measured 1.06e-5)
GN_SAME_WEIGHTS = 1e-6


@pytest.fixture(scope="session")
def scale_run(tmp_path_factory) -> dict:
    def build(root):
        built = scale.build(root, steps=TEST_STEPS, seq_len=scale.SEQ_LEN, inits=INITS)
        return {"built": built, "figures": scale.figures(built)}

    return build_once(tmp_path_factory, "olmo_scale", build)


def test_the_run_has_olmo3s_shapes_on_the_samples_dolma2_ids(scale_run):
    f, built = scale_run["figures"], scale_run["built"]
    s = f["shape"]
    assert s["d_model"] >= 256 and s["layers"] == ["sliding_attention"] * 3 + ["full_attention"]
    assert s["window"] < s["seq_len"] == 1024
    assert (s["vocab"], s["padded_vocab"], s["scored_vocab"]) == (100278, 100352, 100352)  # AI2's padding
    from pipelines.dolma2_tokenizer import dolma2  # tiktoken's ranks: only here

    ids = np.fromfile(f"{built['data'].rsplit('/', 1)[0]}/npy/web-000.npy", "<u4")
    assert ids.max() < 100278 and (ids > 50000).sum() > 100  # the real vocabulary, not a toy's
    text = dolma2().decode(ids[:4096].tolist())
    assert "def " in text or "import" in text  # the sample's code, read back through the tokenizer


def test_olmo_cores_init_is_what_both_trainers_start_from_bit_for_bit(scale_run):
    i = scale_run["figures"]["init"]
    assert i["import_max_abs"] == 0.0  # from-olmo-core's olmax step holds OLMo-core's tensors exactly
    assert i["reference_start_max_abs"] == 0.0  # and OLMo-core's trainer is handed them back exactly
    assert i["fresh_moments_max_abs"] == 0.0
    # OLMo-core's normal init (std 0.02 cut at 3σ: 0.019732) on every matrix, seeded by its init_seed
    assert all(abs(v - 0.019732) < 5e-4 for v in i["std"].values()), i["std"]


def test_olmax_trains_step_for_step_with_olmo_core_within_k_self_gaps(scale_run):
    f = scale_run["figures"]
    assert f["self_gap"]["loss_abs"] > 0 and f["self_gap"]["params_rel_norm"] > 0  # the control is not blind
    for label in f["cross"]:
        for q in CONTROLLED:
            if f["self_gap"][q] > 0:
                assert f["pairs"][label][q] <= K * f["self_gap"][q], (label, q, f["pairs"][label][q], f["self_gap"][q])


def test_olmax_trains_step_for_step_with_olmo_core_in_absolute_terms(scale_run):
    f = scale_run["figures"]
    for label in f["cross"]:
        p = f["pairs"][label]
        assert p["loss_abs"] <= LOSS_ABS and p["heldout_abs"] <= HELDOUT_ABS, (label, p)
        assert p["grad_norm_rel"] <= GRAD_REL and p["params_abs"] <= PARAMS_ABS, (label, p)


def test_olmax_grad_norm_is_olmo_cores_gradients_norm_and_olmo_cores_own_is_low(scale_run):
    """At update 1 both trainers hold the same weights (the bit-equal import) and the same batch:
    olmax's logged grad norm equals the float64 norm of OLMo-core's pre-clip gradients within
    GN_SAME_WEIGHTS, while OLMo-core's own logged norm (torch's float32 `get_total_norm` on the CPU)
    is lower by more than that: the reference's reduction, not a difference in the gradients."""
    f = scale_run["figures"]
    for mb in INITS["olmo-core"]:
        ox = f["by_update"][scale.run_name("olmax", "olmo-core", mb)]
        oc = f["by_update"][scale.run_name("olmo-core", "olmo-core", mb)]
        assert len(oc["grad_norm_f64"]) == TEST_STEPS  # recorded at every update
        assert abs(ox["grad_norm"][0] / oc["grad_norm_f64"][0] - 1) <= GN_SAME_WEIGHTS, (ox, oc)
        assert oc["grad_norm"][0] < oc["grad_norm_f64"][0] * (1 - GN_SAME_WEIGHTS), oc
    for label in f["cross"]:
        assert f["pairs"][label]["grad_norm_f64"]  # the pairs' grad_norm_rel is the float64 norms'


def test_the_runs_learn_from_ln_of_the_padded_vocabulary(scale_run):
    for first, last in scale_run["figures"]["loss_first_last"].values():
        assert abs(first - math.log(100352)) < 0.2 and last < first - 0.1  # a real update, not a no-op


def test_the_imported_init_is_what_olmo_cores_train_module_draws_from_its_seed(scale_run):
    """OLMo-core's TransformerTrainModule, built as the reference builds it but with INIT_SEED and
    nothing loaded, initialises (parallelize_model -> init_weights) exactly the tensors the import read:
    the bench's init is OLMo-core's trainer's own seed stream, not a re-implementation of it."""
    import torch  # optional: the test extra (torch, OLMo-core)
    from olmo_core.train.train_module import TransformerTrainModule

    run = next(iter(scale_run["built"]["runs"].values()))
    cfg = load_config(scale.sfs.TINY, run.overrides)
    olmo = dataclasses.replace(ref_lib.model_config(cfg.model_cfg()), init_seed=scale.INIT_SEED)
    model = olmo.build(init_device="cpu")
    TransformerTrainModule(  # builds as bench.olmo_reference builds it: parallelize_model -> init_weights
        model,
        ref_lib.optim_config(cfg),
        rank_microbatch_size=scale.SEQ_LEN * scale.G,
        max_sequence_length=scale.SEQ_LEN,
        device=torch.device("cpu"),
    )
    step = open_step(f"{scale_run['built']['data'].rsplit('/', 2)[0]}/olmo_core_init")
    state = model.state_dict()
    assert sorted(f"model.{k}" for k in state) == sorted(step.model_keys())
    for k, v in state.items():
        assert np.array_equal(v.detach().numpy(), step.read(f"model.{k}")), k


def test_every_update_is_within_the_bounds_benchs_k_of_the_self_gaps(scale_run):
    """Update by update, as `bench.olmo_bounds` bounds the toy runs: the train CE's and the grad norm's
    cross gap against the running envelope of both frameworks' own microbatch gaps (floor 4 float32
    ulps) stays within that bench's K per step (32). The 30-update figures: ≤ 9.3 (CE), ≤ 29.5
    (grad norm, at update 12, clipping every update; 1.9 / 3.0 without clipping; bench/RESULTS.md)."""
    f = scale_run["figures"]
    assert set(f["per_update_bounds"]) == set(f["cross"])
    for label, b in f["per_update_bounds"].items():
        for q, k in (("loss", bounds.K["ce"]), ("grad_norm", bounds.K["grad_norm"])):
            assert b[q]["points"] == TEST_STEPS and b[q]["ratio_max"] <= k, (label, q, b[q])
