"""olmax against OLMo-core 3.0.0 within K × each framework's own rounding noise (`bench.olmo_bounds`):
for 3 seeds × 100 updates at Adam eps 1e-8 (OLMo 3's), per step and per quantity, the
olmax-vs-OLMo-core gap stays within K times the larger self-gap (olmax 1 vs 2 microbatches,
OLMo-core rank_microbatch_size G·L vs G·L/2), where fixed bounds fitted to one seed do not hold
(issue 58). The slow proof is `ci_extra` (make test-extra); the rules of the check are fast tests.
"""

from __future__ import annotations

import numpy as np
import pytest

from bench import olmo_bounds as ob


def test_a_zero_self_gap_bounds_by_the_stated_floor_not_by_zero():
    ulp = ob.floor("ce", np.array([3.0]))[0] / ob.FLOOR_ULPS  # float32 spacing at 3.0: 2**-22
    assert ulp == 2.0**-22
    zero = np.zeros(3)
    fl = ob.floor("ce", np.full(3, 3.0))
    inside = ob.bounded(np.full(3, ob.K["ce"] * ob.FLOOR_ULPS * ulp), zero, zero, fl)
    assert inside["ratio_max"] == pytest.approx(ob.K["ce"]) and inside["at_floor"] == 3
    outside = ob.bounded(np.full(3, 1.01 * ob.K["ce"] * ob.FLOOR_ULPS * ulp), zero, zero, fl)
    assert outside["ratio_max"] > ob.K["ce"]  # a bit-identical control is no licence for any gap


def test_the_control_is_the_self_gap_seen_so_far_by_either_framework():
    cross = np.array([1e-6, 1e-6, 9e-6, 9e-6])
    ox = np.array([1e-6, 3e-6, 0.0, 0.0])  # its self-gap crosses 0 at steps 3 and 4: the envelope keeps 3e-6
    oc = np.array([2e-6, 0.0, 0.0, 0.0])
    r = ob.bounded(cross, ox, oc, np.full(4, 1e-9))
    assert r["ratios"] == [0.5, 0.3333, 3.0, 3.0]
    assert r["pointwise_ratio_max"] == pytest.approx(9e3)  # what a per-step control alone would say
    assert r["worst_step"] == 2 and r["at_floor"] == 0


def test_grad_norm_is_compared_relative_with_a_relative_floor():
    assert ob.gap("grad_norm", np.array([2.0 * (1 + 1e-6)]), np.array([2.0]))[0] == pytest.approx(1e-6)
    assert ob.floor("grad_norm", np.array([123.0]))[0] == ob.FLOOR_ULPS * 2.0**-23


def test_a_case_with_an_arm_that_did_not_run_is_unknown_never_pass(tmp_path):
    built = {
        "cases": {"plain/0": {"dirs": {}, "steps": 100}, "plain/1": {"dirs": {a: str(tmp_path) for a in ob.ARMS}}},
        "errors": {"plain/0/oc2": "RuntimeError: boom"},
    }
    built["cases"]["plain/1"]["steps"] = 100
    judged = ob.judge(ob.measure(built))
    assert judged["plain/0"] == {"verdict": "UNKNOWN", "why": ["plain/0/oc2: RuntimeError: boom"]}
    assert judged["plain/1"]["verdict"] == "UNKNOWN"  # no tables at all: said, not passed
    assert "metrics" in judged["plain/1"]["why"][0] or "No such file" in judged["plain/1"]["why"][0]


