"""One JAX process of the 2-process preemption test (run by test_preemption.py).

argv: port process_id out_dir. Steps every 0.1 s through trainer.preemption.Preemption until it agrees to
stop; writes out_dir/pid-<id> first (the test sends SIGTERM to one process) and prints
"STOP <step>" when the processes agreed."""

import os
import sys
import time

import jax


def main(port: str, pid: str, out_dir: str) -> None:
    jax.config.update("jax_platforms", "cpu")
    jax.distributed.initialize(
        coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=int(pid), initialization_timeout=60
    )
    import orbax.checkpoint as ocp

    from trainer.preemption import Preemption

    preemption = Preemption()
    assert preemption.service
    manager = ocp.CheckpointManager(os.path.join(out_dir, f"ckpt-{pid}"))
    with open(os.path.join(out_dir, f"pid-{pid}.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(out_dir, f"pid-{pid}.tmp"), os.path.join(out_dir, f"pid-{pid}"))
    for step in range(1, 600):
        time.sleep(0.1)
        if preemption.agreed(step, manager):
            print(f"STOP {step}", flush=True)
            break
    preemption.restore()
    manager.close()
    jax.distributed.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
