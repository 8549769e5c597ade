"""On a chip: the trainer's own train step run on synthetic batches, and its measured peak HBM next
to what the compiler planned for it, to hold ``python -m trainer.compile``'s prediction against.

    python -m bench.step_memory --config trainer/configs/olmo3-7b-stage1.yaml [--steps 2] [key=value ...]

Prints one JSON line: ``peak_bytes_in_use`` (``device.memory_stats()``, the process's peak: the
step, after params and optimizer state were initialised on the device) and the compiled step's
``memory_analysis()`` in this process. The prediction to compare with, made on any machine:

    python -m trainer.compile --config SAME.yaml --topology v5e:1x1 --skip_eval SAME key=value ...

(``per_device_bytes.peak``). Synthetic batch: random tokens, one document per row, every target counted.
"""
from __future__ import annotations

import argparse
import json
import sys

import jax
import numpy as np

import model
from trainer import mesh as mesh_lib
from trainer.build import build
from trainer.config import load_config


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", required=True)
    ap.add_argument("--steps", type=int, default=2)
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
    host = {"tokens": rng.integers(0, b.model_cfg.vocab_size, (rows, T), dtype=np.int32),
            "segment_ids": np.ones((rows, T), np.int32), "positions": np.tile(np.arange(T, dtype=np.int32), (rows, 1)),
            "loss_mask": np.ones((rows, T), np.int32)}
    batch = mesh_lib.global_batch(host, b.mesh, G)
    compiled = b.train_step.lower(params, opt, np.int32(0), batch).compile()
    m = compiled.memory_analysis()
    for s in range(args.steps):
        params, opt, metrics = compiled(params, opt, np.int32(s), batch)
        jax.block_until_ready(metrics)
    stats = jax.local_devices()[0].memory_stats() or {}
    print(json.dumps({
        "config": args.config, "overrides": args.overrides, "device_kind": jax.devices()[0].device_kind,
        "devices": jax.device_count(), "loss": float(metrics["loss"]),
        "peak_bytes_in_use": stats.get("peak_bytes_in_use"), "bytes_limit": stats.get("bytes_limit"),
        "compiled": {"arguments": m.argument_size_in_bytes, "outputs": m.output_size_in_bytes,
                     "temporaries": m.temp_size_in_bytes, "aliased": m.alias_size_in_bytes,
                     "peak": m.peak_memory_in_bytes},
    }))


if __name__ == "__main__":
    main()
