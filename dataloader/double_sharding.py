"""THE DOUBLE-SHARDING BUG, replayed on purpose — for the `make lessons` experiment only.

Never use this to train. It reproduces the case study's Grain bug so that its effect on the
losses can be measured and the checks shown to catch it: every host's stream is sharded by
Grain's `ShardOptions` (an `IndexSampler` with shard h of H) *and* the loader then takes host
h's slice of each global batch from that already-sharded stream. Grain maps index i of shard h
to record `start_h + i // H` (it expects host h to ask for i ≡ h mod H), so a contiguous host
slice reads each of its records H times in a row, hosts stay inside their 1/H of the epoch and
half of it is never read: every step holds G/H distinct examples, each example read H times per
epoch, while the correct loader reads G distinct examples per step, each once per epoch.

One process replays all H hosts (`DoubleShardingReplay.positions` is the concatenation of the H
simulated hosts' positions, in host order); the trainer writes one data log per simulated host,
as H real hosts would, so the audit sees exactly what a real H-host run would have logged.
make_loader's start-up guard refuses this sampler unless its explicitly named switch is set
(`unsafe_double_sharding_experiment=True`, from the trainer's
`UNSAFE_double_sharding_experiment_hosts`), and even then the audit fails the run.
"""

from __future__ import annotations

import dataclasses

import grain
import numpy as np

from dataloader import hosts


@dataclasses.dataclass
class DoubleShardingReplay:
    """Sampler of the bug for `simulated_hosts` hosts in one process.

    global_batch_size: G; simulated_hosts: H ≥ 2 (divides G); num_records: the plan's size N
    (one epoch of positions, what the buggy IndexSampler was sized with).
    """

    global_batch_size: int
    simulated_hosts: int
    num_records: int

    def __post_init__(self) -> None:
        if self.simulated_hosts < 2:
            raise ValueError("the double-sharding replay needs ≥ 2 simulated hosts")
        hosts.check_topology(self.global_batch_size, 0, self.simulated_hosts)
        self._samplers = [
            grain.samplers.IndexSampler(
                num_records=self.num_records,
                shuffle=False,
                num_epochs=None,
                shard_options=grain.sharding.ShardOptions(h, self.simulated_hosts),
            )
            for h in range(self.simulated_hosts)
        ]

    def host_positions(self, step: int, h: int) -> np.ndarray:
        """Simulated host h's positions int64 [G/H]: its correct slice, mapped through its Grain shard."""
        sliced = hosts.host_positions(step, self.global_batch_size, h, self.simulated_hosts)
        return np.array([self._samplers[h][int(p)].record_key for p in sliced], dtype=np.int64)

    def positions(self, step: int) -> np.ndarray:
        """All simulated hosts' positions int64 [G], in host order."""
        return np.concatenate([self.host_positions(step, h) for h in range(self.simulated_hosts)])

    def split(self, values: np.ndarray) -> list[np.ndarray]:
        """A [G] batch field → the H simulated hosts' [G/H] parts (what each host would log)."""
        return np.split(np.asarray(values), self.simulated_hosts)

    # the loader's Sampler: one process logs every simulated host, as H real hosts would
    def logged_hosts(self) -> tuple[list[int], int]:
        return list(range(self.simulated_hosts)), self.simulated_hosts

    def host_parts(self, values: np.ndarray) -> list[np.ndarray]:
        return self.split(values)


def experiment_sampler(simulated_hosts: int, global_batch_size: int, num_records: int) -> DoubleShardingReplay | None:
    """The bug's sampler when the experiment's UNSAFE switch names ≥ 2 simulated hosts, else None
    (always, for training). Its run is wrong on purpose and its audit fails."""
    if not simulated_hosts:
        return None
    return DoubleShardingReplay(global_batch_size, simulated_hosts, num_records)
