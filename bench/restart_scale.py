"""A restart at stage-1 shape, before and after issue 41, on this machine, extrapolated to stage 1.

    .venv/bin/python -m bench.restart_scale [--ckpt_gib 1] [--hosts 256] [--log_lines 1000000]
                                            [--shards 40000] [--tmp /tmp]

Synthetic, stage-1 shaped: a checkpoint step of ``--ckpt_gib`` GiB laid out as orbax writes it from
``--hosts`` processes (``params/ocdbt.process_<h>/d/...`` plus the primary's metadata), per-host
data logs of ``--log_lines`` lines, ``--shards`` shard files (tiny: verification *bytes* are
counted from stage 1's shard size, the selection and its memory are measured on the real files).
Three parts, each the old code path (kept here as it was) against today's:

1. the SIGTERM save's added wait: the seal. Before: the primary hashes every file of the step.
   After: each process hashes its own files (files.hash_share, all at once on real hosts: the
   critical path is the slowest host's share, measured host by host here) and the primary merges
   the shares and hashes the finalization files (files.seal).
2. the resume's log work: a data log of ``--log_lines`` lines cut back by the steps since the last
   checkpoint (``--cut`` lines). Before: every line parsed, the kept ones rewritten. After: cut in
   place (logs.truncate_jsonl); an elastic restart does this once per old host's log; summary.json
   from the metrics log's tail.
3. the start-up's data verification: bytes hashed and shards opened per host at a fresh start, a
   resume and an elastic restart (256 → 128 hosts), from the real selection code (verify.to_hash,
   verify.assign); peak memory of the selection with its record for ``--shards`` real files.
4. a shard's open: bytes read with ArrayRecord's default footer prefetch and without it.

Times are page-cached on this machine (2 shared cores): hashing is CPU-bound here, so the figures
are an upper bound of the CPU and a lower bound of a network read; the extrapolation states both.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

from contract import TRAIN
from dataloader import verify
from trainer import logs
from trainer.checkpointing import files

STAGE1_CKPT_GB = 88.0  # 7.298B params fp32 + 2 Adam moments fp32 (+ metadata)
STAGE1_SHARD_BYTES = 24e12 / 40_000  # ~24 TB of train shards over 40,000 shards: 0.6 GB each
GB = 1e9


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def peak_of(fn):
    """(peak Python allocation in bytes, result) of fn()."""
    tracemalloc.start()
    try:
        out = fn()
        return tracemalloc.get_traced_memory()[1], out
    finally:
        tracemalloc.stop()


# ----------------------------------------------------------------------------- 1. the seal


def write_step(step: Path, total: int, hosts: int) -> None:
    """A step as orbax leaves it for the seal: per-process array files, the primary's metadata."""
    block = os.urandom(1 << 20)
    per_host = total // hosts
    for h in range(hosts):
        d = step / "params" / f"ocdbt.process_{h}" / "d"
        d.mkdir(parents=True)
        with open(d / f"{h:08x}", "wb") as f:
            left = per_host
            while left:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
        (d.parent / "manifest.ocdbt").write_bytes(b"m" * 200)
        (step / "params" / "array_metadatas").mkdir(exist_ok=True)
        (step / "params" / "array_metadatas" / f"process_{h}").write_bytes(b"a" * 300)
    for rel in ("params/_METADATA", "params/_sharding", "params/manifest.ocdbt", "meta/metadata", "data/metadata"):
        (step / rel).parent.mkdir(parents=True, exist_ok=True)
        (step / rel).write_bytes(b"x" * 2000)


def old_seal(step: Path) -> None:
    """Before: the primary hashes every file of the step (8 threads), then writes the checksums."""
    rels = files.step_files(step)
    digests = files._hash_files(step, rels)
    files._write_checksum_file(step, dict(zip(rels, digests)))


