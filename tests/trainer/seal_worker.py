"""One JAX process of the 2-process seal test (run by test_checkpoint_seal.py).

argv: port process_id run_dir. Saves one step of a state sharded over both processes, records
which files this process hashed while saving (run_dir/hashed-<id>.json), then verifies and
restores the step on both; prints "OK" when done. The same two processes also check that the
start-up's broadcast of the primary's shard sizes and mtimes (preflight._from_primary: int64 past
int32, without jax_enable_x64) reaches the other process whole.
"""

import json
import sys
from pathlib import Path

import jax
import numpy as np

from contract.rundir import RunDir


def main(port: str, pid: str, run_dir: str) -> None:
    jax.config.update("jax_platforms", "cpu")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(pid), initialization_timeout=60
    )
    from jax.sharding import NamedSharding, PartitionSpec

    from tests.trainer.checkpoint_fixtures import Loader
    from trainer.checkpointing import files
    from trainer.checkpointing.checkpoints import Checkpoints
    from trainer.config.schema import CheckpointConfig

    hashed: list[str] = []
    real = files._sha256
    files._sha256 = lambda path: (hashed.append(Path(path).as_posix()), real(path))[1]

    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    sharding = NamedSharding(mesh, PartitionSpec("x"))
    full = np.arange(64 * 16, dtype=np.float32).reshape(64, 16)
    arr = jax.make_array_from_callback(full.shape, sharding, lambda idx: full[idx])
    params, opt_state = {"w": arr}, {"mu": arr * 2}
    ckpt = Checkpoints(RunDir(run_dir), CheckpointConfig())
    ckpt.save(1, params, opt_state, Loader(1), {"step": 1})
    ckpt.wait()
    Path(run_dir, f"hashed-{pid}.json").write_text(json.dumps(hashed))
    assert files.verify_step(ckpt.step_dir(1)) is None  # every recorded digest equals a full re-hash
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), params)
    got = ckpt.restore(
        1, abstract, jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), opt_state)
    )
    assert np.array_equal(
        np.asarray(jax.experimental.multihost_utils.process_allgather(got["params"]["w"], tiled=True)), full
    )
    ckpt.close()

    from trainer.preflight import _from_primary

    stamps = np.array([[1_733_480_000_123_456_789, 600_000_000_000], [5, 2**40 + 3]], np.int64)
    got = _from_primary(stamps if pid == "0" else np.zeros_like(stamps))
    assert got.dtype == np.int64 and np.array_equal(got, stamps), got
    jax.distributed.shutdown()
    print("OK")


if __name__ == "__main__":
    main(*sys.argv[1:])
