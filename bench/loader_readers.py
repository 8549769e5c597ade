"""The loader's shard readers at scale: the memory an open reader holds (per record of its shard's
index and per shard), what a host holds under `max_open_shards`, and the start-up shard check over
many shards with a simulated per-open latency (gcsfuse / NFS), one thread against the pool.

    .venv/bin/python -m bench.loader_readers [--shards 2000] [--latency_ms 10] [--out FILE.json]

Each memory figure is measured in a fresh process (VmRSS after the reads − before, after
malloc_trim), on real ArrayRecord files written here (`group_size:1`); read times per record with the
index in memory (Grain's reader) and offloaded (left on disk); the figures for a 10⁸-record,
40,000-shard manifest are extrapolated from them (the index is a fixed-size entry per record and
the per-reader cost is per file, so both are linear; said so in the output).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

STAGE1_RECORDS, STAGE1_SHARDS = 10**8, 40_000


def _rss() -> int:
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def write_shards(folder: str, shards: int, records: int, seq_len: int = 4) -> list[str]:
    # lazy: each measured child process loads only the reader it measures
    from array_record.python.array_record_module import ArrayRecordWriter

    os.makedirs(folder, exist_ok=True)
    row = np.arange(seq_len, dtype="<u4").tobytes()
    paths = []
    for k in range(shards):
        path = os.path.join(folder, f"train-{k:05d}-of-{shards:05d}.arrayrecord")
        if not os.path.exists(path):
            w = ArrayRecordWriter(path + ".tmp", "group_size:1")
            for _ in range(records):
                w.write(row)
            w.close()
            os.replace(path + ".tmp", path)
        paths.append(path)
    return paths


def held(folder: str, max_open: int | None, reads_per_shard: int) -> dict:
    """In this process: every shard of `folder` read (`reads_per_shard` records each, spread over
    it) through the loader's readers; the RSS they hold."""
    # lazy: each measured child process loads only the reader it measures
    from array_record.python.array_record_module import ArrayRecordReader

    from dataloader.source import _OpenShards  # lazy: each measured child process loads only the reader it measures

    paths = sorted(os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".arrayrecord"))
    counts = []
    for p in paths:
        r = ArrayRecordReader(p)
        counts.append(r.num_records())
        r.close()
    shards = _OpenShards(paths, counts, max_open)
    before = _rss()
    t = time.perf_counter()
    for k, n in enumerate(counts):
        for pos in np.linspace(0, n - 1, reads_per_shard).astype(int).tolist():
            shards.read(k, pos)
    seconds = time.perf_counter() - t
    after = _rss()
    return {
        "shards": len(paths),
        "records": int(sum(counts)),
        "max_open": max_open,
        "open_now": shards.open_count,
        "held_bytes": after - before,
        "seconds": seconds,
    }


def _fresh(folder: str, max_open: int | None, reads: int) -> dict:
    code = (
        "import json, sys; from bench.loader_readers import held; "
        f"print(json.dumps(held({folder!r}, {max_open!r}, {reads})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def read_ms(path: str, options: str, reads: int = 5) -> float:
    """Mean ms per random single-record read with these reader options (Grain's buffer size)."""
    # lazy: each measured child process loads only the reader it measures
    from array_record.python.array_record_module import ArrayRecordReader

    r = ArrayRecordReader(path, options, file_reader_buffer_size=32768)
    at = np.random.default_rng(0).integers(0, r.num_records(), reads).tolist()
    t = time.perf_counter()
    for i in at:
        r.read([i])
    r.close()
    return (time.perf_counter() - t) / reads * 1e3


def startup(paths: list[str], records: int, latency_s: float, threads: int) -> float:
    """Seconds `check_shards` takes over `paths` when every reader open waits `latency_s` first
    (a network round trip, simulated by a sleep: the GIL is released as in a real wait)."""
    # lazy: each measured child process loads only the reader it measures
    from array_record.python.array_record_module import ArrayRecordReader

    import dataloader.source as source  # lazy: each measured child process loads only the reader it measures

    class SlowOpen(ArrayRecordReader):
        def __init__(self, *a, **kw):
            time.sleep(latency_s)
            super().__init__(*a, **kw)

    checks = [source.ShardCheck(p, records, 16, "bench") for p in paths]
    real, source.ArrayRecordReader = source.ArrayRecordReader, SlowOpen
    try:
        t = time.perf_counter()
        source.check_shards(checks, threads=threads)
        return time.perf_counter() - t
    finally:
        source.ArrayRecordReader = real


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=None, help="where to write the shards (default: a temp folder)")
    ap.add_argument("--shards", type=int, default=2000, help="small shards for the per-shard figures")
    ap.add_argument(
        "--index_records",
        type=int,
        nargs=2,
        default=[250_000, 1_000_000],
        help="records of the two one-shard files for the per-record figure",
    )
    ap.add_argument("--latency_ms", type=float, default=10.0, help="simulated latency per reader open")
    ap.add_argument("--bound", type=int, default=256, help="max_open_shards for the bounded run")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="loader_readers_")
    res: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}

    per = {}
    for n in args.index_records:
        folder = os.path.join(root, f"one-{n}")
        write_shards(folder, 1, n)
        per[n] = _fresh(folder, None, 2)["held_bytes"]
    n1, n2 = args.index_records
    b_rec = (per[n2] - per[n1]) / (n2 - n1)
    res["index"] = {"records": per, "bytes_per_record": b_rec}

    big = os.path.join(root, f"one-{n2}", "train-00000-of-00001.arrayrecord")
    res["index_option_read_ms"] = {
        "records": n2,
        "in_memory (Grain's options)": read_ms(big, "readahead_buffer_size:0"),
        "offloaded": read_ms(big, "readahead_buffer_size:0,index_storage_option:offloaded,footer_prefetch_bytes:0"),
    }

    small = os.path.join(root, f"many-{args.shards}")
    paths = write_shards(small, args.shards, 16)
    unbounded = _fresh(small, None, 2)
    bounded = _fresh(small, args.bound, 2)
    b_shard = unbounded["held_bytes"] / args.shards - 16 * b_rec
    res["shards"] = {"unbounded": unbounded, "bounded": bounded, "bytes_per_shard": b_shard}
    per_shard_records = STAGE1_RECORDS / STAGE1_SHARDS
    res["stage1_extrapolated"] = {
        "records": STAGE1_RECORDS,
        "shards": STAGE1_SHARDS,
        "every_shard_open_gib": (STAGE1_RECORDS * b_rec + STAGE1_SHARDS * b_shard) / 2**30,
        "bounded_1024_gib": 1024 * (b_shard + per_shard_records * b_rec) / 2**30,
    }

    lat = args.latency_ms / 1e3
    one = startup(paths, 16, lat, 1)
    pool = startup(paths, 16, lat, 32)
    res["startup"] = {
        "shards": args.shards,
        "latency_ms": args.latency_ms,
        "one_thread_s": one,
        "pool_32_s": pool,
        "speedup": one / pool,
        "stage1_one_thread_s": one / args.shards * STAGE1_SHARDS,
        "stage1_pool_32_s": pool / args.shards * STAGE1_SHARDS,
    }
    print(json.dumps(res, indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(res, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