def bench_seal(root: Path, gib: float, hosts: int) -> dict:
    step = root / "1.orbax-checkpoint-tmp"
    total = int(gib * 2**30)
    write_step(step, total, hosts)
    before, _ = timed(lambda: old_seal(step))
    (step / files.CHECKSUMS).unlink()
    shares = []
    for h in range(hosts):  # on real hosts all at once: the critical path is the slowest one
        shares.append(timed(lambda h=h: files.hash_share(step, h)))
    seal_s, seal_bytes = timed(lambda: files.seal(step))
    recorded = json.loads((step / files.CHECKSUMS).read_text())["files"]
    assert len(recorded) == len(files.step_files(step))
    share_s = max(t for t, _ in shares)
    share_bytes = max(b for _, b in shares)
    scale = STAGE1_CKPT_GB * GB / total
    shutil.rmtree(step)
    return {
        "bytes": total,
        "before_s": before,
        "share_max_s": share_s,
        "share_bytes": share_bytes,
        "seal_s": seal_s,
        "seal_bytes": seal_bytes,
        "after_s": share_s + seal_s,
        # stage 1: the old seal reads 88 GB on one host; the new critical path is one host's share
        # (88 GB / hosts) plus the merge (its cost grows with the number of hosts, not the bytes)
        "stage1_before_s": before * scale,
        "stage1_after_s": share_s * scale + seal_s,
        "stage1_share_gb": STAGE1_CKPT_GB / hosts,
    }


# ----------------------------------------------------------------------------- 2. the logs


def old_truncate(path: Path, before_step: int) -> None:
    """Before: every line loaded as a dict, the kept ones rewritten (atomic)."""
    keep = [r for r in logs.read_jsonl(path) if r["step"] < before_step]
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in keep)
    os.replace(tmp, path)


def write_log(path: Path, lines: int, row) -> None:
    with open(path, "w") as f:
        for s in range(lines):
            f.write(json.dumps(row(s)) + "\n")


def data_row(s: int) -> dict:  # one host's data-log line at G/H = 512/256 = 2 rows
    return {"step": s, "index": [s * 512 + 7, s * 512 + 300], "example": [s * 1009 % 99991, s * 2003 % 99991]}


def metrics_row(s: int) -> dict:
    r = {"step": s, "loss": 2.5 + 1 / (s + 1), "lr": 3e-4, "grad_norm": 0.31, "tokens": 4194304 * (s + 1)}
    r.update({k: 1.234567 for k in ("tokens_per_s", "step_time_s", "data_time_s", "tflops", "mfu", "z_loss")})
    if s % 1000 == 999:
        r["heldout_loss"] = 2.7
    return r


