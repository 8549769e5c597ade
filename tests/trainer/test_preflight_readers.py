"""The start-up memory check counts the loader's open shard readers (each holds its shard's index)."""

from __future__ import annotations

from dataloader import LoaderConfig
from tests.dataloader.test_shard_readers import stage1_shaped_manifest
from trainer import preflight


def test_the_start_up_memory_check_counts_the_shard_readers():
    m = stage1_shaped_manifest()
    every = LoaderConfig(data=["m"], global_batch_size=512, max_open_shards=None)
    parts = {
        **preflight.batch_host_bytes(512, 64, 16, every, evaluates=False, on_cpu=False),
        **preflight.reader_parts(every, [m], None, evaluates=False),
    }
    assert parts["training shard readers"] > 10**8 * 8 and parts["held-out shard readers"] == 0
    problem = preflight.memory_problem(parts, 2**29, 512, 64, 16)  # the batches alone fit in 0.5 GiB
    assert problem and "cannot fit this host's memory" in problem and "training shard readers 0.9" in problem
    bounded = LoaderConfig(data=["m"], global_batch_size=512)
    parts.update(preflight.reader_parts(bounded, [m], None, evaluates=False))
    assert preflight.memory_problem(parts, 2**29, 512, 64, 16) is None


def test_the_held_out_sets_readers_are_counted_when_the_run_evaluates(tmp_path):
    import numpy as np

    from contract import Manifest
    from tests.dataloader.conftest import two_sources, write_dataset

    m = Manifest.load(write_dataset(str(tmp_path), two_sources(np.random.default_rng(3))))
    cfg = LoaderConfig(data=[m.path], global_batch_size=8)
    held = {
        name: sum(int(s["records"]) for s in m.source(name)["splits"]["heldout"]["shards"] if s["records"])
        for name in m.source_names
    }
    shards = {
        name: sum(1 for s in m.source(name)["splits"]["heldout"]["shards"] if s["records"]) for name in m.source_names
    }
    per = {n: 8 * held[n] + 4096 * shards[n] for n in held}
    assert preflight.reader_parts(cfg, [m], None, evaluates=True)["held-out shard readers"] == sum(per.values())
    assert preflight.reader_parts(cfg, [m], ["code"], evaluates=True)["held-out shard readers"] == per["code"]
    assert preflight.reader_parts(cfg, [m], ["code"], evaluates=False)["held-out shard readers"] == 0
