"""Model benchmark: fwd+bwd step time and achieved FLOP/s of ``olmo3-small`` in both head layouts
(stock 8 × 64 vs. MXU-style 4 × 128: same widths, params and FLOPs), next to this machine's dense
matmul FLOP/s measured in the same run, per compute dtype. The ratio is a CPU "MFU".

    .venv/bin/python -m bench.model [--batch 2] [--seq_len 512] [--steps 3] [--dtypes bfloat16,float32]

Achieved FLOP/s uses ``model.flops_per_token`` (the convention: 6 × matmul params incl. LM head
+ causal attention at half of S², sliding windows not discounted) × tokens / step seconds.
Prints one JSON line per measurement and a summary table.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import jax
import jax.numpy as jnp
import numpy as np

import model

# (label, overrides of olmo3-small): the MXU-style layout halves the heads and doubles head_dim.
LAYOUTS: tuple[tuple[str, dict[str, int]], ...] = (
    ("stock 8x64", {}),
    ("mxu-style 4x128", {"n_heads": 4, "n_kv_heads": 4, "head_dim": 128}),
)


def _time(fn, reps: int) -> float:
    """Median seconds of ``fn()`` (blocking) over ``reps`` runs, after one warm-up/compile run."""
    jax.block_until_ready(fn())
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def matmul_flops(dtype: str, n: int, reps: int) -> float:
    """Dense [n, n] @ [n, n] FLOP/s in ``dtype`` (2 n³ FLOPs per product)."""
    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    f = jax.jit(lambda x, y: x @ y)
    return 2 * n**3 / _time(lambda: f(a, b), reps)


def step_flops(cfg: model.ModelConfig, batch: int, seq_len: int, steps: int) -> tuple[float, float]:
    """(seconds per fwd+bwd step, achieved FLOP/s) of a next-token loss on random tokens."""
    params = model.init(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (batch, seq_len + 1), 0, cfg.vocab_size, jnp.int32)

    def loss(p, tok):
        logits = model.forward(cfg, p, tok[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.take_along_axis(logp, tok[:, 1:, None], axis=-1).mean()

    grad_fn = jax.jit(jax.value_and_grad(loss))
    seconds = _time(lambda: grad_fn(params, tokens), steps)
    return seconds, model.flops_per_token(cfg, seq_len) * batch * seq_len / seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--matmul_n", type=int, default=2048)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    args = ap.parse_args()
    rows = []
    print(json.dumps({"devices": str(jax.devices()), "cpu_count": os.cpu_count(), **vars(args)}))
    for dtype in args.dtypes.split(","):
        peak = matmul_flops(dtype, args.matmul_n, reps=5)
        print(json.dumps({"dtype": dtype, "matmul_gflops": peak / 1e9}))
        for label, overrides in LAYOUTS:
            cfg = model.get_config("olmo3-small", compute_dtype=dtype, **overrides)
            seconds, achieved = step_flops(cfg, args.batch, args.seq_len, args.steps)
            row = {
                "dtype": dtype,
                "layout": label,
                "step_s": seconds,
                "gflops": achieved / 1e9,
                "matmul_gflops": peak / 1e9,
                "mfu": achieved / peak,
                "tokens_per_s": args.batch * args.seq_len / seconds,
            }
            print(json.dumps(row))
            rows.append(row)
    print(
        "\n| dtype | layout | fwd+bwd step (s) | achieved GFLOP/s | dense matmul GFLOP/s | CPU MFU |\n"
        "|---|---|---|---|---|---|"
    )
    for r in rows:
        print(
            f"| {r['dtype']} | {r['layout']} | {r['step_s']:.2f} | {r['gflops']:.1f} | "
            f"{r['matmul_gflops']:.1f} | {r['mfu']:.1%} |"
        )


if __name__ == "__main__":
    main()