def bench_logs(root: Path, lines: int, cut: int, hosts: int) -> dict:
    out: dict = {"lines": lines, "cut": cut}
    path, copy = root / "host-00000-of-00256.jsonl", root / "copy.jsonl"
    write_log(path, lines, data_row)
    out["log_bytes"] = path.stat().st_size
    before_step = lines - cut
    shutil.copy(path, copy)
    out["before_s"], _ = timed(lambda: old_truncate(copy, before_step))
    small = root / "small.jsonl"  # the old cut's memory, on a tenth of the log (tracemalloc slows it)
    write_log(small, lines // 10, data_row)
    out["before_peak_bytes_tenth"], _ = peak_of(lambda: old_truncate(small, lines // 10 - cut))
    shutil.copy(path, copy)
    out["after_s"], removed = timed(lambda: logs.truncate_jsonl(copy, before_step))
    assert removed == cut
    old_truncate(path, before_step)
    assert copy.read_bytes() == path.read_bytes()  # the same bytes as the old rewrite
    shutil.copy(path, copy)
    out["after_peak_bytes"], _ = peak_of(lambda: logs.truncate_jsonl(copy, before_step - cut))
    out["again_s"], removed = timed(lambda: logs.truncate_jsonl(path, before_step))  # a later restart
    assert removed == 0
    # an elastic restart: the old host count's logs are cut once each (by the primary)
    out["elastic_before_s"] = hosts * out["before_s"]
    out["elastic_after_s"] = hosts * out["after_s"]
    out["elastic_again_s"] = hosts * out["again_s"]
    metrics = root / "metrics.jsonl"
    write_log(metrics, lines, metrics_row)
    out["metrics_bytes"] = metrics.stat().st_size
    out["summary_before_s"], _ = timed(lambda: logs.last_losses(logs.read_jsonl(metrics)))
    out["summary_after_s"], summary = timed(lambda: logs.summary_of_tail(metrics))
    assert summary["heldout_loss"] == 2.7 and len(summary["last_losses"]) == logs.LAST_LOSSES
    for p in (path, copy, small, metrics):
        p.unlink()
    return out


# ----------------------------------------------------------------------------- 3. the data verification


def per_host(todo: list[int], sizes: list[int], hosts: int) -> tuple[int, int]:
    """(most shards, most bytes) one host hashes of ``todo`` (verify.assign, no budget)."""
    counts, nbytes = [], []
    for h in range(hosts):
        mine = [todo[j] for j in verify.assign([sizes[i] for i in todo], h, hosts, None)]
        counts.append(len(mine))
        nbytes.append(sum(sizes[i] for i in mine))
    return max(counts), max(nbytes)


def bench_verification(root: Path, n: int, hosts: int, sample: int) -> dict:
    folder = root / "shards"
    folder.mkdir()
    shards = []
    for i in range(n):
        path = folder / f"train-{i:05d}-of-{n:05d}.arrayrecord"
        path.write_bytes(i.to_bytes(8, "little"))
        shards.append(
            verify.Shard(str(path), hashlib.sha256(path.read_bytes()).hexdigest(), 1, 8192, "m", "s", TRAIN, i)
        )
    sizes = [int(STAGE1_SHARD_BYTES)] * n
    record_path = str(root / verify.RECORD_NAME)

    def first_start():
        stamps = [verify.stamp(s.path) for s in shards]
        todo = verify.to_hash(shards, stamps, {}, sample, 1)
        chosen = set(todo)
        codes = [verify.HASHED if i in chosen else verify.RECORDED for i in range(n)]
        record = verify.new_record(shards, stamps, codes, {})
        verify.write_record(record_path, record)
        return todo

    def later_start(seed):
        record = verify.read_record(record_path)
        stamps = [verify.stamp(s.path) for s in shards]
        return verify.to_hash(shards, stamps, record, sample, seed)

    out: dict = {"shards": n, "hosts": hosts, "sample": sample}
    out["fresh_s"], todo = timed(first_start)
    out["fresh_shards"], out["fresh_bytes"] = per_host(todo, sizes, hosts)
    out["resume_s"], _ = timed(lambda: later_start(2))
    out["resume_peak_bytes"], todo = peak_of(lambda: later_start(2))
    out["resume_shards"], out["resume_bytes"] = per_host(todo, sizes, hosts)
    out["elastic_shards"], out["elastic_bytes"] = per_host(later_start(3), sizes, hosts // 2)
    out["record_bytes"] = os.path.getsize(record_path)
    # before: verify_data_gib unset hashed every shard at every start (each host its share); the
    # old sizes gather held every process's sizes on every host
    out["before_shards"], out["before_bytes"] = per_host(list(range(n)), sizes, hosts)
    out["before_elastic_bytes"] = per_host(list(range(n)), sizes, hosts // 2)[1]
    out["before_gather_bytes"] = hosts * n * 8
    out["after_broadcast_bytes"] = n * 16
    shutil.rmtree(folder)
    return out


# ----------------------------------------------------------------------------- 4. a shard's open


def bytes_read() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar"))


def bench_open(root: Path, records: int = 20_000) -> dict:
    """Bytes read to open a shard of 32 KiB records and read its first and last: ArrayRecord's
    defaults (before) against READER_OPTIONS' (after, dataloader.source)."""
    from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

    path, record = str(root / "shard.arrayrecord"), os.urandom(32768)
    writer = ArrayRecordWriter(path, "group_size:1")
    for _ in range(records):
        writer.write(record)
    writer.close()
    out: dict = {"records": records}
    for key, options in (
        ("before", "readahead_buffer_size:0"),
        ("after", "readahead_buffer_size:0,footer_prefetch_bytes:0"),
    ):
        start = bytes_read()
        reader = ArrayRecordReader(path, options)
        out[f"{key}_open_bytes"] = bytes_read() - start
        reader.read([0])
        reader.read([records - 1])
        reader.close()
        out[f"{key}_bytes"] = bytes_read() - start
    os.remove(path)
    return out


# ----------------------------------------------------------------------------- report


def report(seal: dict, lg: dict, ver: dict, hosts: int, op: dict) -> str:
    g = 2**30
    lines = [
        f"SIGTERM save, the seal's added wait ({seal['bytes'] / g:.2f} GiB step, {hosts} simulated processes):",
        f"  before: primary hashes all {seal['bytes'] / g:.2f} GiB: {seal['before_s']:.2f} s "
        f"-> stage 1 ({STAGE1_CKPT_GB:.0f} GB): {seal['stage1_before_s']:.0f} s at this box's page-cached rate "
        f"(44-88 s at 1-2 GB/s from GCS, 440 s at 0.2 GB/s)",
        f"  after:  slowest process's share {seal['share_bytes'] / 2**20:.1f} MiB in {seal['share_max_s']:.3f} s, "
        f"then the merge + finalization files ({seal['seal_bytes'] / 1e3:.0f} kB) in {seal['seal_s']:.3f} s "
        f"-> stage 1: {seal['stage1_after_s']:.1f} s (an upper bound: fixed costs scaled too; each host {seal['stage1_share_gb']:.2f} GB; "
        f"{seal['stage1_share_gb'] / 0.2:.1f} s even at 0.2 GB/s) [target <= 30 s]",
        f"Logs ({lg['lines']:,} lines, {lg['log_bytes'] / 2**20:.0f} MiB per host's data log; cut {lg['cut']} lines):",
        f"  before: rewrite {lg['before_s']:.2f} s, peak {lg['before_peak_bytes_tenth'] * 10 / 2**20:.0f} MiB "
        f"(x10 of {lg['before_peak_bytes_tenth'] / 2**20:.0f} MiB measured on a tenth)",
        f"  after:  in place {lg['after_s'] * 1e3:.1f} ms, peak {lg['after_peak_bytes'] / 2**10:.0f} KiB; "
        f"a log already cut: {lg['again_s'] * 1e3:.2f} ms",
        f"  elastic restart ({hosts} old logs): before {lg['elastic_before_s'] / 60:.1f} min, "
        f"after {lg['elastic_after_s']:.2f} s once, {lg['elastic_again_s']:.3f} s at each later restart "
        "[target <= 2 min]",
        f"  summary.json from a {lg['metrics_bytes'] / 2**20:.0f} MiB metrics.jsonl: before {lg['summary_before_s']:.2f} s "
        f"(whole log), after {lg['summary_after_s'] * 1e3:.2f} ms (its tail)",
        f"Data verification ({ver['shards']:,} shards of {STAGE1_SHARD_BYTES / GB:.1f} GB, {hosts} hosts, "
        f"sample {ver['sample']}):",
        f"  before (every start): {ver['before_shards']} shards, {ver['before_bytes'] / GB:.0f} GB per host "
        f"({ver['before_elastic_bytes'] / GB:.0f} GB on {hosts // 2} hosts); sizes gathered: "
        f"{ver['before_gather_bytes'] / 2**20:.0f} MiB per host",
        f"  after, fresh start: {ver['fresh_shards']} shards, {ver['fresh_bytes'] / GB:.0f} GB per host "
        f"(once per run); selection + record for {ver['shards']:,} files: {ver['fresh_s']:.2f} s",
        f"  after, resume: at most {ver['resume_shards']} shard(s), {ver['resume_bytes'] / GB:.2f} GB per host "
        f"[target <= 1 GB]; record {ver['record_bytes'] / 2**20:.1f} MiB read in {ver['resume_s']:.2f} s, "
        f"peak {ver['resume_peak_bytes'] / 2**20:.0f} MiB [target <= 256 MiB]; stamps broadcast "
        f"{ver['after_broadcast_bytes'] / 2**20:.1f} MiB",
        f"  after, elastic restart ({hosts} -> {hosts // 2} hosts): at most {ver['elastic_shards']} shard(s), "
        f"{ver['elastic_bytes'] / GB:.2f} GB per host",
        f"A shard's open ({op['records']:,} records of 32 KiB) and its first and last record: before "
        f"{op['before_bytes'] / 1e3:.0f} kB (open {op['before_open_bytes'] / 1e3:.0f} kB), after "
        f"{op['after_bytes'] / 1e3:.0f} kB (open {op['after_open_bytes'] / 1e3:.0f} kB)",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt_gib", type=float, default=1.0)
    ap.add_argument("--hosts", type=int, default=256)
    ap.add_argument("--log_lines", type=int, default=1_000_000)
    ap.add_argument("--cut", type=int, default=999, help="lines since the last checkpoint (checkpoint_every 1000)")
    ap.add_argument("--shards", type=int, default=40_000)
    ap.add_argument("--sample", type=int, default=64)
    ap.add_argument("--tmp", default=tempfile.gettempdir())
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args()
    random.seed(0)
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        root = Path(tmp)
        seal = bench_seal(root, args.ckpt_gib, args.hosts)
        lg = bench_logs(root, args.log_lines, args.cut, args.hosts)
        ver = bench_verification(root, args.shards, args.hosts, args.sample)
        op = bench_open(root)
    print(report(seal, lg, ver, args.hosts, op))
    if args.json:
        Path(args.json).write_text(json.dumps({"seal": seal, "logs": lg, "verification": ver, "open": op}, indent=1))


if __name__ == "__main__":
    main()
