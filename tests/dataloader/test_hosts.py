"""Disjoint host sharding: slices never overlap and together are the H = 1 batch."""

import numpy as np
import pytest

from dataloader import LoaderConfig, hosts, make_loader

G = 840  # divisible by every H in 1..8


def test_host_positions_tile_each_global_batch():
    for H in range(1, 9):
        for step in (0, 1, 12345):
            parts = [hosts.host_positions(step, G, h, H) for h in range(H)]
            assert np.concatenate(parts).tolist() == list(range(step * G, (step + 1) * G))


def test_hosts_never_share_an_example(manifest_path):
    steps = 3  # the plan has 241 slots: every batch of 840 crosses epoch boundaries
    cfg = LoaderConfig(data=[manifest_path], global_batch_size=G, seed=7, prefetch=0)
    reference = make_loader(cfg, 0, 1)
    assert reference.plan.size < G
    ref = [next(reference) for _ in range(steps)]
    for H in range(2, 9):
        its = [make_loader(cfg, h, H) for h in range(H)]
        for s in range(steps):
            parts = [next(it) for it in its]
            index = np.concatenate([p["index"] for p in parts])
            assert len(set(index.tolist())) == G  # no position read by two hosts
            for key in ref[s]:  # union, in host order, is the H = 1 batch
                assert np.array_equal(np.concatenate([p[key] for p in parts]), ref[s][key]), (H, s, key)
        for it in its:
            it.close()


def test_host_count_must_divide_global_batch(manifest_path):
    with pytest.raises(ValueError, match="does not divide"):
        make_loader(LoaderConfig(data=[manifest_path], global_batch_size=8), 0, 3)
    with pytest.raises(ValueError, match="not in"):
        make_loader(LoaderConfig(data=[manifest_path], global_batch_size=8), 4, 4)
