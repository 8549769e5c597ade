"""Start-up shard verification (dataloader.verify, run by trainer.preflight) against a raw read of
the same bytes, in the same run, with the same threads.

    .venv/bin/python -m bench.shard_hash [--data out/sample/manifest.json] [--shards 16 --shard_mib 64]
                                         [--threads 1 2] [--repeats 3]

Without --data it writes `--shards` files of `--shard_mib` MiB of random bytes in a temp folder
(contents do not change the cost of sha256 or of a read). Both passes read page-cached files
(a first read warms the cache), so the ratio is the hashing's CPU cost over a memory-speed read:
an upper bound of what verification adds to a read from disk or network, where the read itself
is slower. Prints GiB/s of each pass and their ratio (best of --repeats).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import tempfile
import time

from contract import TRAIN, Manifest
from dataloader import verify


def synthetic(root: str, shards: int, mib: int) -> list[verify.Shard]:
    out = []
    for i in range(shards):
        path = os.path.join(root, f"train-{i:05d}-of-{shards:05d}.arrayrecord")
        h = hashlib.sha256()
        with open(path, "wb") as f:
            for _ in range(mib):
                block = os.urandom(1 << 20)
                h.update(block)
                f.write(block)
        out.append(verify.Shard(path, h.hexdigest(), 0, 1, "synthetic", "s", TRAIN, i))
    return out


def raw_read(path: str) -> int:
    """Every byte of `path`, in the chunks hashing reads, into one reused buffer."""
    buf = bytearray(verify.READ_CHUNK)
    view, n = memoryview(buf), 0
    with open(path, "rb", buffering=0) as f:
        while got := f.readinto(view):
            n += got
    return n


def timed(fn, shards: list[verify.Shard], threads: int) -> float:
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(fn, shards))
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="manifest.json whose train shards are read (default: synthetic files)")
    ap.add_argument("--shards", type=int, default=16)
    ap.add_argument("--shard_mib", type=int, default=64)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        shards = (
            verify.listing([Manifest.load(args.data)], [TRAIN])
            if args.data
            else synthetic(tmp, args.shards, args.shard_mib)
        )
        total = sum(os.path.getsize(s.path) for s in shards)
        for s in shards:
            raw_read(s.path)  # warm the page cache
        print(
            f"{len(shards)} shards, {total / 2**30:.2f} GiB, page-cached; best of {args.repeats}; "
            f"{os.cpu_count()} CPUs\n"
        )
        print("| threads | raw read GiB/s | verify (sha256) GiB/s | verify / raw time |\n|---:|---:|---:|---:|")

        def check(s: verify.Shard) -> None:
            code, detail = verify.outcome(s, hashed=True)
            assert code == verify.HASHED, detail

        for threads in args.threads:
            raw, hashed = [], []
            for _ in range(args.repeats):  # interleaved, so load on a shared machine hits both alike
                raw.append(timed(lambda s: raw_read(s.path), shards, threads))
                hashed.append(timed(check, shards, threads))
            r, h = min(raw), min(hashed)
            print(f"| {threads} | {total / r / 2**30:.2f} | {total / h / 2**30:.2f} | {h / r:.2f} |")


if __name__ == "__main__":
    main()
