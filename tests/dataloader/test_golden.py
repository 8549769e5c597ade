"""Exact resume must not depend on a library upgrade: the values that define the data stream are
pinned here (computed once with grain 0.2.18; they are the contract, not a measurement), the plan
fingerprint names the order and plan rule with their versions, and the loader refuses to start
or resume when the code no longer computes them."""

from __future__ import annotations

import grain.experimental
import numpy as np
import pytest

from dataloader import LoaderConfig, checkpoint, golden, hosts, make_loader, order, plan
from dataloader.plan import SourceSpec, epoch_counts, make_plan

INF = float("inf")

# grain.index_shuffle v1: (N, seed) → {position: slot}. Epoch boundaries, seeks far ahead and the
# per-epoch seed wrapping past 2**32 - 1 are all in here.
TRAIN_ORDER_V1 = {
    (1, 0): {0: 0, 1: 0, 5: 0},
    (2, 0): {0: 0, 1: 1, 2: 1, 3: 0, 4: 0, 5: 1},
    (7, 3): dict(enumerate([4, 6, 0, 1, 2, 5, 3, 6, 0, 4, 3, 2, 1, 5, 4, 0, 5, 3, 1, 6, 2])),
    (997, 5): {0: 544, 1: 964, 2: 142, 996: 910, 997: 782, 998: 216, 10**12: 603, 10**12 + 1: 250},
    (1_000_003, 2**32 - 1): {
        0: 646826,
        1: 806307,
        999_999: 413539,
        1_000_002: 421179,
        1_000_003: 645888,
        1_000_004: 526917,
        123_456_789_012: 35909,
    },
    (724_000_000, 42): {
        0: 439108928,
        1: 41929611,
        2: 603402154,
        3: 370541116,
        723_999_999: 552837252,
        724_000_000: 607017676,
        5_000_000_000: 218783048,
    },
}


@pytest.fixture(autouse=True)
def fresh_self_check():
    golden.check_stream.cache_clear()  # the check is cached per process; tests change the code under it
    yield
    golden.check_stream.cache_clear()


@pytest.mark.parametrize("n, seed", sorted(TRAIN_ORDER_V1))
def test_training_order_positions_to_slots_are_pinned(n, seed):
    positions = sorted(TRAIN_ORDER_V1[(n, seed)])
    got = order.train_slots(np.array(positions), n, seed).tolist()
    assert got == [TRAIN_ORDER_V1[(n, seed)][p] for p in positions]
    assert order.slots(order.TRAIN_ORDER, np.array(positions), n, seed).tolist() == got


def test_heldout_order_is_pinned():
    assert order.slots(order.HELDOUT_ORDER, np.arange(7), 5, seed=9).tolist() == [0, 1, 2, 3, 4, -1, -1]


def test_plan_rounding_is_pinned():
    """Counts: web read once, code 1.75×, math 23.29× rounded up by the largest remainder, off 0;
    ties of the largest-remainder rule go to the earlier source."""
    assert epoch_counts(golden.PLAN_SOURCES) == (1000, 525, 163, 0)
    ties = [SourceSpec("a", 0, 3, 3, 1.0, INF), SourceSpec("b", 1, 3, 2, 1.0, INF), SourceSpec("c", 2, 3, 2, 1.0, INF)]
    assert epoch_counts(ties) == (3, 5, 4)  # exact 3, 4.5, 4.5: total 12 by half-up, b wins the tie
    scaled = [SourceSpec(s.name, s.ordinal, s.records, s.tokens, s.weight * 7, s.max_repetition) for s in ties]
    assert epoch_counts(scaled) == (3, 5, 4)


def test_plan_slot_to_record_is_pinned():
    """Whole passes read records in order; a partial pass (code: 225 of 300, math: 2 of 7) spreads."""
    p = make_plan(golden.PLAN_SOURCES, ["golden"])
    assert p.offsets.tolist() == [0, 1000, 1525, 1688, 1688]
    slots = np.array([0, 999, 1000, 1299, 1300, 1301, 1302, 1524, 1525, 1531, 1532, 1686, 1687])
    src, rec = p.locate(slots)
    assert src.tolist() == [0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2]
    assert rec.tolist() == [0, 999, 0, 299, 0, 1, 2, 298, 0, 6, 0, 0, 3]
    assert p.example_ids(src[:3], rec[:3]).tolist() == [0, 999, 1 << 40]


