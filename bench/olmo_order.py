"""Benchmark of the olmo-core order's permutation cache (not a test): build time and memory.

    .venv/bin/python -m bench.olmo_order [--n 1e8 7.24e8] [--dir /tmp/olmax-order-bench] [--keep]

For each N, in a fresh subprocess (so that peak RSS is the build's own): builds the permutation
of (N, seed 34521, epoch 1) into a PermutationCache (= OLMo-core's arange + PCG64 shuffle, sha256,
write), then opens it again in a fresh cache (size/key check + full sha256 verification + memmap)
and reads 1000 global batches of 512 at random steps. Prints seconds for each phase, the peak RSS
above the process's RSS after imports, and the file size. N = 7.24e8 is OLMo 3 stage 1's instance
count (5.93T tokens / 8192).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time

from bench import rss_mib

SEED, EPOCH, G = 34521, 1, 512


def one(n: int, directory: str) -> dict:
    import numpy as np  # lazy: the measured child's RSS

    from dataloader import olmo_order  # lazy: the measured child's RSS

    base = rss_mib()
    cache = olmo_order.PermutationCache(directory)
    key = olmo_order.CacheKey(n, SEED, EPOCH)
    t0 = time.perf_counter()
    perm = olmo_order.permutation(n, SEED, EPOCH)
    t_shuffle = time.perf_counter() - t0
    del perm
    t0 = time.perf_counter()
    cache.build(key)  # shuffle again + sha256 + write (what the loader does)
    t_build = time.perf_counter() - t0
    peak_build = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    t0 = time.perf_counter()
    perm = olmo_order.PermutationCache(directory).open(key)  # checks + full sha256
    t_open = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    steps = rng.integers(0, n // G, size=1000)
    t0 = time.perf_counter()
    s = 0
    for b in steps.tolist():
        s += int(perm[b * G : (b + 1) * G].sum())
    t_seek = (time.perf_counter() - t0) / len(steps)
    size = os.path.getsize(cache.paths(key)[0])
    return {
        "n": n,
        "shuffle_s": round(t_shuffle, 2),
        "build_s": round(t_build, 2),
        "open_verify_s": round(t_open, 2),
        "batch_read_ms": round(t_seek * 1e3, 3),
        "peak_rss_above_base_mib": round(peak_build),
        "file_mib": round(size / 2**20),
        "cpu_count": os.cpu_count(),
        "load_avg_1m": os.getloadavg()[0],
    }


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", nargs="+", type=float, default=[1e8])
    ap.add_argument("--dir", default="/tmp/olmax-order-bench")
    ap.add_argument("--keep", action="store_true", help="keep the cache files")
    ap.add_argument("--one", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(int(args.one), args.dir)))
        return 0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rows = []
    for n in args.n:
        out = subprocess.run(
            [sys.executable, "-m", "bench.olmo_order", "--one", str(n), "--dir", args.dir],
            check=True,
            capture_output=True,
            text=True,
            cwd=root,
            env={**os.environ, "PYTHONPATH": root},
        ).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    print(
        "| N | shuffle (s) | build = shuffle + sha256 + write (s) | open + verify (s) | read one batch of 512 (ms) "
        "| peak RSS above base (MiB) | file (MiB) | load avg |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['n']:.3g} | {r['shuffle_s']} | {r['build_s']} | {r['open_verify_s']} | {r['batch_read_ms']} "
            f"| {r['peak_rss_above_base_mib']} | {r['file_mib']} | {r['load_avg_1m']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
