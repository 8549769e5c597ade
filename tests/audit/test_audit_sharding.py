"""The sharding proof: interval tiling per batch + a bijection per epoch ⇒ hosts never share
an example slot. Brute force confirms it on small plans, and the proof catches broken slicing
or a non-bijective order; it streams (memory independent of the epoch)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from audit.runlog import planned_multiplicity, repeated_positions
from audit.sharding import ShardingConfig, check_sharding, pairwise_overlaps, tiling_errors
from dataloader import hosts, order
from dataloader.plan import SourceSpec, make_plan


def small_plan(records=(37, 11), tokens=(37 * 30, 11 * 29), weights=(0.6, 0.4)):
    specs = [SourceSpec(f"s{i}", i, r, t, w, 8.0) for i, (r, t, w) in enumerate(zip(records, tokens, weights))]
    return make_plan(specs, ["fp"], "train")


@pytest.mark.parametrize("H,G,seed", [(1, 8, 0), (2, 8, 3), (4, 8, 1), (8, 8, 7), (3, 12, 5)])
def test_hosts_never_share_a_slot_within_an_epoch_brute_force(H, G, seed):
    plan = small_plan()
    steps = -(-3 * plan.size // G)  # three epochs, batches straddling epoch boundaries
    r = check_sharding(plan, ShardingConfig(hosts=H, global_batch_size=G, seed=seed, steps=steps))
    assert r.passed, r.failures
    bf = r.figures["brute_force"]
    assert bf["positions"] == steps * G and bf["shared_slots"] == 0
    assert r.figures["overlapping_positions"] == 0
    m = np.array(r.figures["overlap_matrix"])
    assert (m == np.diag(np.diag(m))).all() and m.trace() == steps * G
    # Independent recomputation: the slots each host reads in epoch 0 are disjoint and cover it.
    per_host = []
    for h in range(H):
        pos = np.concatenate([hosts.host_positions(s, G, h, H) for s in range(steps)])
        pos = pos[pos < plan.size]
        per_host.append(set(order.train_slots(pos, plan.size, seed).tolist()))
    assert sum(len(s) for s in per_host) == plan.size == len(set().union(*per_host))


def test_overlapping_host_slices_fail_naming_the_hosts(monkeypatch):
    real = hosts.host_slice

    def leaky(g, h, n):  # host 1 also reads host 0's last row: the double-sharding shape
        lo, hi = real(g, h, n)
        return (lo - 1, hi) if h == 1 else (lo, hi)

    monkeypatch.setattr(hosts, "host_slice", leaky)
    r = check_sharding(small_plan(), ShardingConfig(hosts=4, global_batch_size=8, brute_force_limit=0))
    assert r.passed is False
    assert r.summary.startswith("hosts 0 and 1 both read 1 rows of every global batch")
    assert r.figures["overlap_matrix"][0][1] == r.figures["steps"]


def test_a_gap_between_host_slices_fails_coverage(monkeypatch):
    real = hosts.host_slice
    monkeypatch.setattr(hosts, "host_slice", lambda g, h, n: (real(g, h, n)[0], real(g, h, n)[1] - (h == 2)))
    r = check_sharding(small_plan(), ShardingConfig(hosts=4, global_batch_size=8, brute_force_limit=0))
    assert r.passed is False and r.figures["uncovered_steps"] == r.figures["steps"]
    assert "step 0: host slices do not tile global batch [0, 8)" in r.failures[0]


def test_brute_force_catches_an_order_that_is_not_a_permutation(monkeypatch):
    monkeypatch.setattr(order, "train_slots", lambda p, n, seed: np.asarray(p) % n // 2)
    r = check_sharding(small_plan(), ShardingConfig(hosts=2, global_batch_size=8))
    assert r.passed is False
    assert "was already read in epoch 0 by host" in r.summary


def test_intervals_tiling_and_overlaps_pure():
    lo, hi = np.array([0, 4, 2]), np.array([4, 8, 6])
    assert pairwise_overlaps(lo, hi) == {(0, 2): 2, (1, 2): 2}
    base = np.array([0, 8])
    ok = tiling_errors(np.array([[0, 4], [12, 8]]), np.array([[4, 8], [16, 12]]), base, 8)
    assert ok.tolist() == [False, False]
    bad = tiling_errors(np.array([[0, 3]]), np.array([[4, 8]]), np.array([0]), 8)
    assert bad.tolist() == [True]


def test_planned_multiplicity_matches_the_plans_own_slot_map():
    plan = small_plan()
    src, rec = plan.locate(np.arange(plan.size))
    ids, seen = np.unique(plan.example_ids(src, rec), return_counts=True)
    mult = planned_multiplicity(plan, ids >> 40, ids & ((1 << 40) - 1))
    assert (mult == seen).all()
    assert sorted(set(seen.tolist())) != [1]  # the small source really is repeated (and unevenly)


def test_sharding_proof_memory_does_not_grow_with_the_epoch():
    def peak(positions):
        plan = small_plan(
            records=(positions // 2, positions // 2), tokens=(positions * 10, positions * 10), weights=(0.5, 0.5)
        )
        tracemalloc.start()
        r = check_sharding(plan, ShardingConfig(hosts=64, global_batch_size=512, brute_force_limit=0))
        _, p = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        # one epoch, in whole global batches: the last batch runs into the next epoch
        assert r.passed and r.figures["positions"] == -(-positions // 512) * 512
        return p

    small, large = peak(10**6), peak(2 * 10**7)  # both past one block of batches; 20× the epoch
    assert large < 1.2 * small + (64 << 10), (small, large)


def test_a_host_rereading_its_own_rows_is_told_apart_from_hosts_sharing_rows():
    i64 = lambda *x: np.array(x, dtype=np.int64)
    # the replayed Grain bug: each host reads its own rows twice, hosts never meet
    shared, own = repeated_positions(i64(0, 0, 1, 1, 34, 34, 35, 35), i64(0, 0, 0, 0, 1, 1, 1, 1))
    assert shared.tolist() == [] and own == [(0, 0, 2, 2), (1, 34, 2, 2)]
    # a log copied between hosts: every position read once by each of two hosts, no host repeats itself
    shared, own = repeated_positions(i64(0, 1, 2, 3, 0, 1, 2, 3), i64(0, 0, 0, 0, 2, 2, 2, 2))
    assert shared.tolist() == [0, 1, 2, 3] and own == []
    # both at once: host 0 reads 5 three times, host 1 reads 5 too
    shared, own = repeated_positions(i64(5, 5, 5, 6, 5), i64(0, 0, 0, 0, 1))
    assert shared.tolist() == [5] and own == [(0, 5, 3, 1)]
    # a correct step: neither
    shared, own = repeated_positions(i64(0, 1, 2, 3), i64(0, 0, 1, 1))
    assert shared.tolist() == [] and own == []


def test_steps_n_costs_what_n_costs_not_the_plan_size():
    """`--steps 10` on a stage-1-sized plan (7.24·10⁸ positions) brute-forces its 5,120 positions
    in small memory: only their slots are computed and kept, never an array over the plan."""
    web, code = 434_400_000, 144_800_000  # web read once, code twice: 7.24e8 slots per epoch
    plan = make_plan(
        [SourceSpec("web", 0, web, web * 100, 3.0, 1.0), SourceSpec("code", 1, code, code * 100, 2.0, 2.0)],
        ["fp"],
        "train",
    )
    assert plan.size == 724_000_000
    tracemalloc.start()
    r = check_sharding(plan, ShardingConfig(hosts=8, global_batch_size=512, seed=3, steps=10))
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert r.passed, r.failures
    assert r.figures["brute_force"]["positions"] == 10 * 512 and r.figures["brute_force"]["shared_slots"] == 0
    assert peak < 8 * 2**20, f"{peak / 2**20:.1f} MiB traced for 5,120 positions"


def test_steps_past_int64_positions_are_refused_and_huge_ones_take_no_longer():
    """--steps 10**20 (S·G past int64) is refused in one line; --steps 10**12 (positions still
    int64) is proved in the time of a small S: tiling is checked on the first and last block (a
    step's slices are step 0's shifted), the epochs straddled counted in closed form. Before: a
    loop over every step (and every epoch) that did not end."""
    import time

    from audit.sharding import StepsRefused, straddling

    with pytest.raises(StepsRefused, match=r"--steps 100000000000000000000 × global batch 8 = .* past the int64"):
        check_sharding(small_plan(), ShardingConfig(hosts=4, global_batch_size=8, steps=10**20, brute_force_limit=0))
    t0 = time.monotonic()
    r = check_sharding(small_plan(), ShardingConfig(hosts=4, global_batch_size=8, steps=10**12, brute_force_limit=0))
    assert r.passed is True and r.figures["steps"] == 10**12 and time.monotonic() - t0 < 10
    for positions, per_epoch, g in [(8 * 37, 286, 8), (1000, 7, 4), (64, 16, 8), (1, 5, 2), (10**6, 300, 12)]:
        want = sum(1 for k in range(1, (positions - 1) // per_epoch + 1) if (k * per_epoch) % g)
        assert straddling(positions, per_epoch, g) == want
