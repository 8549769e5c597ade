"""How a downstream pass batches its task files (numpy only: no model, no device): real and padded
query tokens and the distinct (B, L) model programs, with each batch holding the rows its length
bucket needs (`trainer.downstream.score.plan`) against every batch holding `batch_tokens // L` rows
(the plan before issue 39, recomputed here from the same length buckets).

    python -m bench.downstream_plan --tasks_dir out/downstream/olmo3-fast [--batch_tokens 32768] [--shards 1]
"""

from __future__ import annotations

import argparse
import math
from collections import Counter

from contract import downstream as ds
from trainer.downstream import score


def figures(tasks: ds.DownstreamTasks, batch_tokens: int, shards: int) -> dict[str, dict[str, int]]:
    """{"fit" | "full": {real, padded, programs, batches}} over every task of `tasks`."""
    ctx = int(tasks.manifest["model_ctx_len"])
    out = {k: {"real": 0, "padded": 0, "batches": 0} for k in ("fit", "full")}
    programs: dict[str, set] = {"fit": set(), "full": set()}
    for t in tasks.tasks.values():
        qlen = t.lengths("query")
        plan = score.plan(qlen, batch_tokens, shards, ctx)
        sizes: Counter = Counter()
        for p in plan:
            sizes[p.length] += len(p.rows)
            out["fit"]["padded"] += p.batch_rows * p.length
            programs["fit"].add((p.batch_rows, p.length))
        out["fit"]["batches"] += len(plan)
        for length, n in sizes.items():
            b = score.rows_for(length, batch_tokens, shards)
            out["full"]["batches"] += math.ceil(n / b)
            out["full"]["padded"] += math.ceil(n / b) * b * length
            programs["full"].add((b, length))
        for k in out:
            out[k]["real"] += int(qlen.sum())
    for k in out:
        out[k]["programs"] = len(programs[k])
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--tasks_dir", required=True)
    p.add_argument("--batch_tokens", type=int, default=32768)
    p.add_argument("--shards", type=int, default=1, help="the mesh's batch shards")
    args = p.parse_args(argv)
    tasks = ds.load(args.tasks_dir)
    f = figures(tasks, args.batch_tokens, args.shards)
    print(
        f"{len(tasks.tasks)} tasks at model_ctx_len {tasks.manifest['model_ctx_len']}, batch_tokens {args.batch_tokens:,}"
    )
    for k, what in (("full", "batch_tokens // L rows a batch"), ("fit", "the rows a bucket needs (now)")):
        x = f[k]
        print(
            f"{what}: {x['real']:,} real of {x['padded']:,} padded tokens ({x['real'] / x['padded']:.1%}), "
            f"{x['batches']} batches, {x['programs']} (B, L) model programs"
        )
    print(f"padded tokens: {f['fit']['padded'] / f['full']['padded']:.3f}x")


if __name__ == "__main__":
    main()