def test_host_slices_are_pinned():
    assert hosts.host_positions(5, 12, 2, 3).tolist() == [68, 69, 70, 71]
    assert hosts.host_positions(7, 6, 0, 2).tolist() == [42, 43, 44]


def test_self_check_golden_values_are_a_subset_of_the_pinned_ones():
    for n, seed, positions, slots in golden.ORDER_GOLDEN[order.TRAIN_ORDER]:
        assert [TRAIN_ORDER_V1[(n, seed)][p] for p in positions] == list(slots)
    assert golden.stream_differences(order.TRAIN_ORDER) == []
    assert golden.stream_differences(order.HELDOUT_ORDER) == []


def test_plan_fingerprint_names_the_order_and_the_plan_rule():
    train = make_plan(golden.PLAN_SOURCES, ["d"], "train")
    assert train.order == order.TRAIN_ORDER == order.Order("grain.index_shuffle", 1)
    assert make_plan(golden.PLAN_SOURCES, ["d"], "heldout").order == order.HELDOUT_ORDER
    v2 = make_plan(golden.PLAN_SOURCES, ["d"], "train", order=order.Order("grain.index_shuffle", 2))
    assert v2.counts == train.counts and v2.fingerprint != train.fingerprint
    assert make_plan(golden.PLAN_SOURCES, ["d"], "train").fingerprint == train.fingerprint


def _changed_index_shuffle(index, max_index, seed, rounds):
    """What a Grain release with another permutation would compute."""
    return max_index - index


def test_a_changed_order_is_refused_at_start_and_on_resume(manifest_path, monkeypatch):
    cfg = LoaderConfig(data=[manifest_path], global_batch_size=8, seed=3)
    state = make_loader(cfg, 0, 1, start_step=4).state()
    golden.check_stream.cache_clear()
    monkeypatch.setattr(grain.experimental, "index_shuffle", _changed_index_shuffle)  # a Grain upgrade
    diffs = golden.stream_differences(order.TRAIN_ORDER)
    assert len(diffs) == len(golden.ORDER_GOLDEN[order.TRAIN_ORDER])
    assert "order {'name': 'grain.index_shuffle', 'version': 1} (grain " in diffs[0]
    assert "N=997, seed=5, positions [0, 1, 996, 997, 1000000000000] give slots [996, 995, 0, 996, " in diffs[0]
    with pytest.raises(golden.StreamChangedError, match="expected \\[544, 964, 910, 782, 603\\]"):
        checkpoint.check_state(cfg, state)
    with pytest.raises(golden.StreamChangedError, match="grain.index_shuffle"):
        make_loader(cfg, 0, 1, start_step=state["step"])
    # The held-out stream does not use the shuffle: it still starts.
    make_loader(LoaderConfig(data=[manifest_path], global_batch_size=8, split="heldout"), 0, 1).close()


def test_a_changed_plan_rule_or_host_slice_is_refused(monkeypatch):
    real_counts = plan.epoch_counts
    monkeypatch.setattr(plan, "epoch_counts", lambda sources: tuple(c + 1 for c in real_counts(sources)))
    with pytest.raises(golden.StreamChangedError, match=r"golden mixture counts \[1001, 526, 164, 1\]"):
        golden.check_stream(order.TRAIN_ORDER)
    monkeypatch.setattr(plan, "epoch_counts", real_counts)
    real_positions = hosts.host_positions
    monkeypatch.setattr(hosts, "host_positions", lambda s, g, h, n: real_positions(s, g, n - 1 - h, n))
    with pytest.raises(golden.StreamChangedError, match=r"host slice \(step, G, h, H\)=\(5, 12, 2, 3\)"):
        golden.check_stream(order.TRAIN_ORDER)


def test_an_order_without_golden_values_is_refused():
    with pytest.raises(golden.StreamChangedError, match="has no golden values"):
        golden.check_stream(order.Order("grain.index_shuffle", 2))


def test_a_changed_olmo_core_shuffle_is_refused(monkeypatch):
    """AI2's order rests on numpy's PCG64 shuffle: a numpy release that changed it is caught too."""
    from contract import OLMO_CORE
    from dataloader import olmo_order

    assert golden.stream_differences(OLMO_CORE) == []
    real = olmo_order.permutation
    monkeypatch.setattr(olmo_order, "permutation", lambda n, seed, epoch: real(n, seed + 1, epoch))
    diffs = golden.stream_differences(OLMO_CORE)
    assert len(diffs) == len(golden.OLMO_GOLDEN) and "olmo-core" in diffs[0], diffs
