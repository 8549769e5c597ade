"""One JAX process of the 2-process loopback test (run by test_multiprocess.py).

argv: port process_id manifest_path out_dir. Writes out_dir/result-<id>.npz and prints
"OK" when done; any failure is a non-zero exit with the traceback on stderr.
"""

import os
import sys

import jax
import numpy as np


def main(port: str, pid: str, manifest_path: str, out_dir: str) -> None:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(pid), initialization_timeout=60
    )
    from jax.experimental import multihost_utils

    from dataloader import LoaderConfig, guard, make_loader
    from tests.dataloader.test_guard import DoubleShardedSampler

    assert jax.process_count() == 2 and jax.process_index() == int(pid)
    cfg = LoaderConfig(data=[manifest_path], global_batch_size=16, seed=21)
    it = make_loader(cfg, start_step=2)  # process index/count from jax; the guard gathers
    batches = [next(it) for _ in range(3)]
    tokens = np.stack([b["tokens"] for b in batches])  # [3, 8, T]
    index = np.stack([b["index"] for b in batches]).astype(np.int32)
    g_tokens, g_index = multihost_utils.process_allgather((tokens, index))  # [2, 3, 8, ...]
    example = np.stack([b["example"] for b in batches])
    # The double-sharding bug must be caught on every host, with the hosts named.
    try:
        make_loader(cfg, sampler=DoubleShardedSampler(jax.process_index(), 2))
        caught = ""
    except guard.GuardError as e:
        caught = str(e)
    np.savez(
        os.path.join(out_dir, f"result-{pid}.npz"),
        g_tokens=np.asarray(g_tokens),
        g_index=np.asarray(g_index),
        example=example,
        caught=np.array(caught),
    )
    multihost_utils.sync_global_devices("done")
    jax.distributed.shutdown()
    print("OK")


if __name__ == "__main__":
    main(*sys.argv[1:])
