"""The start-up memory check counts the loader's open shard readers (each holds its shard's index)."""
from __future__ import annotations

from dataloader import LoaderConfig
from tests.dataloader.test_shard_readers import stage1_shaped_manifest
from trainer import preflight


def test_the_start_up_memory_check_counts_the_shard_readers():
    m = stage1_shaped_manifest()
    every = LoaderConfig(data=["m"], global_batch_size=512, max_open_shards=None)
    parts = {**preflight.batch_host_bytes(512, 64, 16, every, evaluates=False, on_cpu=False),
             **preflight.reader_parts(every, [m], None, evaluates=False)}
    assert parts["training shard readers"] > 10**8 * 8 and parts["held-out shard readers"] == 0
    problem = preflight.memory_problem(parts, 2**29, 512, 64, 16)  # the batches alone fit in 0.5 GiB
    assert problem and "cannot fit this host's memory" in problem and "training shard readers 0.9" in problem
    bounded = LoaderConfig(data=["m"], global_batch_size=512)
    parts.update(preflight.reader_parts(bounded, [m], None, evaluates=False))
    assert preflight.memory_problem(parts, 2**29, 512, 64, 16) is None
