"""Audit benchmark, data side: records/s and CPU per record of `python -m audit --data`'s shard
pass (sha256, integrity, contamination, statistics) on synthetic shards at seq 8192, per number of
DirectRunner workers.

    .venv/bin/python -m bench.audit_data [--records 4096 16384] [--seq_len 8192] [--shards 8]
        [--median_tokens 400] [--workers 1 2] [--modes multi_processing multi_threading]
        [--baseline_code /path/to/main]   # also time that checkout's audit on the same data
        [--dir DIR]                        # keep the data there (default: a temp folder)

With two sizes it also prints the CPU per record at the margin, (CPU(large) − CPU(small)) ÷
(records(large) − records(small)): what a record costs once start-up and the fixed-size n-gram
and tokens-per-byte samples are paid, i.e. what a 24 TB pass pays per record.

The data: one source of random token documents (log-normal lengths, σ = 1, median
`--median_tokens`: 400 gives ~12 documents per record, 90 ~55), packed as the pipeline packs them (EOS after every document, PAD
only at the end of a shard), 1/16 of the records held out (`--heldout_fraction`), with a manifest the audit accepts.
Each measurement runs in a fresh process (`--child`); CPU is user + system time of that process
and of the worker processes it waited for. Ratios are the point: the machine may be shared.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository


def write_data(
    root: str,
    records: int,
    seq_len: int,
    shards: int,
    seed: int = 0,
    median_tokens: float = 400.0,
    heldout_shards: int = 1,
    heldout_fraction: float = 1 / 16,
) -> str:
    """Writes root/manifest.json and its shards (`shards` training, `heldout_shards` held-out
    holding `heldout_fraction` of the records, at least one each); returns the manifest path."""
    # lazy: the parent's writer stays out of the measured child
    from array_record.python.array_record_module import ArrayRecordWriter

    import contract  # lazy: the parent's writer stays out of the measured child
    from pipelines.dolma2_tokenizer import CL100K_RANKS_SHA256, EOS_ID, PAD_ID, VOCAB_SIZE

    rng = np.random.default_rng(seed)
    entry: dict[str, Any] = {"counts": {}, "tokens": {"train": 0, "heldout": 0, "padding": 0}, "splits": {}}
    docs_of = {"train": 0, "heldout": 0}
    heldout_records = max(heldout_shards, round(records * heldout_fraction))
    plan = {
        "heldout": [
            heldout_records // heldout_shards + (i < heldout_records % heldout_shards) for i in range(heldout_shards)
        ],
        "train": [(records - heldout_records) // shards] * shards,
    }
    for split, sizes in plan.items():
        listed: list[dict[str, Any]] = []
        for k, n in enumerate(sizes):
            want = n * seq_len - seq_len // 2  # the last record half PAD
            lengths = np.maximum(
                1, rng.lognormal(np.log(median_tokens), 1.0, size=int(want / median_tokens) + 64).astype(np.int64)
            )
            ends = np.cumsum(lengths + 1)
            lengths = lengths[: int(np.searchsorted(ends, want, side="right"))]
            flat = rng.integers(0, 100_000, size=int((lengths + 1).sum()), dtype=np.uint32)
            flat[np.cumsum(lengths + 1) - 1] = EOS_ID
            n_rec = -(-flat.size // seq_len)
            recs = np.full(n_rec * seq_len, PAD_ID, np.uint32)
            recs[: flat.size] = flat
            rel = f"web/{split}-{k:05d}-of-{len(sizes):05d}.arrayrecord"
            path = os.path.join(root, rel)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            w = ArrayRecordWriter(path, "group_size:1")
            for r in recs.reshape(n_rec, seq_len):
                w.write(r.astype("<u4").tobytes())
            w.close()
            with open(path, "rb") as f:
                listed.append({"path": rel, "records": n_rec, "sha256": hashlib.file_digest(f, "sha256").hexdigest()})
            docs_of[split] += int(lengths.size)
            entry["tokens"][split] += int(flat.size)
            entry["tokens"]["padding"] += n_rec * seq_len - int(flat.size)
        entry["splits"][split] = {"examples": sum(s["records"] for s in listed), "shards": listed}
    entry["counts"] = {
        "documents": docs_of["train"] + docs_of["heldout"],
        "train": docs_of["train"],
        "heldout": docs_of["heldout"],
        "duplicates": 0,
        "rejected": {},
    }
    mixture = {
        "name": "bench",
        "tokenizer": "dolma2",
        "seq_len": seq_len,
        "seed": seed,
        "heldout_fraction": heldout_fraction,
        "dedup": "exact",
        "sources": [{"name": "web", "paths": ["bench://web"], "weight": 1.0, "max_repetition": 4.0}],
    }
    manifest = {
        "format_version": 1,
        "seq_len": seq_len,
        "record_format": "uint32-le[seq_len]",
        "tokenizer": {
            "name": "dolma2",
            "ranks_sha256": CL100K_RANKS_SHA256,
            "vocab_size": VOCAB_SIZE,
            "eos_id": EOS_ID,
            "pad_id": PAD_ID,
        },
        "mixture": mixture,
        "sources": {"web": entry},
    }
    path = os.path.join(root, "manifest.json")
    with open(path, "w") as f:
        json.dump(contract.with_fingerprint(manifest), f)
    return path


def child(manifest_path: str, workers: int, mode: str = "multi_processing") -> dict:
    """One timed data pass in this process (the checkout on sys.path decides which code)."""
    from audit import scan as scan_mod  # lazy: the audit (Beam) loads in the measured child only
    from audit.contamination import ContaminationConfig
    from audit.shard_reader import load_manifest

    m = load_manifest(manifest_path)
    kw: dict[str, Any] = {}
    if "beam_args" in scan_mod.scan.__code__.co_varnames:  # the Beam engine; older code has one process
        kw["beam_args"] = [f"--direct_num_workers={workers}", f"--direct_running_mode={mode}"] if workers > 1 else []
    t0, c0 = time.perf_counter(), os.times()
    r = scan_mod.scan(m, ContaminationConfig(), **kw)
    wall, c1 = time.perf_counter() - t0, os.times()
    cpu = (
        (c1.user - c0.user)
        + (c1.system - c0.system)
        + (c1.children_user - c0.children_user)
        + (c1.children_system - c0.children_system)
    )
    records = int(r.integrity.figures["records_checked"])
    assert r.integrity.passed and r.statistics.passed and r.contamination.passed, (
        r.integrity.summary,
        r.statistics.summary,
        r.contamination.summary,
    )
    return {
        "records": records,
        "seconds": wall,
        "cpu_seconds": cpu,
        "workers": workers,
        "mode": mode if workers > 1 else "in_memory",
        "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def measure(manifest: str, workers: int, code: str, mode: str = "multi_processing") -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [code, os.environ.get("PYTHONPATH")])))
    # run as a script, so that `audit` comes from `code` (another checkout has no bench.audit_data), from a
    # copy outside bench/: a script's folder leads sys.path, and bench/audit.py would shadow the package
    with tempfile.TemporaryDirectory(prefix="audit-data-child-") as d:
        script = shutil.copy(os.path.abspath(__file__), os.path.join(d, "audit_data_child.py"))
        out = subprocess.run(
            [sys.executable, script, "--child", json.dumps([manifest, workers, mode])],
            cwd=code,
            env=env,
            capture_output=True,
            text=True,
        )
    if out.returncode:
        raise SystemExit(f"error: the timed pass failed ({workers} worker(s), {mode}): {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--records",
        type=int,
        nargs="+",
        default=[4096],
        help="dataset sizes; with two, also the CPU per record at the margin (start-up excluded)",
    )
    p.add_argument("--seq_len", type=int, default=8192)
    p.add_argument("--shards", type=int, default=8, help="training shards")
    p.add_argument(
        "--heldout_shards",
        type=int,
        default=1,
        help="held-out shards (1/16 of the records): the held-out pass runs before the training one, "
        "so with fewer held-out shards than workers it is a serial phase",
    )
    p.add_argument(
        "--heldout_fraction",
        type=float,
        default=1 / 16,
        help="of the records held out (OLMo 3 stage 1's mixture: 0.0005); the held-out index is built "
        "between the two passes and copied to every worker, so it does not divide by the workers",
    )
    p.add_argument("--median_tokens", type=float, default=400.0, help="median document length (log-normal, σ = 1)")
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--modes",
        nargs="+",
        default=["multi_processing"],
        help="--direct_running_mode for more than one worker (multi_processing, multi_threading)",
    )
    p.add_argument("--baseline_code", help="another checkout (e.g. main) to time on the same data, 1 process")
    p.add_argument("--dir", help="write (or reuse) the data here (one folder per size)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:  # run as a script from a copy outside bench/ (see `measure`)
        print(json.dumps(child(*json.loads(a.child))))
        return
    tmp = None if a.dir else tempfile.TemporaryDirectory(prefix="audit-data-")
    root = a.dir or tmp.name  # type: ignore[union-attr]  # tmp is made exactly when a.dir is not given
    configs = (
        [("baseline " + a.baseline_code, os.path.abspath(a.baseline_code), 1, "in_memory")] if a.baseline_code else []
    )
    configs += [
        (f"beam, {w} worker{'s' * (w > 1)} ({mode})", ROOT, w, mode)
        for w in a.workers
        for mode in (a.modes if w > 1 else ["in_memory"])
    ]
    results: dict[str, list[dict]] = {name: [] for name, *_ in configs}
    for n in a.records:
        layout = "" if a.heldout_shards == 1 and a.shards == 8 else f"-shards-{a.shards}-{a.heldout_shards}"
        layout += "" if a.heldout_fraction == 1 / 16 else f"-heldout-{a.heldout_fraction:g}"
        folder = os.path.join(root, f"records-{n}{layout}")
        manifest = os.path.join(folder, "manifest.json")
        if not os.path.exists(manifest):
            write_data(
                folder,
                n,
                a.seq_len,
                a.shards,
                median_tokens=a.median_tokens,
                heldout_shards=a.heldout_shards,
                heldout_fraction=a.heldout_fraction,
            )
        la = os.getloadavg()
        print(f"{n} records: load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} on {os.cpu_count()} cores")
        one = None
        for name, code, w, mode in configs:
            r = measure(manifest, w, code, mode)
            results[name].append(r)
            rate = r["records"] / r["seconds"]
            if name.startswith("beam") and w == 1:
                one = rate
            extra = f", {rate / one:.2f}× 1 worker" if one and name.startswith("beam") and w > 1 else ""
            print(
                f"  {name}: {r['records']} records of {a.seq_len} tokens in {r['seconds']:.1f} s = {rate:.0f} "
                f"records/s{extra}; CPU {1e3 * r['cpu_seconds'] / r['records']:.3f} ms/record; "
                f"peak RSS {r['rss_peak_mib']:.0f} MiB"
            )
    if len(a.records) > 1:
        print("At the margin (between the smallest and the largest size: start-up and fixed samples excluded):")
        one = None
        for name, rs in results.items():
            lo, hi = rs[0], rs[-1]
            rate = (hi["records"] - lo["records"]) / max(hi["seconds"] - lo["seconds"], 1e-9)
            one = rate if name.startswith("beam") and hi["workers"] == 1 else one
            extra = f" = {rate / one:.2f}× 1 worker" if one and name.startswith("beam") and hi["workers"] > 1 else ""
            print(
                f"  {name}: {1e3 * (hi['cpu_seconds'] - lo['cpu_seconds']) / (hi['records'] - lo['records']):.3f} "
                f"ms/record of CPU; {rate:.0f} records/s{extra}"
            )
    if tmp:
        tmp.cleanup()


if __name__ == "__main__":
    main()
