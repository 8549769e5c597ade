"""Benchmark of the token-file conversion (`format: tokens`) against a raw read+write (not a test).

    .venv/bin/python -m bench.tokens [--sizes_mb 32 128] [--repeats 3] [--seq_len 8192]

For each size, writes one OLMo-core-style token file (uint32, documents + EOS) and measures, each
in a fresh subprocess, alternating `--repeats` times (best kept: this VM's speed drifts):
  raw      the same bytes read through Beam's FileSystems in the converter's read size, written
           to a local file and committed to the output folder by `pipelines.shards` (copy + sha256
           + rename) — the I/O the conversion cannot avoid
  convert  `pipelines.token_files.convert_file`: read, check ids < vocab and count EOS, cut into
           instances, write the ArrayRecord shard (group_size:1, zstd:1) and commit it the same way
and prints MB/s of input and the convert/raw ratio of wall time, the CPU-seconds of each (user +
system of the whole process, all its threads) and their
ratio, and the peak RSS above the process's RSS after imports (flat in file size = the conversion
streams). Best of the repeats, wall and CPU each on its own (the fastest wall run need not be the
cheapest CPU run on a shared machine).

    .venv/bin/python -m bench.tokens --profile [--sizes_mb 128]

prints cProfile's top entries of one `convert_file` (where its time goes) instead.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from bench import rss_mib

EOS, VOCAB = 100257, 100278


def make_file(path: str, mb: int) -> None:
    import numpy as np  # lazy: the measured child loads only what it measures

    rng = np.random.default_rng(0)
    n = mb * 2**20 // 4
    with open(path, "wb") as f:
        for start in range(0, n, 1 << 22):
            k = min(1 << 22, n - start)
            ids = rng.integers(0, 100256, size=k, dtype=np.uint32)
            ids[rng.integers(0, k, size=k // 600)] = EOS  # ~600-token documents
            ids.astype("<u4").tofile(f)


def cpu_seconds() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def run_one(kind: str, src: str, out_dir: str, seq_len: int, read_tokens: int | None = None) -> dict:
    from apache_beam.io.filesystem import CompressionTypes  # lazy: the measured child loads only what it measures
    from apache_beam.io.filesystems import FileSystems

    from pipelines import shards  # lazy: the measured child loads only what it measures
    from pipelines import token_files as tokens

    if read_tokens:  # an experiment: another read size, for raw and convert alike
        tokens.READ_TOKENS = read_tokens

    base = rss_mib()
    dest = os.path.join(out_dir, f"{kind}.out")
    t0, c0 = time.perf_counter(), cpu_seconds()
    if kind == "raw":
        fd, local = tempfile.mkstemp()
        with os.fdopen(fd, "wb") as w, FileSystems.open(src, compression_type=CompressionTypes.UNCOMPRESSED) as r:
            while chunk := r.read(tokens.READ_TOKENS * 4):
                w.write(chunk)
        shards._commit(local, dest)
        os.unlink(local)
    else:
        tokens.convert_file(src, dest, tokens.token_dtype("uint32"), seq_len, EOS, VOCAB)
    dt, dc = time.perf_counter() - t0, cpu_seconds() - c0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
    os.unlink(dest)
    return {"kind": kind, "seconds": dt, "cpu_seconds": dc, "peak_rss_above_base_mib": peak}


def profile(src: str, out_dir: str, seq_len: int, top: int = 12) -> None:
    """cProfile of one conversion of `src`: its top functions by own time."""
    from pipelines import token_files as tokens  # lazy: the measured child loads only what it measures

    dest = os.path.join(out_dir, "profile.out")
    prof = cProfile.Profile()
    prof.runcall(tokens.convert_file, src, dest, tokens.token_dtype("uint32"), seq_len, EOS, VOCAB)
    os.unlink(dest)
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes_mb", nargs="+", type=int, default=[32, 128])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seq_len", type=int, default=8192)
    ap.add_argument(
        "--read_tokens", type=int, default=0, help="ids per read (default: pipelines.token_files.READ_TOKENS)"
    )
    ap.add_argument("--profile", action="store_true", help="cProfile one conversion per size instead")
    ap.add_argument("--one", nargs=3, help=argparse.SUPPRESS)  # kind src out_dir
    args = ap.parse_args()
    if args.one:
        kind, src, out_dir = args.one
        print(json.dumps(run_one(kind, src, out_dir, seq_len=args.seq_len, read_tokens=args.read_tokens)))
        return 0
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root}
    work = tempfile.mkdtemp(prefix="olmax-tokens-bench-")
    rows = []
    try:
        for mb in args.sizes_mb:
            src = os.path.join(work, f"in-{mb}.npy")
            make_file(src, mb)
            if args.profile:
                profile(src, work, args.seq_len)
                os.unlink(src)
                continue
            best: dict[str, dict] = {}
            cpu: dict[str, float] = {}
            for _ in range(args.repeats):
                for kind in ("raw", "convert"):
                    out = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "bench.tokens",
                            "--one",
                            kind,
                            src,
                            work,
                            "--seq_len",
                            str(args.seq_len),
                            "--read_tokens",
                            str(args.read_tokens),
                        ],
                        check=True,
                        capture_output=True,
                        text=True,
                        cwd=root,
                        env=env,
                    ).stdout
                    r = json.loads(out.strip().splitlines()[-1])
                    if kind not in best or r["seconds"] < best[kind]["seconds"]:
                        best[kind] = r
                    cpu[kind] = min(cpu.get(kind, r["cpu_seconds"]), r["cpu_seconds"])
            os.unlink(src)
            row = {
                "mb": mb,
                "raw_mb_s": mb / best["raw"]["seconds"],
                "convert_mb_s": mb / best["convert"]["seconds"],
                "raw_rss": best["raw"]["peak_rss_above_base_mib"],
                "convert_rss": best["convert"]["peak_rss_above_base_mib"],
                "load": os.getloadavg()[0],
            }
            row["ratio"] = row["convert_mb_s"] / row["raw_mb_s"]
            row["raw_cpu_s"], row["convert_cpu_s"] = cpu["raw"], cpu["convert"]
            row["cpu_ratio"] = cpu["raw"] / cpu["convert"]  # raw's CPU-seconds per convert's: ≥ 0.5 = the target
            rows.append(row)
            print(json.dumps(row), flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if rows:
        print(
            "| input (MiB) | raw read+write (MiB/s) | convert (MiB/s) | convert / raw, wall | CPU-s raw / convert | "
            "convert / raw, CPU | peak RSS above base, raw / convert (MiB) | load avg |"
        )
        print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['mb']} | {r['raw_mb_s']:.0f} | {r['convert_mb_s']:.0f} | {r['ratio']:.2f} | "
            f"{r['raw_cpu_s']:.2f} / {r['convert_cpu_s']:.2f} | {r['cpu_ratio']:.2f} | "
            f"{r['raw_rss']:.0f} / {r['convert_rss']:.0f} | {r['load']:.1f} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
