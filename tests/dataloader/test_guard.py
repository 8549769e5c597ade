"""The start-up guard, and the double-sharding regression it exists to stop."""

import dataclasses

import grain
import numpy as np
import pytest

from dataloader import HostSliceSampler, LoaderConfig, guard, hosts, make_loader

G, H, STEPS = 16, 4, 3


@dataclasses.dataclass
class DoubleShardedSampler:
    """The bug: the stream is already sharded per host by Grain's ShardOptions (an
    IndexSampler with ShardByJaxProcess-style options), and the loader then slices that
    host's stream *again* by host. Each host ends up reading its own shard's records
    H times over and most of the global batch is read by nobody."""

    process_index: int
    process_count: int
    num_records: int = 10_000

    def __post_init__(self):
        self._sampler = grain.samplers.IndexSampler(
            num_records=self.num_records,
            shuffle=False,
            num_epochs=None,
            shard_options=grain.sharding.ShardOptions(self.process_index, self.process_count),
        )

    def positions(self, step):
        sliced = hosts.host_positions(step, G, self.process_index, self.process_count)
        return np.array([self._sampler[int(p)].record_key for p in sliced], dtype=np.int64)


def gathered(samplers):
    parts = [guard.local_positions(s.positions, 0, STEPS, G // H + 1) for s in samplers]
    return np.stack([p for p, _ in parts]), np.stack([c for _, c in parts])


def test_correct_host_slices_pass_the_guard():
    positions, counts = gathered([HostSliceSampler(G, h, H) for h in range(H)])
    assert guard.find_violations(positions, counts, G, 0) == []


def test_double_sharding_is_rejected_naming_the_hosts():
    positions, counts = gathered([DoubleShardedSampler(h, H) for h in range(H)])
    problems = guard.find_violations(positions, counts, G, 0)
    text = "\n".join(problems)
    assert "host 0 reads positions" in text and "more than once" in text
    assert "outside the global batch" in text  # host 1 reads its Grain shard's records
    assert "read by no host" in text


def test_overlapping_hosts_are_named():
    class Overlap:
        def __init__(self, h):
            self.h = h

        def positions(self, step):  # hosts 1 and 2 both read host 1's slice
            return hosts.host_positions(step, G, min(self.h, 1) if self.h < 3 else 3, H)

    positions, counts = gathered([Overlap(h) for h in range(H)])
    text = "\n".join(guard.find_violations(positions, counts, G, 0))
    assert "hosts 1 and 2 both read positions" in text
    assert "read by no host" in text


def test_make_loader_runs_the_guard(manifest_path):
    cfg = LoaderConfig(data=[manifest_path], global_batch_size=G)
    # A single process simulating host 1 of 4 can only check its own part — which the
    # double-sharded sampler already fails (repeats, positions outside the batch).
    with pytest.raises(guard.GuardError, match="host 1 of 4"):
        make_loader(cfg, 1, H, sampler=DoubleShardedSampler(1, H))
    with pytest.raises(guard.GuardError, match="read by no host"):
        make_loader(cfg, 0, 1, sampler=DoubleShardedSampler(0, 2))
    make_loader(cfg, 1, H)  # the real sampler passes
