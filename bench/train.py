"""Trainer benchmark: tokens/s, CPU "MFU" and the loader's share of step time, olmo3-small.

Runs the real training loop (``trainer.loop.train``: loader → global arrays → jitted AdamW step →
logs) in-process on the tokenized sample, started through its one door as ``trainer.main`` starts it
(``trainer.preflight.prepare``: every start-up check, the memory, shard and lock checks included),
with no evaluation and no intermediate checkpoints,
and reads its ``metrics.jsonl``. In the same run it measures this machine's dense float32
matmul FLOP/s (the baseline): CPU MFU = the trainer's achieved FLOP/s per device (model
FLOP convention of ``model.flops_per_token``) / that matmul FLOP/s.

    .venv/bin/python -m bench.train [--config trainer/configs/small.yaml] [--data out/sample/manifest.json]
                                    [--batch 2] [--steps 6] [--warmup 2] [--matmul_n 2048]

Loader share = time the loop waits in ``next(loader)`` / step time, over the steps after warm-up
(the loader prefetches in Grain threads, so this is the part the step actually waits for).
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import numpy as np

from bench import matmul_flops
from contract.rundir import RunDir
from trainer.config.schema import TrainConfig, load_config
from trainer.loop import train
from trainer.preflight import prepare

ROOT = Path(__file__).resolve().parents[1]  # the repository


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", default=str(ROOT / "trainer/configs/small.yaml"))
    ap.add_argument("--data", default="out/sample/manifest.json")
    ap.add_argument("--batch", type=int, default=2, help="global batch size (sequences)")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out (compilation)")
    ap.add_argument("--matmul_n", type=int, default=2048)
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    if args.steps <= args.warmup:
        raise SystemExit("--steps must exceed --warmup")
    if not Path(args.data).exists():
        subprocess.run([sys.executable, "-m", "pipelines.tokenize"], check=True, cwd=ROOT)

    cfg = load_config(
        args.config,
        [
            f"data={args.data}",
            f"global_batch_size={args.batch}",
            f"steps={args.steps}",
            "eval.every=0",
            "checkpoint.every=0",
            "log.progress_every=0",
        ],
    )
    baseline = matmul_flops(args.matmul_n)
    rows = measured_rows(cfg, args.warmup)
    step_s = np.array([r["step_time_s"] for r in rows])
    data_s = np.array([r["data_time_s"] for r in rows])
    tflops = float(np.median([r["tflops_per_device"] for r in rows]))
    result = {
        "model": cfg.model,
        "compute_dtype": cfg.model_overrides.get("compute_dtype", "bfloat16"),
        "global_batch": args.batch,
        "devices": jax.device_count(),
        "steps_measured": len(rows),
        "step_s": float(np.median(step_s)),
        "tokens_per_s": float(np.median([r["tokens_per_s"] for r in rows])),
        "tflops_per_device": tflops,
        "matmul_tflops": baseline / 1e12,
        "cpu_mfu": tflops * 1e12 / baseline,
        "loader_share": float(data_s.sum() / step_s.sum()),
    }
    print(json.dumps(result))
    print(
        f"| {result['model']} | {result['compute_dtype']} | {args.batch} | {result['tokens_per_s']:,.0f} | "
        f"{result['step_s']:.2f} | {tflops * 1e3:.1f} | {baseline / 1e9:.1f} | {result['cpu_mfu']:.1%} | "
        f"{result['loader_share']:.2%} |"
    )


def measured_rows(cfg: TrainConfig, warmup: int) -> list[dict]:
    """The metrics rows after the first ``warmup`` of a run of ``cfg`` in a temporary directory,
    started as ``trainer.main`` starts one: ``prepare`` (every start-up check, then the lock), then
    ``train`` with its ``Checked``."""
    with tempfile.TemporaryDirectory() as tmp:
        run = RunDir.resolved(tmp)  # as trainer.main resolves --run_dir
        lock, checked = prepare(cfg, run)
        try:
            train(checked, run)
        finally:
            lock.release()
        with open(run.metrics) as f:
            return [json.loads(line) for line in f][warmup:]


if __name__ == "__main__":
    main()
