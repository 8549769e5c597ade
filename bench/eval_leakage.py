"""Audit benchmark, eval leakage (check 8): CPU per record of the data side's shard pass with the
check off and on (decon, and the 13-gram cross-check), on natural text at seq 8192, and the
detector's memory per worker.

    .venv/bin/python -m bench.eval_leakage [--records 256 2048] [--tasks DIR ...] [--modes decon ngram13]
        [--repeat 3] [--dir DIR]

Data: the embedded sample's prose, code and math documents (pipelines.sample), tokenized with
dolma2, shuffled and repeated to the size asked, packed as the pipeline packs them (EOS after every
document, PAD only at a shard's end), one training and one held-out shard (1/16). One process per
task folder runs the data pass (DirectRunner, one worker, in process) with the check off and in each
mode, alternating, `--repeat` rounds, keeping the least CPU (process time) of each; the CPU per
record is taken at the margin ((CPU(large) − CPU(small)) ÷ (records(large) − records(small))), so
start-up and the detector's build (once per worker, a fixed cost, reported on its own) are excluded.
The passes run with `--temp_location` (a temporary folder), as on Dataflow: the workers read the
index from a file there instead of unpickling it with the DoFn (bz2 over 15 MB for the 26 tasks,
5–9 s of CPU per pass that varied with the machine's load more than the margin being measured).
The audit's fixed-size samples (the held-out 13-gram overlap,
tokens per byte) are set to 0 documents: on a small dataset they cover every document, at stage 1 a
vanishing share. Ratios are the point: the machine may be shared.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = os.path.join(ROOT, "trainer", "configs", "downstream", "tiny")
STAGE1_RECORDS = 7.24e8  # OLMo 3 stage 1's training records at seq 8192 (bench/RESULTS.md)


def sample_docs() -> list[np.ndarray]:
    from pipelines import sample  # lazy: the parent's writer stays out of the measured child
    from pipelines.dolma2_tokenizer import dolma2

    enc = dolma2()
    texts = [d["text"] for gen in (sample.prose_docs(), sample.code_docs(), sample.math_docs()) for d in gen]
    return [np.asarray(enc.encode_ordinary(t), np.uint32) for t in texts]


def write_data(root: str, records: int, seq_len: int = 8192, seed: int = 0) -> str:
    """root/manifest.json + one training and one held-out shard of sample documents."""
    # lazy: the parent's writer stays out of the measured child
    from array_record.python.array_record_module import ArrayRecordWriter

    import contract  # lazy: the parent's writer stays out of the measured child
    from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID
    from pipelines.manifest_assembly import tokenizer_info

    docs = sample_docs()
    rng = np.random.default_rng(seed)
    entry: dict[str, Any] = {"counts": {}, "tokens": {"train": 0, "heldout": 0, "padding": 0}, "splits": {}}
    counts = {"train": 0, "heldout": 0}
    for split, n in (("heldout", max(1, records // 16)), ("train", records - max(1, records // 16))):
        want, picked, total = n * seq_len - seq_len // 2, [], 0
        while total < want:
            for i in rng.permutation(len(docs)).tolist():
                if total + docs[i].size + 1 > want:
                    break
                picked.append(docs[i])
                total += docs[i].size + 1
            else:
                continue
            break
        flat = np.concatenate([np.append(d, np.uint32(EOS_ID)) for d in picked]).astype(np.uint32)
        n_rec = -(-flat.size // seq_len)
        recs = np.full(n_rec * seq_len, PAD_ID, np.uint32)
        recs[: flat.size] = flat
        rel = f"web/{split}-00000-of-00001.arrayrecord"
        path = os.path.join(root, rel)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        w = ArrayRecordWriter(path, "group_size:1")
        for r in recs.reshape(n_rec, seq_len):
            w.write(r.tobytes())
        w.close()
        with open(path, "rb") as f:
            sha = hashlib.file_digest(f, "sha256").hexdigest()
        entry["splits"][split] = {"examples": n_rec, "shards": [{"path": rel, "records": n_rec, "sha256": sha}]}
        entry["tokens"][split] = int(flat.size)
        entry["tokens"]["padding"] += n_rec * seq_len - int(flat.size)
        counts[split] = len(picked)
    entry["counts"] = {**counts, "documents": sum(counts.values()), "duplicates": 0, "rejected": {}}
    manifest = {
        "format_version": 1,
        "seq_len": seq_len,
        "record_format": "uint32-le[seq_len]",
        "tokenizer": tokenizer_info("dolma2"),  # the block the tokenize job writes
        "mixture": {
            "name": "bench-leakage",
            "tokenizer": "dolma2",
            "seq_len": seq_len,
            "seed": seed,
            "heldout_fraction": 1 / 16,
            "dedup": "exact",
            "sources": [{"name": "web", "paths": ["bench://web"], "weight": 1.0, "max_repetition": 4.0}],
        },
        "sources": {"web": entry},
    }
    path = os.path.join(root, "manifest.json")
    with open(path, "w") as f:
        json.dump(contract.with_fingerprint(manifest), f)
    return path


def child(manifests: list[str], tasks: str, modes: list[str], repeat: int) -> dict:
    """In this process: for `repeat` rounds, every size, the data pass with the check off and in
    each mode (alternating, so that a change in the machine's load hits all of them alike); the
    least CPU of each. The detector is built (and timed) before the passes; its structures are
    shared per process (Detector.shared), so the passes time only the scoring."""
    from audit import scan as scan_mod  # lazy: the audit loads in the measured child only
    from audit.contamination import ContaminationConfig
    from audit.eval_leakage import EvalLeakageConfig
    from audit.shard_reader import load_manifest
    from pipelines.leakage import Detector, DetectorConfig, build

    # the fixed-size samples (13-gram overlap, tokens per byte) cover every document of a small
    # dataset, where at stage 1 they are a vanishing share: off here, so that what is measured per
    # record is what a 24 TB pass pays per record
    scan_mod.TOKENS_PER_BYTE_SAMPLE_DOCS = 0
    t0 = time.process_time()
    index = build(tasks)
    leaks: dict[str, Any] = {"off": None}
    info: dict[str, Any] = {"index_build_cpu_seconds": time.process_time() - t0, "items": index.items}
    for mode in modes:
        cfg = EvalLeakageConfig(tasks, DetectorConfig(mode=mode))
        t0 = time.process_time()
        det = Detector.shared(index, cfg.detector)  # kept for the passes (two modes at most)
        info[mode] = {
            "detector_build_cpu_seconds": time.process_time() - t0,
            "items_indexed": int(det.indexed.sum()),
            "bytes_per_worker": det.nbytes(),
        }
        leaks[mode] = (cfg, index)
    ms = [load_manifest(m) for m in manifests]
    temp = tempfile.mkdtemp(prefix="bench-leakage-temp-")  # the index file the workers read (--temp_location)
    cpu: dict[str, list[float]] = {name: [float("inf")] * len(ms) for name in leaks}
    records = [0] * len(ms)
    scored: dict[str, list[int]] = {name: [0] * len(ms) for name in leaks}
    for _ in range(repeat):
        for k, m in enumerate(ms):
            for name, leak in leaks.items():
                if leak is not None:  # this mode's structures (built above) in the per-process cache
                    Detector.shared(leak[1], leak[0].detector)
                t0 = time.process_time()
                cc = ContaminationConfig(heldout_sample_docs=0, train_sample_docs=0)
                r = scan_mod.scan(m, cc, beam_args=[f"--temp_location={temp}"], leak=leak)
                cpu[name][k] = min(cpu[name][k], time.process_time() - t0)
                records[k] = int(r.integrity.figures["records_checked"])
                if r.task_contamination is not None:
                    f = r.task_contamination.figures
                    scored[name][k] = int(f["scored_documents"]) + r.task_contamination.failure_count
    info["rss_peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    shutil.rmtree(temp, ignore_errors=True)
    return {"records": records, "cpu": cpu, "scored": scored, "info": info}


def measure(manifests: list[str], tasks: str, modes: list[str], repeat: int) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")])))
    args = json.dumps([manifests, tasks, modes, repeat])
    out = subprocess.run(
        [sys.executable, "-m", "bench.eval_leakage", "--child", args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if out.returncode:
        raise SystemExit(f"error: the timed passes failed: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--records", type=int, nargs=2, default=[256, 2048], help="two dataset sizes")
    p.add_argument("--tasks", nargs="+", default=[TINY], help="task folders to check against (default: tiny)")
    p.add_argument("--modes", nargs="+", default=["decon", "ngram13"])
    p.add_argument("--repeat", type=int, default=3, help="rounds; the least CPU of each pass is kept")
    p.add_argument("--dir", help="write (or reuse) the data here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(child(*json.loads(a.child))))
        return
    tmp = None if a.dir else tempfile.TemporaryDirectory(prefix="bench-leakage-")
    root = a.dir or tmp.name  # type: ignore[union-attr]
    manifests = []
    for n in a.records:
        folder = os.path.join(root, f"records-{n}")
        manifests.append(os.path.join(folder, "manifest.json"))
        if not os.path.exists(manifests[-1]):
            write_data(folder, n)
    for tasks in a.tasks:
        la = os.getloadavg()
        print(f"tasks {tasks}: load average {la[0]:.2f} {la[1]:.2f} {la[2]:.2f} on {os.cpu_count()} cores")
        r = measure(manifests, tasks, a.modes, a.repeat)
        info, (lo, hi) = r["info"], r["records"]
        print(
            f"  index: {info['items']} items, built in {info['index_build_cpu_seconds']:.1f} s CPU; peak RSS {info['rss_peak_mib']:.0f} MiB"
        )
        off = None
        for name, (c_lo, c_hi) in r["cpu"].items():
            per = (c_hi - c_lo) / (hi - lo)
            off = per if off is None else off
            extra = ""
            if name in info:
                m = info[name]
                extra = (
                    f"  {m['bytes_per_worker'] / 2**20:.1f} MiB/worker, structures built in "
                    f"{m['detector_build_cpu_seconds']:.1f} s CPU, {m['items_indexed']} items indexed, "
                    f"{r['scored'][name][1]} documents scored or flagged of the larger set"
                )
            print(
                f"  {name:8} {c_lo:6.2f} s / {c_hi:6.2f} s CPU ({lo} / {hi} records): {per * 1e3:6.3f} ms/record "
                f"at the margin, {per / off:5.2f}x off, stage 1: {per * STAGE1_RECORDS / 3600:,.0f} CPU-hours{extra}"
            )
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
