"""One full downstream pass (OLMo 3's 26 in-loop tasks) with a recipe's model and mesh: instances/s,
tokens/s, the compiles, and the pass's cost as a share of training time at an eval interval.

    python -m bench.downstream --tasks_dir out/downstream-olmo3-fast-proxy32k \
        [--config trainer/configs/olmo3-7b-proxy-v5e.yaml] [--batch_tokens 32768] [--passes 2]
        [--interval 10000] [--step_time_s 1.015]

The task files come from ``python -m pipelines.downstream_tasks`` with the recipe's tokenizer and
seq_len (the proxy recipe: ``--tokenizer dolma2-proxy32k --model_ctx_len 8192``); the chip host
needs no olmo_eval or torch to read them. Parameters are random (init): the throughput does not
depend on them. Pass 1 includes the compiles; the later passes are the steady state (a run's
evaluator keeps its compiled programs, so only its first pass compiles).

Share of training time = pass time / (interval × step time). ``--step_time_s`` default: 1.015 s,
the one-chip proxy recipe's measured step (bench/RESULTS.md, "trainer.main on one v5e, the proxy
recipe on real shards": 32,240–32,303 tokens/s at 4 × 8192 tokens a step). That is the proxy's own
share: its batch is 4 sequences, the 7B recipe's 512, so the script also prints the FLOP-scaled
share at the 7B recipe (forward 2N FLOP per padded eval token vs 6N per training token of
``--recipe_tokens_per_step`` 512 × 8192 tokens a step).
"""

from __future__ import annotations

import argparse
import logging
import time

import jax
import numpy as np

import model
from trainer.build import build
from trainer.config.schema import load_config
from trainer.downstream import score
from trainer.downstream.evaluator import TIME_KEY, DownstreamEvaluator

PROXY_STEP_S = 1.015  # 4 x 8192 tokens / ~32,270 tokens/s (bench/RESULTS.md, trainer.main on one v5e)
RECIPE_TOKENS_PER_STEP = 512 * 8192  # trainer/configs/olmo3-7b-stage1.yaml: global_batch_size x seq_len


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--config", default="trainer/configs/olmo3-7b-proxy-v5e.yaml")
    p.add_argument("--tasks_dir", required=True)
    p.add_argument("--tasks", default=None, help="labels or preset (default: every task of tasks_dir)")
    p.add_argument("--batch_tokens", type=int, default=32768)
    p.add_argument("--passes", type=int, default=2)
    p.add_argument("--interval", type=int, default=10_000)
    p.add_argument("--step_time_s", type=float, default=PROXY_STEP_S)
    p.add_argument("--recipe_tokens_per_step", type=int, default=RECIPE_TOKENS_PER_STEP)
    p.add_argument("--precision", default="bfloat16")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)

    cfg = load_config(args.config)
    b = build(cfg)
    params = jax.jit(lambda k: model.init(b.model_cfg, k), out_shardings=b.param_shardings)(jax.random.key(0))
    ev = DownstreamEvaluator.from_files(
        args.tasks_dir,
        args.tasks,
        b.model_cfg,
        b.mesh,
        b.param_shardings,
        args.batch_tokens,
        cfg.seq_len,
        args.interval,
        args.precision,
        log_fn=lambda s: print(s, flush=True),
    )
    tasks = list(ev.tasks.tasks.values())
    instances = sum(len(t) for t in tasks)
    real = sum(int(t.lengths("query").sum()) for t in tasks)
    shards, ctx = score.mesh_lib.batch_shards(b.mesh), int(ev.tasks.manifest["model_ctx_len"])
    plans = [score.plan(t.lengths("query"), args.batch_tokens, shards, ctx, ev.scorer.buckets) for t in tasks]
    padded = sum(q.batch_rows * q.length for pl in plans for q in pl)
    print(
        f"{len(tasks)} tasks, {instances:,} instances, {real:,} query tokens, {padded:,} padded "
        f"({real / padded:.1%} real), {sum(map(len, plans))} batches of ≤ {args.batch_tokens:,} tokens; "
        f"model {cfg.model} on {jax.device_count()} x {jax.devices()[0].device_kind}",
        flush=True,
    )
    times = []
    for i in range(args.passes):
        t0 = time.monotonic()
        row = ev(params)
        times.append(time.monotonic() - t0)
        compiled = [f._cache_size() for f in (ev.scorer.hidden_fn, ev.scorer.head_fn)]  # type: ignore[attr-defined]  # jitted functions have it
        print(
            f"pass {i + 1}: {times[-1]:.1f}s (downstream_time_s {row[TIME_KEY]:.1f}); compiled programs: "
            f"model {compiled[0]}, head {compiled[1]}",
            flush=True,
        )
    steady = float(np.min(times[1:])) if len(times) > 1 else times[0]
    share = steady / (args.interval * args.step_time_s)
    flop_share = padded / (3 * args.interval * args.recipe_tokens_per_step)
    print(
        f"steady pass {steady:.1f}s: {instances / steady:,.0f} instances/s, {real / steady:,.0f} query tokens/s "
        f"({padded / steady:,.0f} padded tokens/s)"
    )
    print(
        f"share of training time every {args.interval:,} steps at {args.step_time_s} s/step: {share:.3%} "
        f"(first pass, with compiles: {times[0] / (args.interval * args.step_time_s):.3%})"
    )
    print(f"FLOP-scaled share at {args.recipe_tokens_per_step:,} tokens/step (the 7B recipe's batch): {flop_share:.4%}")


if __name__ == "__main__":
    main()
