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
   kept as the run goes (logs.RunningSummary) against read from the metrics log's tail; a later
   restart after an elastic one with the record of the old logs' cuts (data_logs_settled.json).
3. the start-up's data verification: bytes hashed and shards opened per host at a fresh start, a
   resume and an elastic restart (256 → 128 hosts), from the real selection code (verify.to_hash,
   verify.assign); peak memory of the selection with its record for ``--shards`` real files.
4. a shard's reader, by ArrayRecord's reader options: bytes read by an open and by a record, memory
   an open reader holds (what a training reader's reopen past ``max_open_shards`` costs).

Times are page-cached on this machine (2 shared cores): hashing is CPU-bound here, so the figures
are an upper bound of the CPU and a lower bound of a network read; the extrapolation states both.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import json
import multiprocessing
import os
import random
import shutil
import tempfile
import time
import tracemalloc
from pathlib import Path

from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

from contract import TRAIN, RunDir, data_log_name, parse_data_log_name
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
    out.update(bench_elastic_again(root, hosts, before_step))
    metrics = RunDir(root).metrics  # the run directory's name for it (contract.rundir)
    write_log(metrics, lines, metrics_row)
    out["metrics_bytes"] = metrics.stat().st_size
    out["summary_before_s"], _ = timed(lambda: logs.last_losses(logs.read_jsonl(metrics)))
    out["summary_tail_s"], summary = timed(lambda: logs.summary_of_tail(metrics))
    assert summary["heldout_loss"] == 2.7 and len(summary["last_losses"]) == logs.LAST_LOSSES
    # a run that never evaluates: the tail read walks the whole log backwards at the run's end
    write_log(metrics, lines, lambda s: {k: v for k, v in metrics_row(s).items() if k != "heldout_loss"})
    out["summary_noeval_tail_s"], _ = timed(lambda: logs.summary_of_tail(metrics))
    # after: kept as the run goes (an add per row the loop logs), nothing read at the end
    rows = [metrics_row(s) for s in range(10_000)]
    kept = logs.RunningSummary()

    def add_all() -> None:
        for r in rows:
            kept.add(r)

    add_s, _ = timed(add_all)
    out["summary_add_us"] = add_s / len(rows) * 1e6
    out["summary_after_s"], got = timed(kept.to_json)
    assert got["heldout_loss"] == 2.7 and len(got["last_losses"]) == logs.LAST_LOSSES
    for p in (path, copy, small, metrics):
        p.unlink()
    return out


def bench_elastic_again(root: Path, hosts: int, before_step: int) -> dict:
    """A later restart after an elastic one (``hosts`` → ``hosts // 2``): before, every old log's
    last line read again (truncate_jsonl per log, the old truncate_other_data_logs); after, the
    record of the first restart's cuts (data_logs_settled.json): a stat per log, no open."""
    run = RunDir(root / "elastic")
    run.data_log.mkdir(parents=True)
    for h in range(hosts):  # already cut (short logs: a cut log's cost is its last line, not its length)
        write_log(run.data_log / data_log_name(h, hosts), 100, data_row)
    for h in range(hosts // 2):
        (run.data_log / data_log_name(h, hosts // 2)).write_text("")
    old = [p for p in run.data_logs() if (parse_data_log_name(p.name) or (0, 0))[1] == hosts]
    again_before, _ = timed(lambda: [logs.truncate_jsonl(p, before_step) for p in old])
    first, cut = timed(lambda: logs.truncate_other_data_logs(run, hosts // 2, before_step))
    assert cut == hosts
    opened: list[str] = []
    real = logs.truncate_jsonl

    def counting(path: str | Path, before_step: int) -> int:
        opened.append(str(path))
        return real(path, before_step)

    logs.truncate_jsonl = counting
    try:
        again_after, cut = timed(lambda: logs.truncate_other_data_logs(run, hosts // 2, before_step))
    finally:
        logs.truncate_jsonl = real
    assert cut == 0 and not opened
    record_bytes = run.data_logs_settled.stat().st_size
    shutil.rmtree(run.path)
    return {
        "elastic_again_before_s": again_before,
        "elastic_first_s": first,
        "elastic_again_after_s": again_after,
        "elastic_again_opened": len(opened),
        "settled_bytes": record_bytes,
    }


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


def rss_bytes() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS"))


# ArrayRecord 0.8.6's reader options measured (Grain's ArrayRecordDataSource adds readahead_buffer_size:0
# and file_reader_buffer_size 32 KiB to every reader it makes; the same here)
OPEN_OPTIONS = {
    "default": "readahead_buffer_size:0",
    "footer_prefetch_bytes:0 (used)": "readahead_buffer_size:0,footer_prefetch_bytes:0",
    "+ max_parallelism:0": "readahead_buffer_size:0,footer_prefetch_bytes:0,max_parallelism:0",
    "index_storage_option:offloaded": "readahead_buffer_size:0,footer_prefetch_bytes:0,index_storage_option:offloaded",
}


def bench_open(root: Path, records: int = 20_000, held: int = 100) -> dict:
    """For each of OPEN_OPTIONS, on a shard of ``records`` 32 KiB records: bytes read by the open
    (+ its first record), by each record read through an open reader, and the memory an open
    reader holds (RSS over ``held`` open readers)."""
    path, record = str(root / "shard.arrayrecord"), os.urandom(32768)
    writer = ArrayRecordWriter(path, "group_size:1")
    for _ in range(records):
        writer.write(record)
    writer.close()
    out: dict = {"records": records, "options": {}}
    kept: list = []
    picks = [records // 4, 17, records - 1, records // 2 + 3]
    for key, options in OPEN_OPTIONS.items():
        start = bytes_read()
        reader = ArrayRecordReader(path, options, file_reader_buffer_size=32768)
        reader.read([0])
        opened = bytes_read() - start
        start = bytes_read()
        for i in picks:
            reader.read([i])
        per_record = (bytes_read() - start) / len(picks)
        reader.close()
        before = rss_bytes()  # (readers kept open to the end: memory freed by one option's is not reused)
        readers = [ArrayRecordReader(path, options, file_reader_buffer_size=32768) for _ in range(held)]
        for r in readers:
            r.read([1])
        memory = max(0, rss_bytes() - before) / held
        kept.extend(readers)
        out["options"][key] = {"open_bytes": opened, "record_bytes": per_record, "memory_bytes": memory}
    for r in kept:
        r.close()
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
        f"after {lg['elastic_after_s']:.2f} s once [target <= 2 min]; each later restart: before "
        f"{lg['elastic_again_before_s']:.3f} s ({hosts} logs' last lines read), after "
        f"{lg['elastic_again_after_s']:.4f} s, {lg['elastic_again_opened']} logs opened "
        f"(record {lg['settled_bytes'] / 1e3:.0f} kB, written in the first restart's {lg['elastic_first_s']:.3f} s)",
        f"  summary.json from a {lg['metrics_bytes'] / 2**20:.0f} MiB metrics.jsonl: whole log {lg['summary_before_s']:.2f} s, "
        f"its tail {lg['summary_tail_s'] * 1e3:.2f} ms, its tail without evaluations "
        f"{lg['summary_noeval_tail_s']:.2f} s; kept as the run goes: {lg['summary_add_us']:.2f} us per row, "
        f"{lg['summary_after_s'] * 1e3:.3f} ms at the end, 0 bytes read",
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
        f"A shard of {op['records']:,} records of 32 KiB, by ArrayRecord reader options: bytes read by an open "
        "(+ its first record), by a record through an open reader, memory an open reader holds:",
        *(
            f"  {k}: open {v['open_bytes'] / 1e3:.0f} kB, a record {v['record_bytes'] / 1e3:.1f} kB, "
            f"memory {v['memory_bytes'] / 1e3:.0f} kB"
            for k, v in op["options"].items()
        ),
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
        # in a fresh process: an open reader's memory is RSS growth, which a heap the parts above
        # grew and freed would absorb
        with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            op = pool.submit(bench_open, root).result()
    print(report(seal, lg, ver, args.hosts, op))
    if args.json:
        Path(args.json).write_text(json.dumps({"seal": seal, "logs": lg, "verification": ver, "open": op}, indent=1))


if __name__ == "__main__":
    main()
