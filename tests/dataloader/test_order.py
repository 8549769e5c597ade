"""Global order: Grain's index_shuffle per epoch, never materialised."""

import grain
import numpy as np
import pytest

from dataloader import order


@pytest.mark.parametrize("n,seed", [(1, 0), (7, 3), (241, 0), (1000, 2**32 - 1)])
def test_order_is_grains_mapdataset_shuffle(n, seed):
    ds = grain.MapDataset.range(n).shuffle(seed=seed)
    positions = np.arange(3 * n + 5)
    assert order.train_slots(positions, n, seed).tolist() == [ds[int(p)] for p in positions]


def test_each_epoch_is_a_permutation_and_epochs_differ():
    n = 500
    epochs = [order.train_slots(np.arange(e * n, (e + 1) * n), n, seed=11) for e in range(3)]
    for e in epochs:
        assert sorted(e.tolist()) == list(range(n))
    assert epochs[0].tolist() != epochs[1].tolist() != epochs[2].tolist()
    assert order.train_slots(np.arange(n), n, seed=12).tolist() != epochs[0].tolist()


def test_seek_far_ahead_is_pure():
    """A position far ahead gives Grain's own answer for it, whatever was asked before or with it."""
    n, seed = 997, 5
    far = [10**12, 10**12 + 1, 10**12 + n]
    expected = [grain.MapDataset.range(n).shuffle(seed=seed)[p] for p in far]
    assert expected[:2] == [603, 250]  # the golden values (test_golden)
    order.train_slots(np.arange(50), n, seed + 1)  # unrelated work in between changes nothing
    assert order.train_slots(np.array(far), n, seed).tolist() == expected
    assert [order.train_slots(np.array([p]), n, seed)[0] for p in reversed(far)] == expected[::-1]
    # Epoch e = p // n uses seed + e: a seek that ignored the epoch would read epoch 0's slot.
    assert expected[0] != order.train_slots(np.array([10**12 % n]), n, seed)[0]


def test_heldout_is_identity_then_minus_one():
    assert order.heldout_slots(np.arange(8), 5).tolist() == [0, 1, 2, 3, 4, -1, -1, -1]
    assert order.num_heldout_steps(5, 4) == 2 and order.num_heldout_steps(8, 4) == 2


def test_bad_seed_is_rejected():
    with pytest.raises(ValueError, match="seed"):
        order.train_slots(np.arange(3), 3, seed=2**32)
