"""On a chip: the trainer's own train step run on synthetic batches, and its measured peak HBM next
to what the compiler planned for it, to hold ``python -m trainer.compile``'s prediction against.

    python -m bench.step_memory --config trainer/configs/olmo3-7b-stage1.yaml [--steps 2] [key=value ...]

Prints one JSON line: ``peak_bytes_in_use`` (``device.memory_stats()``, the process's peak: the
step, after params and optimizer state were initialised on the device) and the compiled step's
``memory_analysis()`` in this process. The prediction to compare with, made on any machine:

    python -m trainer.compile --config SAME.yaml --topology v5e:1x1 --skip_eval SAME key=value ...

(``per_device_bytes.peak``). Synthetic batch: random tokens, one document per row, every target counted.

``--headroom``: the step's real footprint, measured as the runtime sees it. On a TPU v5e the
runtime's ``peak_bytes_in_use`` leaves out the executable's temporaries, so it cannot be held
against the compiler's peak; instead a ballast array is allocated first and the state is
initialised and one step run beside it, bisecting the largest ballast with which that still
succeeds: ``footprint = bytes_limit - largest ballast`` (to ``--resolution_mib``).
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

import model
from trainer import mesh as mesh_lib
from trainer.build import build
from trainer.config.schema import load_config


def largest_that_fits(fits: Callable[[int], bool], high: int, resolution: int) -> int:
    """The largest multiple of ``resolution`` in [0, high] for which ``fits`` holds (0 if only 0
    does), for ``fits`` true up to some size and false above it; about log2(high/resolution) calls."""
    lo, hi = 0, high // resolution  # fits(lo * resolution) is assumed; find the last true
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid * resolution):
            lo = mid
        else:
            hi = mid - 1
    return lo * resolution


def headroom(compiled, b, batch, resolution: int) -> dict:
    """Bisect the largest ballast beside which a fresh state initialises and one step runs."""
    limit = (jax.local_devices()[0].memory_stats() or {}).get("bytes_limit")
    if limit is None:
        raise RuntimeError("the device reports no memory bytes_limit: --headroom needs a TPU")
    refusals: list[str] = []

    def fits(n: int) -> bool:
        held: list = []
        try:
            if n:
                held.append(jax.block_until_ready(jnp.zeros((n // 4,), jnp.float32)))
            params = jax.jit(lambda k: model.init(b.model_cfg, k), out_shardings=b.param_shardings)(jax.random.key(0))
            held.append(params)
            opt = jax.jit(b.tx.init, out_shardings=b.opt_shardings)(params)
            held.append(opt)
            held.append(jax.block_until_ready(compiled(params, opt, np.float32(b.schedule(0)), batch)))
            return True
        except Exception as e:
            if "RESOURCE_EXHAUSTED" not in str(e):
                raise
            refusals.append(str(e).splitlines()[0][:400])
            return False
        finally:
            held.clear()
            gc.collect()

    ballast = largest_that_fits(fits, limit, resolution)
    return {
        "bytes_limit": limit,
        "largest_ballast": ballast,
        "footprint": limit - ballast,
        "resolution": resolution,
        "first_refusal": refusals[0] if refusals else None,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--headroom", action="store_true", help="measure the footprint by ballast bisection")
    ap.add_argument("--resolution_mib", type=int, default=128)
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    cfg = load_config(args.config, args.overrides)
    if cfg.seq_len is None:
        sys.exit("error: set seq_len=N (the batch is synthetic)")
    b = build(cfg)
    G, T = cfg.global_batch_size, cfg.seq_len
    params = jax.jit(lambda k: model.init(b.model_cfg, k), out_shardings=b.param_shardings)(jax.random.key(0))
    opt = jax.jit(b.tx.init, out_shardings=b.opt_shardings)(params)
    h, H = jax.process_index(), jax.process_count()
    rows = G // H
    rng = np.random.default_rng(h)
    host = {
        "tokens": rng.integers(0, b.model_cfg.vocab_size, (rows, T), dtype=np.int32),
        "segment_ids": np.ones((rows, T), np.int32),
        "positions": np.tile(np.arange(T, dtype=np.int32), (rows, 1)),
        "loss_mask": np.ones((rows, T), np.int32),
    }
    batch = mesh_lib.global_batch(host, b.mesh, G)
    compiled = b.train_step.lower(params, opt, np.float32(b.schedule(0)), batch).compile()
    m = compiled.memory_analysis()
    for s in range(args.steps):
        params, opt, metrics = compiled(params, opt, np.float32(b.schedule(s)), batch)
        jax.block_until_ready(metrics)
    stats = jax.local_devices()[0].memory_stats() or {}
    loss = float(metrics["loss"])
    probe = None
    if args.headroom:
        del params, opt, metrics
        gc.collect()
        probe = headroom(compiled, b, batch, args.resolution_mib * 2**20)
    print(
        json.dumps(
            {
                "config": args.config,
                "overrides": args.overrides,
                "device_kind": jax.devices()[0].device_kind,
                "devices": jax.device_count(),
                "loss": loss,
                "headroom": probe,
                "peak_bytes_in_use": stats.get("peak_bytes_in_use"),
                "bytes_limit": stats.get("bytes_limit"),
                "compiled": {
                    "arguments": m.argument_size_in_bytes,
                    "outputs": m.output_size_in_bytes,
                    "temporaries": m.temp_size_in_bytes,
                    "aliased": m.alias_size_in_bytes,
                    "peak": m.peak_memory_in_bytes,
                },
            }
        )
    )


if __name__ == "__main__":
    main()
