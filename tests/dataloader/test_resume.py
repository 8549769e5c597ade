"""Exact resume in a fresh iterator (O(1) seek), elastic across host counts, orbax state."""

import numpy as np
import orbax.checkpoint as ocp
import pytest

from dataloader import LoaderConfig, checkpoint, make_loader

G = 8
KEYS = ("tokens", "segment_ids", "positions", "loss_mask", "index", "example")


def cfg_for(path, **kw):
    return LoaderConfig(data=[path], global_batch_size=G, seed=3, **kw)


def take(it, n):
    return [next(it) for _ in range(n)]


def global_batches(cfg, H, start, n):
    """n global batches from `start`, assembled from H fresh host iterators."""
    its = [make_loader(cfg, h, H, start_step=start) for h in range(H)]
    out = []
    for _ in range(n):
        parts = [next(it) for it in its]
        out.append({k: np.concatenate([p[k] for p in parts]) for k in KEYS})
    states = [it.state() for it in its]
    for it in its:
        it.close()
    assert all(s == states[0] for s in states)
    return out, states[0]


def assert_same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for k in KEYS:
            assert np.array_equal(x[k], y[k]), k


@pytest.mark.parametrize("k", [0, 1, 5, 31])  # 31 × 8 > 241 slots: past an epoch boundary
def test_resume_in_fresh_iterator_equals_unbroken_stream(manifest_path, k):
    unbroken = take(make_loader(cfg_for(manifest_path, prefetch=4, read_threads=3), 0, 1), k + 4)
    first = make_loader(cfg_for(manifest_path, prefetch=2), 0, 1)
    assert_same(take(first, k), unbroken[:k])
    state = first.state()  # taken while batches beyond k are already prefetched
    assert state["step"] == k
    first.close()
    fresh = make_loader(
        cfg_for(manifest_path, prefetch=0), 0, 1, start_step=checkpoint.check_state(cfg_for(manifest_path), state)
    )
    assert_same(take(fresh, 4), unbroken[k:])


def test_elastic_resume_2_to_4_to_1_hosts(manifest_path):
    cfg = cfg_for(manifest_path, prefetch=1)
    reference, _ = global_batches(cfg, 1, 0, 12)
    a, state = global_batches(cfg, 2, 0, 4)
    b, state = global_batches(cfg, 4, checkpoint.check_state(cfg, state), 5)
    c, state = global_batches(cfg, 1, checkpoint.check_state(cfg, state), 3)
    assert state["step"] == 12
    assert_same(a + b + c, reference)


def test_orbax_round_trip_of_the_data_item(manifest_path, tmp_path):
    cfg = cfg_for(manifest_path)
    it = make_loader(cfg, 0, 1)
    take(it, 3)
    with ocp.CheckpointManager(tmp_path / "ckpt") as mngr:
        mngr.save(3, args=ocp.args.Composite(**{checkpoint.ITEM_NAME: checkpoint.save_args(it)}))
        mngr.wait_until_finished()
        restored = mngr.restore(3, args=ocp.args.Composite(**{checkpoint.ITEM_NAME: checkpoint.restore_args()}))[
            checkpoint.ITEM_NAME
        ]
    assert restored == it.state() == {"fingerprint": it.fingerprint, "seed": 3, "global_batch_size": G, "step": 3}
    resumed = make_loader(cfg, 0, 1, start_step=checkpoint.check_state(cfg, restored))
    assert_same(take(resumed, 2), take(it, 2))


def test_state_mismatch_is_a_clear_error_unless_overridden(manifest_path):
    cfg = cfg_for(manifest_path)
    state = make_loader(cfg, 0, 1, start_step=6).state()
    assert checkpoint.check_state(cfg, state) == 6
    cases = {
        "seed": LoaderConfig(data=[manifest_path], global_batch_size=G, seed=4),
        "global_batch_size": LoaderConfig(data=[manifest_path], global_batch_size=16, seed=3),
        "fingerprint": cfg_for(manifest_path, weights={"web": 0.6, "code": 0.4}),
    }
    for field, other in cases.items():
        with pytest.raises(checkpoint.StateMismatchError, match=f"{field}: checkpoint has"):
            checkpoint.check_state(other, state)
        assert checkpoint.check_state(other, state, allow_mismatch=True) == 6
    with pytest.raises(checkpoint.StateMismatchError, match="lacks"):
        checkpoint.check_state(cfg, {"step": 1})


def test_state_mismatch_error_carries_its_differences_apart_from_the_hint(manifest_path):
    """Callers with their own override (the trainer) compose their message from the fields."""
    state = make_loader(cfg_for(manifest_path), 0, 1, start_step=6).state()
    other = LoaderConfig(data=[manifest_path], global_batch_size=16, seed=4)
    with pytest.raises(checkpoint.StateMismatchError) as e:
        checkpoint.check_state(other, state)
    assert e.value.differences == (
        "seed: checkpoint has 3, config gives 4",
        f"global_batch_size: checkpoint has {G}, config gives 16",
    )
    assert e.value.waivable and e.value.hint == "pass allow_mismatch=True to resume anyway"
    assert not any("allow_mismatch" in d for d in (e.value.problem, *e.value.differences))
    for malformed in ({"step": 1}, {**state, "step": -1}):
        with pytest.raises(checkpoint.StateMismatchError) as e:
            checkpoint.check_state(other, malformed, allow_mismatch=True)  # no flag waives these
        assert e.value.differences == () and e.value.hint is None and not e.value.waivable


def test_seek_far_ahead_reads_only_that_step(manifest_path):
    """Starting at step 10**9 is immediate: no replay (timings: bench/loader.py)."""
    it = make_loader(cfg_for(manifest_path, prefetch=0), 0, 1, start_step=10**9)
    b = next(it)
    assert b["index"].tolist() == list(range(10**9 * G, 10**9 * G + G))
    assert it.state()["step"] == 10**9 + 1
