"""Audit benchmark: seconds and peak memory of the sharding proof over 10⁷ planned positions,
for several host counts, next to the brute-force slot check (the baseline, same run) whose cost
grows with every position and whose memory grows with the epoch.

    .venv/bin/python -m bench.audit [--positions 10000000] [--global_batch_size 512] [--hosts 64 256 512]

Each measurement runs in a fresh subprocess so that peak RSS (ru_maxrss) is its own; a second,
untimed run under tracemalloc gives the Python-heap peak of the check itself. Ratios are the point, not absolute seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
import tracemalloc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository

BRUTE_FORCE_POSITIONS = 20_000  # the baseline is per-position Python: measure few, report per position


def one(positions: int, g: int, h: int, brute: bool) -> dict:
    # lazy: loaded by the measured child only (--child), not by the parent
    from audit.sharding import ShardingConfig, check_sharding
    from dataloader.plan import SourceSpec, make_plan

    # Two sources whose plan has exactly `positions` slots per epoch (web read once, code 2×).
    web, code = positions // 2, positions // 4
    plan = make_plan(
        [SourceSpec("web", 0, web, web * 100, 0.5, 1.0), SourceSpec("code", 1, code, code * 100, 0.5, 4.0)],
        ["bench"],
        "train",
    )
    steps = -(-plan.size // g)
    cfg = ShardingConfig(hosts=h, global_batch_size=g, steps=steps, brute_force_limit=steps * g if brute else 0)
    t0 = time.perf_counter()
    r = check_sharding(plan, cfg)
    dt = time.perf_counter() - t0  # timed without tracemalloc, which slows allocation
    tracemalloc.start()
    check_sharding(plan, cfg)
    _, heap = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert r.passed, r.summary
    return {
        "positions": steps * g,
        "hosts": h,
        "brute_force": brute,
        "seconds": dt,
        "heap_peak_mib": heap / 2**20,
        "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--positions", type=int, default=10**7)
    p.add_argument("--global_batch_size", type=int, default=512)
    p.add_argument("--hosts", type=int, nargs="+", default=[64, 256, 512])
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(one(**json.loads(a.child))))
        return

    def run(**kw) -> dict:
        out = subprocess.run(
            [sys.executable, "-m", "bench.audit", "--child", json.dumps(kw)],
            check=True,
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout
        return json.loads(out.strip().splitlines()[-1])

    g = a.global_batch_size
    base = run(positions=BRUTE_FORCE_POSITIONS, g=g, h=a.hosts[0], brute=True)
    base_per_pos = base["seconds"] / base["positions"]
    print(
        f"baseline brute force: {base['positions']} positions, {base['seconds']:.2f} s "
        f"({base_per_pos * 1e6:.1f} µs/position ⇒ {base_per_pos * a.positions:.0f} s for "
        f"{a.positions:.0e}), heap {base['heap_peak_mib']:.1f} MiB"
    )
    small = run(positions=a.positions // 10, g=g, h=a.hosts[0], brute=False)
    print(
        f"interval proof, {small['positions']:.2e} positions, H={small['hosts']}: {small['seconds']:.2f} s, "
        f"heap {small['heap_peak_mib']:.2f} MiB, RSS {small['rss_peak_mib']:.0f} MiB"
    )
    for h in a.hosts:
        r = run(positions=a.positions, g=g, h=h, brute=False)
        print(
            f"interval proof, {r['positions']:.2e} positions, H={h}: {r['seconds']:.2f} s "
            f"({base_per_pos * r['positions'] / r['seconds']:.0f}× faster than brute force), "
            f"heap {r['heap_peak_mib']:.2f} MiB, RSS {r['rss_peak_mib']:.0f} MiB"
        )


if __name__ == "__main__":
    main()
