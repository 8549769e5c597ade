"""A real 2-process run on loopback: jax.distributed + CPU gloo collectives."""

import numpy as np

from dataloader import LoaderConfig, make_loader
from dataloader.plan import RECORD_BITS
from tests.processes import outputs_ok, workers


def test_two_processes_guard_passes_and_gathered_batches_equal_single_process(manifest_path, tmp_path):
    with workers("tests.dataloader.multiprocess_worker", manifest_path, str(tmp_path)) as procs:
        outputs_ok(procs)

    single = make_loader(LoaderConfig(data=[manifest_path], global_batch_size=16, seed=21), 0, 1, start_step=2)
    ref = [next(single) for _ in range(3)]
    results = [np.load(tmp_path / f"result-{i}.npz") for i in range(2)]
    for r in results:  # both processes gathered the same thing: the single-process batches
        g_tokens, g_index = r["g_tokens"], r["g_index"]
        assert g_tokens.shape == (2, 3, 8, ref[0]["tokens"].shape[1])
        for s in range(3):
            assert np.array_equal(np.concatenate(list(g_tokens[:, s])), ref[s]["tokens"])
            assert np.concatenate(list(g_index[:, s])).tolist() == ref[s]["index"].tolist()
    for s in range(3):
        example = np.concatenate([results[0]["example"][s], results[1]["example"][s]])
        assert np.array_equal(example, ref[s]["example"])
    assert set((ref[0]["example"] >> RECORD_BITS).tolist()) <= {0, 1}
    for r in results:  # the double-sharded sampler was rejected on both hosts, hosts named
        caught = str(r["caught"])
        assert "start-up guard failed" in caught and "read by no host" in caught
        assert "host 0 reads positions" in caught and "host 1 reads positions" in caught
