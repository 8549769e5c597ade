"""The double-sharding replay of the lessons experiment: it is the case study's bug (hosts re-read
rows, data repeats early), the start-up guard refuses it unless its UNSAFE switch is set, and
even with the switch the audit fails the run naming the first step and the hosts."""

import json
import logging
import os
from collections import Counter

import numpy as np
import pytest

from audit.runlog import RunConfig, check_run
from contract.rundir import RunDir
from dataloader import LoaderConfig, guard, make_loader
from dataloader.double_sharding import DoubleShardingReplay
from dataloader.loader import HostSliceSampler, load_plan
from dataloader.plan import plan_from_manifests
from tests.audit import audit_fixtures as fx

G, H = 8, 2


def test_replay_reads_fewer_distinct_examples_each_several_times(manifest_path):
    _, plan = load_plan(LoaderConfig(data=[manifest_path], global_batch_size=G))
    n = plan.size
    replay = DoubleShardingReplay(G, H, n)
    epoch_steps = n // G
    reads = Counter(np.concatenate([replay.positions(s) for s in range(epoch_steps)]).tolist())
    correct = Counter(np.concatenate([HostSliceSampler(G, 0, 1).positions(s) for s in range(epoch_steps)]).tolist())
    assert set(correct.values()) == {1} and len(correct) == epoch_steps * G
    assert set(reads.values()) == {H}  # every position read H times within one epoch's steps…
    assert len(reads) == epoch_steps * G // H  # …so only 1/H of them are ever read
    first = replay.positions(0)
    assert len(first) == G and len(set(first.tolist())) == G // H  # rows repeat inside a step


def test_guard_refuses_the_replay_unless_its_switch_is_set(manifest_path, caplog):
    cfg = LoaderConfig(data=[manifest_path], global_batch_size=G)
    _, plan = load_plan(cfg)
    replay = DoubleShardingReplay(G, H, plan.size)
    with pytest.raises(guard.GuardError, match="more than once"):
        make_loader(cfg, 0, 1, sampler=replay)
    with (
        caplog.at_level(logging.ERROR, logger="dataloader.loader"),
        make_loader(cfg, 0, 1, sampler=replay, unsafe_double_sharding_experiment=True) as it,
    ):
        batch = next(it)
    assert "UNSAFE DOUBLE-SHARDING EXPERIMENT" in caplog.text and "more than once" in caplog.text
    assert batch["index"].tolist() == replay.positions(0).tolist()
    # The switch overrides the guard for the replay only, never for another sampler.
    with pytest.raises(ValueError, match="DoubleShardingReplay"):
        make_loader(cfg, 0, 1, sampler=HostSliceSampler(G, 0, 1), unsafe_double_sharding_experiment=True)


def write_replayed_logs(run_dir: str, manifest: str, steps: int) -> None:
    """The data logs the trainer writes with UNSAFE_double_sharding_experiment_hosts=H."""
    from dataloader import order

    plan = plan_from_manifests([json.load(open(manifest))], "train")
    replay = DoubleShardingReplay(G, H, plan.size)
    os.makedirs(os.path.join(run_dir, "data_log"))
    files = [open(os.path.join(run_dir, "data_log", f"host-{h:05d}-of-{H:05d}.jsonl"), "w") for h in range(H)]
    for step in range(steps):
        idx = replay.positions(step)
        ex = plan.example_ids(*plan.locate(order.train_slots(idx, plan.size, 0)))
        for f, i, e in zip(files, replay.split(idx), replay.split(ex)):
            f.write(json.dumps({"step": step, "index": i.tolist(), "example": e.tolist()}) + "\n")
    for f in files:
        f.close()


def test_audit_fails_a_replayed_run_naming_the_first_step_and_hosts(tmp_path):
    manifest = fx.write_sample(str(tmp_path / "data"))
    write_replayed_logs(str(tmp_path / "run"), manifest, steps=6)
    plan = plan_from_manifests([json.load(open(manifest))], "train")
    result = check_run(RunDir(tmp_path / "run"), plan, RunConfig(global_batch_size=G, seed=0)).result
    assert result.passed is False
    # each simulated host re-reads rows of its own slice; no two hosts read one position: said as such
    replay = DoubleShardingReplay(G, H, plan.size)
    first = replay.split(replay.positions(0))  # host 0's and host 1's positions at step 0
    assert not set(first[0].tolist()) & set(first[1].tolist())
    p0 = int(first[0][0])
    assert result.figures["first_double_sharding"] == {
        "step": 0,
        "hosts": [0, 1],
        "what": f"each re-read positions of their own (host 0 read position {p0} twice in step 0)",
    }
    assert result.summary.startswith(
        f"double sharding: from step 0, hosts [0, 1] each re-read positions of their own "
        f"(host 0 read position {p0} twice in step 0)"
    )
    assert "read the same" not in result.summary and not any("read the same" in f for f in result.failures)
    assert (
        f"host 1 read position {int(first[1][0])} twice in step 0 ({G // H // H} of its positions read more than once): "
        "double sharding" in result.failures
    )