def test_the_bench_refuses_a_used_folder_and_a_stage_2_without_its_stage_1_in_one_line(tmp_path, capsys):
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "x").write_text("")
    assert ob.main(["--out", str(tmp_path / "used")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and "not empty" in err[0]
    assert ob.main(["--out", str(tmp_path / "new"), "--scenarios", "stage2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "stage2 starts from a stage-1 scenario" in err[0]


# ------------------------------------------------------------------ the proof (ci_extra: minutes)

PROOF = ("clip_z_skip", "stage2")  # the stage-1 scenario that clips, weighs z-loss and skips; its stage 2
EPS_ARM = ("clip_z_skip/0", "ox_eps", ["optimizer.eps=1e-6"])  # a real slip: another Adam eps than OLMo 3's


@pytest.fixture(scope="module")
def proof(tmp_path_factory) -> dict:
    built = ob.build(tmp_path_factory.mktemp("olmo_bounds"), PROOF, ob.SEEDS, ob.STEPS, extra_arms=[EPS_ARM])
    return {"built": built, "judged": ob.judge(ob.measure(built))}


@pytest.mark.ci_extra
def test_olmax_stays_within_k_self_gaps_of_olmo_core_for_3_seeds_and_100_updates(proof):
    judged = proof["judged"]
    assert {n: j["verdict"] for n, j in judged.items()} == {
        **{f"clip_z_skip/{s}": "PASS" for s in ob.SEEDS},
        f"stage2/{ob.SEEDS[0]}": "PASS",
    }, {n: j["why"] for n, j in judged.items()}
    assert len(ob.SEEDS) >= 3 and ob.STEPS >= 100
    for name, j in judged.items():
        c = proof["built"]["cases"][name]
        assert j["steps"]["ce"]["points"] == c["steps"] and j["steps"]["grad_norm"]["points"] == c["steps"]
        assert j["steps"]["heldout"]["points"] >= c["steps"] // 10
        tensors = {q for q in j["params"] if q.startswith("param:")}
        assert {"param:embed/embedding", "param:lm_head/kernel", "param:layers/attn/q_proj"} <= tensors
        assert j["params"]["frequent:embed/embedding"]["points"] >= 3  # rows seen >= FREQUENT times
        assert all(c["overrides"][a][-1] == "microbatches=2" for a in ("ox2", "oc2"))  # the controls


@pytest.mark.ci_extra
def test_the_proof_clips_skips_and_weighs_z_loss_alike_on_every_arm(proof):
    """The scenario exercises what it names: most steps clipped at 0.5, the planted spike skipped
    by all four arms at the same update and no other (step_gaps reports any arm that differs),
    z-loss 1e-3 logged; stage 2 starts from stage 1's checkpoint and decays to 0."""
    for s in ob.SEEDS:
        c = proof["built"]["cases"][f"clip_z_skip/{s}"]
        j = proof["judged"][f"clip_z_skip/{s}"]
        assert j["steps"]["skipped_steps"]["steps"] == [ob.SPIKE_STEP]
        oc = ob.series(c, "oc")
        assert (oc["grad_norm"] > 0.5).mean() > 0.8 and (oc["z"] > 0).all()
    c2 = proof["built"]["cases"][f"stage2/{ob.SEEDS[0]}"]
    assert any(o.startswith("checkpoint.init_from=") for o in c2["overrides"]["oc"])
    lr = ob.series(c2, "oc")["lr"]
    assert lr[-1] == 0.0 and lr[0] > lr[-1]


@pytest.mark.ci_extra
def test_the_bound_is_at_the_scale_of_the_noise_not_above_it(proof):
    """K is not slack: in every case some update's cross-gap reaches the control (ratio ≥ 1 for one
    per-step quantity at least; measured 5.6-16 in stage 1, 8.1 in stage 2), and a bound of K = 1
    fails somewhere — olmax and OLMo-core differ by about what each differs from itself."""
    for name, j in proof["judged"].items():
        assert max(j["steps"][q]["ratio_max"] for q in ob.PER_STEP) >= 1.0, (name, j["steps"])
    tight = ob.judge(ob.measure(proof["built"]), {q: 1.0 for q in ob.K})
    assert any(j["verdict"] == "FAIL" for j in tight.values())


@pytest.mark.ci_extra
def test_an_adam_eps_of_1e_6_instead_of_olmo_3s_1e_8_fails_the_bound(proof):
    """The check sees a real slip: olmax with eps 1e-6 (OLMo 3 trains with 1e-8) against the same
    OLMo-core run and the same controls FAILs — per step (measured ratios 1600-18000), on the
    non-embedding tensors (85-1800, all 13 past K) and on the frequently seen embedding rows (1460). Not on the
    embedding as a whole (max |Δ| / max |w|: 4.8): its rarely-seen rows' self-gaps are as large as
    the slip (the chaotic rows), hence the row-by-row check of the frequent ones."""
    name, arm, _ = EPS_ARM
    built = {"cases": {name: proof["built"]["cases"][name]}, "errors": proof["built"]["errors"]}
    judged = ob.judge(ob.measure(built, cand=arm))[name]
    assert judged["verdict"] == "FAIL", judged
    for q in ("ce", "grad_norm", "heldout"):
        assert judged["steps"][q]["ratio_max"] > 10 * ob.K[q], (q, judged["steps"][q])
    tensors = {q: v for q, v in judged["params"].items() if q.startswith("param:") and q != "param:embed/embedding"}
    assert sum(v["ratio_max"] > ob.K["param"] for v in tensors.values()) >= 10, tensors  # measured: all 13
    assert judged["params"]["frequent:embed/embedding"]["ratio_max"] > 10 * ob.K["frequent"]
