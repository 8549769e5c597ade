"""Loader benchmark: one host's tokens/s next to a raw sequential array_record read of the
same shards (same run), seek time to steps 0 / 10³ / 10⁶, and peak memory.

    .venv/bin/python bench/loader.py [--data out/sample/manifest.json] [--global_batch_size 64]

Without --data it writes a synthetic dataset (seq_len 8192, two sources) in a temp folder.
Ratios, not absolute numbers, are the point: both reads hit the same (page-cached) files.
"""
from __future__ import annotations

import os
import sys

# Run as a script, bench/ is sys.path[0], where other benchmarks' names (bench/tokenize.py)
# would shadow standard-library modules: import from the repository root instead.
_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:] = [os.path.dirname(_HERE)] + [p for p in sys.path if os.path.abspath(p or ".") != _HERE]

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import resource  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from array_record.python.array_record_module import ArrayRecordReader  # noqa: E402

from dataloader import LoaderConfig, batch_fields, make_loader  # noqa: E402


def synthetic(root: str, seq_len: int, records: int) -> str:
    from tests.dataloader.conftest import write_dataset  # the contract writer of the tests

    rng = np.random.default_rng(0)
    per_source = {"web": (0.6, records * 2 // 3), "code": (0.4, records // 3)}
    sources = {}
    for name, (weight, n) in per_source.items():
        lengths = rng.integers(seq_len // 8, 2 * seq_len, size=n * 2)
        lengths = lengths[np.cumsum(lengths) <= n * seq_len]
        sources[name] = {"train": [rng.integers(0, 100256, size=int(k)) for k in lengths],
                         "heldout": [], "weight": weight, "max_repetition": 4}
    return write_dataset(root, sources, seq_len=seq_len, shards=4)


def it_seq_len(manifest_path: str) -> int:
    with open(manifest_path) as f:
        return int(json.load(f)["seq_len"])


def raw_read(manifest_path: str) -> tuple[int, float]:
    """Every train record, shard by shard, in order: (tokens, seconds)."""
    with open(manifest_path) as f:
        m = json.load(f)
    base, tokens, t0 = os.path.dirname(manifest_path), 0, time.perf_counter()
    for src in m["sources"].values():
        for shard in src["splits"]["train"]["shards"]:
            if not shard["records"]:
                continue
            reader = ArrayRecordReader(os.path.join(base, shard["path"]))
            for blob in reader.read(list(range(reader.num_records()))):
                tokens += np.frombuffer(blob, dtype="<u4").size
            reader.close()
    return tokens, time.perf_counter() - t0


def loader_read(cfg: LoaderConfig, min_tokens: int) -> tuple[int, float]:
    it = make_loader(cfg, 0, 1)
    next(it)  # warm: opens readers, starts prefetch threads
    tokens, t0 = 0, time.perf_counter()
    while tokens < min_tokens:
        tokens += next(it)["tokens"].size
    elapsed = time.perf_counter() - t0
    it.close()
    return tokens, elapsed


def breakdown(cfg: LoaderConfig, repeats: int) -> dict[str, float]:
    """Best-of ms per host batch of each stage of `batch_at` (prefetch off)."""
    it = make_loader(dataclasses.replace(cfg, prefetch=0), 0, 1)
    positions = it._sampler.positions(0)
    slots = it.slots_at(positions)
    src, rec = it.plan.locate(slots)
    tokens = it.batch_at(0)["tokens"]
    stages = {
        "index_shuffle (order.train_slots)": lambda: it.slots_at(positions),
        "ArrayRecord reads (source.read)": lambda: [it._sources[s].read(rec[src == s])
                                                    for s in np.unique(src).tolist()],
        "segment_ids/positions/loss_mask": lambda: batch_fields(tokens, 100257, 100277),
        "whole batch_at": lambda: it.batch_at(0),
    }
    out = {}
    for name, fn in stages.items():
        best = float("inf")
        for _ in range(repeats * 3):
            t0 = time.perf_counter()
            fn()
            best = min(best, time.perf_counter() - t0)
        out[name] = best * 1e3
    it.close()
    return out


def seek(cfg: LoaderConfig, step: int) -> float:
    t0 = time.perf_counter()
    it = make_loader(cfg, 0, 1, start_step=step)
    next(it)
    elapsed = time.perf_counter() - t0
    it.close()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", help="manifest.json (default: synthetic)")
    ap.add_argument("--global_batch_size", type=int, default=64)
    ap.add_argument("--seq_len", type=int, default=8192, help="synthetic data only")
    ap.add_argument("--records", type=int, default=3072, help="synthetic data only")
    ap.add_argument("--repeats", type=int, default=3, help="best of N (the machine may be shared)")
    args = ap.parse_args()
    if args.data is None:
        # Write the data, then measure in a fresh process so that its peak RSS is the loader's.
        with tempfile.TemporaryDirectory() as tmp:
            path = synthetic(tmp, args.seq_len, args.records)
            argv = [a for a in sys.argv[1:]]
            subprocess.run([sys.executable, os.path.abspath(__file__), "--data", path, *argv],
                           check=True)
        return
    path = args.data
    raw_read(path)  # warm the page cache so both reads see the same storage state
    configs = [(0, 0), (2, 1), (4, 2)]
    best = {"raw": 0.0, **{c: 0.0 for c in configs}}
    for _ in range(args.repeats):  # interleaved, best of N: load from other processes is noise
        raw_tokens, raw_s = raw_read(path)
        best["raw"] = max(best["raw"], raw_tokens / raw_s)
        for prefetch, threads in configs:
            cfg = LoaderConfig(data=[path], global_batch_size=args.global_batch_size,
                               prefetch=prefetch, read_threads=threads)
            tok, s = loader_read(cfg, raw_tokens)
            best[(prefetch, threads)] = max(best[(prefetch, threads)], tok / s)
    print(f"data: {path}  ({raw_tokens:,} train tokens, best of {args.repeats})")
    print("| read | tokens/s | ratio vs raw |\n|---|---:|---:|")
    print(f"| raw sequential array_record | {best['raw']:,.0f} | 1.00 |")
    for prefetch, threads in configs:
        tps = best[(prefetch, threads)]
        print(f"| loader G={args.global_batch_size}, H=1, prefetch={prefetch}, threads={threads} "
              f"| {tps:,.0f} | {tps / best['raw']:.2f} |")
    cfg = LoaderConfig(data=[path], global_batch_size=args.global_batch_size)
    rows_per_s = best["raw"] / it_seq_len(path)
    print(f"\n| stage (one host batch of {args.global_batch_size} rows) | ms |\n|---|---:|")
    print(f"| raw sequential read of as many rows | {args.global_batch_size / rows_per_s * 1e3:.2f} |")
    for name, ms in breakdown(cfg, args.repeats).items():
        print(f"| {name} | {ms:.2f} |")
    print("\n| start step | make_loader + first batch (s) |\n|---:|---:|")
    for step in (0, 10**3, 10**6):
        print(f"| {step:,} | {min(seek(cfg, step) for _ in range(args.repeats)):.3f} |")
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"\npeak RSS of the measuring process: {peak_mib:.0f} MiB")


if __name__ == "__main__":
    main()
