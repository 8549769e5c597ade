"""Benchmark of the tokenize-and-pack job against raw tiktoken, in the same run (not a test).

    .venv/bin/python -m bench.tokenize_job [--sizes_mb 32 128] [--workers 1 2] [--modes multi_threading multi_processing]
        [--repeats 2] [--dedup]
    .venv/bin/python -m bench.tokenize_job --encoders [--sizes_mb 32] [--engines quicktok gigatoken] [--repeats 3]
    .venv/bin/python -m bench.tokenize_job --in_bundle --sizes_mb 32 [--engines …] [--crosscheck 0 0.01 all]
    .venv/bin/python -m bench.tokenize_job --stages --sizes_mb 256 [--engines quicktok gigatoken] [--repeats 2]
        [--gigatoken_recycle_mib 64 256 0]
    .venv/bin/python -m bench.tokenize_job --paired [--sizes_mb 32 256] [--repeats 3]
        [--engines quicktok tiktoken] [--crosscheck 0.01 0 all] [--shard_compression snappy|uncompressed]

Builds Dolma-style .jsonl.zst inputs of each size (8 files per input): `--corpus distinct` (the
default) bench/exactness_corpus.py's documents, no two alike, with a vocabulary that keeps growing;
`--corpus repeated` the embedded sample's documents repeated with a unique first line (so nothing is
a duplicate, but an engine with a cache sees the same words again and again). Then it measures
  raw     tiktoken alone over the same texts, one process per core (decompression and JSON
          parsing excluded), in its two fastest forms, interleaved in the same processes:
          `encode_ordinary` (a list of ints; the issue's baseline) and `encode_to_numpy`
          with no special tokens (a uint32 buffer; the form the job uses, same ids)
  job     `python -m pipelines.tokenize` on DirectRunner's engine with W workers (threads or
          processes: `--direct_running_mode`), end to end
          (start-up, reading, validation, hashing, tokenizing, packing, writing), once per encoder
          engine (`--engines`: quicktok, gigatoken, tiktoken) and cross-check rate
          (`--crosscheck`, not for tiktoken: share of documents also encoded with tiktoken)
and prints tokens per CPU-second and per wall-second, the job/raw ratios (against both raw
forms; in `--paired` runs also against the quicktok job of the same repeat), cold (the job in a
fresh process, start-up included) and warm (the marginal rate between the two sizes, which removes
the fixed start-up cost and the encoders' first bundles), and peak RSS (VmHWM of the job process
and of each worker process it starts). Every measurement runs in a fresh subprocess; raw and job
runs alternate `--repeats` times (`--paired`: the median run is shown, and every run's ratios; the
other modes keep the best of each), because this VM's speed drifts by ±15% from minute to minute.
`--encoders`: bench.tokenize_engines (the engines alone, cold / warm / hot); `--stages`:
bench.tokenize_stages (each stage's CPU inside the job's DoFn, per engine). Run it when the
machine is quiet.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import zstandard

REPO = Path(__file__).resolve().parents[1]
FILES_PER_INPUT = 8
MB = 1 << 20

RAW_CHILD = r"""
import json, resource, sys, time, zstandard, io
from pipelines.dolma2_tokenizer import dolma2, ordinary_ids
enc = dolma2()
as_array = ordinary_ids(enc)
paths, part, parts = sys.argv[1:-2], int(sys.argv[-2]), int(sys.argv[-1])
texts = []
for p in paths:
    with open(p, "rb") as f:
        for i, line in enumerate(io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), encoding="utf-8")):
            texts.append(json.loads(line)["text"])
texts = texts[part::parts]
out = {}
for name, fn in (("list", enc.encode_ordinary), ("array", as_array)):
    t, c = time.perf_counter(), time.process_time()
    n = 0
    for text in texts:
        n += len(fn(text))
    out[name] = {"tokens": n, "seconds": time.perf_counter() - t, "cpu": time.process_time() - c}
print(json.dumps({**out, "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

JOB_CHILD = r"""
import glob, json, os, resource, sys, threading, time

def hwm_mib(pid="self"):
    # VmHWM: the process's own peak RSS (ru_maxrss would include its parent's RSS before exec)
    with open(f"/proc/{pid}/status") as f:
        return int(f.read().split("VmHWM:")[1].split()[0]) / 1024

workers, done = {}, threading.Event()
def watch():  # peak RSS of each worker process the runner starts (any descendant), until they exit
    me = str(os.getpid())
    while not done.wait(0.2):
        parent, peak = {}, {}
        for status in glob.glob("/proc/[0-9]*/status"):
            try:
                text = open(status).read()
                pid = status.split("/")[2]
                parent[pid] = text.split("PPid:")[1].split()[0]
                peak[pid] = int(text.split("VmHWM:")[1].split()[0]) / 1024
            except (OSError, IndexError):
                pass
        for pid in peak:
            p = pid
            while p in parent and p != me:
                p = parent[p]
            if p == me and pid != me:
                workers[pid] = max(workers.get(pid, 0), peak[pid])
if os.environ.get("BENCH_WATCH_WORKERS", "1") == "1":  # off in paired runs: the worker runs in this process
    threading.Thread(target=watch, daemon=True).start()
from pipelines import startup
startup.lean()  # as `python -m pipelines.tokenize` does (pipelines/startup.py)
from pipelines.tokenize import run
t = time.perf_counter()
run(sys.argv[1:])
dt = time.perf_counter() - t
done.set()
me, ch = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
cpu = me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime  # start-up included
print(json.dumps({"seconds": dt, "cpu": cpu, "rss_mb": hwm_mib(), "worker_rss_mb": max(workers.values(), default=0)}))
"""


def sample_docs() -> list[dict]:
    from pipelines.read import open_lines  # lazy: --help imports nothing heavy (test_bench_package)
    from pipelines.sample import build_sample

    root = Path(build_sample())
    docs: list[dict] = []
    for sub, suffix in (("code", ".jsonl.zst"), ("prose", ".jsonl.gz"), ("math", ".jsonl")):
        for p in sorted((root / sub).glob(f"*{suffix}")):
            docs.extend(json.loads(line) for line in open_lines(str(p)))
    return docs


def make_input(folder: Path, docs: list[dict], size_mb: int) -> list[str]:
    """Dolma-style .jsonl.zst files totalling about size_mb MiB of JSON lines."""
    folder.mkdir(parents=True)
    lines, total, k = [], 0, 0
    while total < size_mb * MB:
        d = docs[k % len(docs)]
        text = f"copy {k // len(docs)} of {d['id']}\n{d['text']}"
        line = json.dumps({"id": f"{k:09d}", "text": text, "source": "bench"}).encode() + b"\n"
        lines.append(line)
        total += len(line)
        k += 1
    per = -(-len(lines) // FILES_PER_INPUT)
    paths = []
    for i in range(FILES_PER_INPUT):
        p = folder / f"part-{i:05d}.jsonl.zst"
        p.write_bytes(zstandard.ZstdCompressor(level=3).compress(b"".join(lines[i * per : (i + 1) * per])))
        paths.append(str(p))
    return paths


def inputs(corpus: str, folder: Path, docs: list[dict], size_mb: int) -> list[str]:
    """The job's input files of `size_mb` MiB: `make_input` (repeated) or the bench corpus (distinct)."""
    if corpus == "repeated":
        return make_input(folder, docs, size_mb)
    from bench.exactness_corpus import write_bench  # lazy: --help imports nothing heavy (test_bench_package)

    return write_bench(folder, size_mb, FILES_PER_INPUT)


def distinct_texts(size_mb: int) -> list[str]:
    """About `size_mb` MiB (UTF-8) of the bench corpus's distinct documents, in memory."""
    # lazy: --help imports nothing heavy (test_bench_package)
    from bench.exactness_corpus import SEED, base_vocabulary, bench_docs, repo_texts, sample_texts

    docs = bench_docs(SEED, base_vocabulary(repo_texts() + sample_texts()))
    texts, total = [], 0
    while total < size_mb * MB:
        texts.append(next(docs)["text"])
        total += len(texts[-1].encode())
    return texts


def child(code: str, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], cwd=REPO, capture_output=True, text=True)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def raw_rate(paths: list[str], procs: int) -> dict:
    """Per raw form ("list", "array"): tokens, tokens/s per process (wall), tokens per CPU-second;
    `procs` processes in parallel, each over its share of the texts."""
    running = [
        subprocess.Popen(
            [sys.executable, "-c", RAW_CHILD, *paths, str(i), str(procs)], cwd=REPO, stdout=subprocess.PIPE, text=True
        )
        for i in range(procs)
    ]
    res = [json.loads(p.communicate()[0].strip().splitlines()[-1]) for p in running]
    out = {}
    for form in ("list", "array"):
        tokens = sum(r[form]["tokens"] for r in res)
        out[form] = {
            "tokens": tokens,
            "wall": sum(r[form]["tokens"] / r[form]["seconds"] for r in res) / procs,
            "cpu": tokens / sum(r[form]["cpu"] for r in res),
        }
    return out


DOLMA_ANCHOR = 0.31e6  # AI2's `dolma tokens`, tokens/s per process on this box class (not measured here)


def mixture_json(paths: list[str], dedup: bool, engine: str, crosscheck: str, compression: str | None = None) -> str:
    extra = {} if compression is None else {"shard_compression": compression}
    return json.dumps(
        {
            **extra,
            "name": "bench",
            "tokenizer": "dolma2",
            "seq_len": 8192,
            "seed": 0,
            "heldout_fraction": 0.001,
            "dedup": dedup,
            "sources": [{"name": "bench", "paths": paths, "weight": 1.0}],
            "tokenizer_engine": engine,
            "tokenizer_crosscheck": crosscheck if crosscheck == "all" else float(crosscheck),
        }
    )


def configs(args) -> list[tuple[str, str]]:
    """(engine, cross-check rate) pairs to run; the rate only matters for engines other than tiktoken."""
    return [(e, c) for e in args.engines for c in (args.crosscheck if e != "tiktoken" else ["0"])]


def job_run(
    paths: list[str],
    out: Path,
    workers: int,
    dedup: bool,
    mixture_dir: Path,
    mode: str,
    engine: str = "quicktok",
    crosscheck: str = "0.01",
) -> dict:
    mix = mixture_dir / f"bench-{len(paths)}-{out.name}.yaml"
    mix.write_text(mixture_json(paths, dedup, engine, crosscheck))
    args = ["--mixture", str(mix), "--output", str(out), f"--direct_num_workers={workers}"]
    if workers > 1:
        args.append(f"--direct_running_mode={mode}")
    res = child(JOB_CHILD, *args)
    m = json.loads((out / "manifest.json").read_text())
    src = m["sources"]["bench"]
    # tokens without the EOS the job appends, to compare like for like with raw encode_ordinary
    res["tokens"] = (
        src["tokens"]["train"] + src["tokens"]["heldout"] - src["counts"]["train"] - src["counts"]["heldout"]
    )
    return res


RAW_LOOP_CHILD = r"""
import io, json, os, sys, time, zstandard
from pipelines.dolma2_tokenizer import dolma2, ordinary_ids
enc = dolma2()
forms = {"list": enc.encode_ordinary, "array": ordinary_ids(enc)}
stop, paths = sys.argv[1], sys.argv[2:]
texts = []
for p in paths:
    with open(p, "rb") as f:
        for line in io.TextIOWrapper(zstandard.ZstdDecompressor().stream_reader(f), encoding="utf-8"):
            texts.append(json.loads(line)["text"])
print("ready", flush=True)
out = {f: {"tokens": 0, "cpu": 0.0} for f in forms}
while not os.path.exists(stop):  # alternate the two forms in slices of 200 texts until the job ends
    for name, fn in forms.items():
        for i in range(0, len(texts), 200):
            c, n = time.process_time(), 0
            for text in texts[i : i + 200]:
                n += len(fn(text))
            out[name]["cpu"] += time.process_time() - c
            out[name]["tokens"] += n
            if os.path.exists(stop):
                break
print(json.dumps({f: v["tokens"] / v["cpu"] for f, v in out.items()}))
"""


def paired_run(
    paths: list[str],
    out: Path,
    mixture_dir: Path,
    dedup: bool,
    engine: str = "quicktok",
    crosscheck: str = "0.01",
    compression: str | None = None,
) -> dict:
    """The job on core 1 and raw tiktoken on core 0 at the same time, each pinned to its core, so
    both see the same machine (this VM's speed drifts by ±15% from minute to minute, which makes
    ratios of runs taken minutes apart noisy). Raw loops over the texts for exactly as long as
    the job runs. Needs ≥ 2 cores."""
    stop = out.parent / f"{out.name}.stop"

    def pin(cpu: int):
        return lambda: os.sched_setaffinity(0, {cpu})

    raw = subprocess.Popen(
        [sys.executable, "-c", RAW_LOOP_CHILD, str(stop), *paths],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=pin(0),
    )
    assert raw.stdout is not None and raw.stdout.readline().strip() == "ready"
    mix = mixture_dir / f"paired-{out.name}.yaml"
    mix.write_text(mixture_json(paths, dedup, engine, crosscheck, compression))
    job = subprocess.run(
        [sys.executable, "-c", JOB_CHILD, "--mixture", str(mix), "--output", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        preexec_fn=pin(1),
        env={**os.environ, "BENCH_WATCH_WORKERS": "0"},
    )
    stop.touch()
    rates = json.loads(raw.communicate()[0].strip().splitlines()[-1])
    if job.returncode:
        raise RuntimeError(job.stderr[-3000:])
    res = json.loads(job.stdout.strip().splitlines()[-1])
    m = json.loads((out / "manifest.json").read_text())
    src = m["sources"]["bench"]
    tokens = src["tokens"]["train"] + src["tokens"]["heldout"] - src["counts"]["train"] - src["counts"]["heldout"]
    shutil.rmtree(out)
    stop.unlink()
    return {
        "tokens": tokens,
        "job_cpu": tokens / res["cpu"],
        "job_wall": tokens / res["seconds"],
        "raw": rates,
        "rss_mb": res["rss_mb"],
        "seconds": res["seconds"],
        "cpu": res["cpu"],
        "crosschecked": m["build"]["crosscheck"] is not None,
    }


def _median_run(rs: list[dict]) -> dict:
    """The run with the median job ÷ raw list ratio (the lower middle one of an even count)."""
    return sorted(rs, key=lambda r: r["job_cpu"] / r["raw"]["list"])[(len(rs) - 1) // 2]


def paired(args, docs, tmp: Path) -> None:
    print(
        f"paired: job (1 worker) on core 1 while raw tiktoken runs on core 0, median of {args.repeats}; "
        f"rates in M tokens per CPU-second, start-up included; {args.corpus} documents; "
        f"shard compression {args.shard_compression or 'default'}; "
        f"cpus={os.cpu_count()} load1={os.getloadavg()[0]:.1f}"
    )
    print(
        "| input MiB | engine (cross-check) | tokens | raw list | raw array | job | job ÷ raw list "
        "| job ÷ raw array | job ÷ quicktok job | job ÷ dolma anchor | job wall s | job CPU s | peak RSS MiB |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    best_of: dict[tuple, dict] = {}
    for size in args.sizes_mb:
        paths = inputs(args.corpus, tmp / f"in{size}", docs, size)
        runs: dict[tuple, list] = {c: [] for c in configs(args)}
        for _ in range(args.repeats):  # configurations interleaved: the VM's speed drifts
            for engine, check in runs:
                runs[engine, check].append(
                    paired_run(paths, tmp / f"out{size}", tmp, args.dedup, engine, check, args.shard_compression)
                )
        quick = next((rs for (e, _), rs in runs.items() if e == "quicktok"), None)
        for (engine, check), rs in runs.items():
            best = _median_run(rs)
            best_of[size, engine, check] = best
            label = engine if engine == "tiktoken" else f"{engine} ({check})"
            vs_quick = "—"
            if quick is not None:  # per repeat, each normalised by its own raw run (the drift cancels)
                pairs = sorted(
                    (r["job_cpu"] / r["raw"]["list"]) / (q["job_cpu"] / q["raw"]["list"]) for r, q in zip(rs, quick)
                )
                vs_quick = f"{pairs[(len(pairs) - 1) // 2]:.2f}"
            print(
                f"| {size} | {label} | {best['tokens'] / 1e6:.1f}M | {best['raw']['list'] / 1e6:.2f} "
                f"| {best['raw']['array'] / 1e6:.2f} | {best['job_cpu'] / 1e6:.2f} | {best['job_cpu'] / best['raw']['list']:.2f} "
                f"| {best['job_cpu'] / best['raw']['array']:.2f} | {vs_quick} | {best['job_cpu'] / DOLMA_ANCHOR:.1f} "
                f"| {best['seconds']:.1f} | {best['cpu']:.1f} | {best['rss_mb']:.0f} |"
            )
            ratios = [f"{r['job_cpu'] / r['raw']['list']:.2f}/{r['job_cpu'] / r['raw']['array']:.2f}" for r in rs]
            print(f"  every run (÷ list / ÷ array): {', '.join(ratios)}")
    lo, hi = min(args.sizes_mb), max(args.sizes_mb)
    if lo != hi:  # warm: the marginal rate between the two sizes removes start-up and the first bundles
        for engine, check in configs(args):
            a, b = best_of[lo, engine, check], best_of[hi, engine, check]
            rate = (b["tokens"] - a["tokens"]) / (b["cpu"] - a["cpu"])
            raw = (a["raw"]["list"] + b["raw"]["list"]) / 2
            print(
                f"steady state (warm) {engine} ({check}), {lo}→{hi} MiB: {rate / 1e6:.2f}M tok/CPU-s = "
                f"{rate / raw:.2f}× raw list, {rate / DOLMA_ANCHOR:.1f}× the dolma anchor; "
                f"fixed cost ≈ {a['cpu'] - a['tokens'] / rate:.1f} CPU-s"
            )
    print("rss: VmHWM of the job process (one worker runs in it)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes_mb", type=int, nargs="+", default=[32, 128])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--dedup", action="store_true", help="run the job with dedup on (one more pass over the input)")
    ap.add_argument(
        "--modes",
        nargs="+",
        default=["multi_threading", "multi_processing"],
        help="--direct_running_mode(s) for runs with more than one worker",
    )
    ap.add_argument("--repeats", type=int, default=2, help="interleaved raw/job runs per row; best of each is kept")
    ap.add_argument("--engines", nargs="+", default=["quicktok"], help="encoder engine(s) of the job, or to compare")
    ap.add_argument(
        "--crosscheck",
        nargs="+",
        default=["0.01"],
        help="cross-check rate(s) for engines other than tiktoken (a share, or 'all')",
    )
    ap.add_argument(
        "--paired",
        action="store_true",
        help="one worker, job and raw at the same time on one core each (see paired_run)",
    )
    ap.add_argument(
        "--shard_compression",
        default=None,
        help="the mixture's shard_compression in --paired runs (pipelines.shards.SHARD_COMPRESSIONS; default: none set)",
    )
    ap.add_argument("--encoders", action="store_true", help="the encoders alone over the sample's texts")
    ap.add_argument(
        "--in_bundle",
        action="store_true",
        help="the worker's DoFn alone on the first --sizes_mb, per engine and cross-check rate",
    )
    ap.add_argument(
        "--stages",
        action="store_true",
        help="each stage's CPU inside the job's DoFn, per engine, on the first --sizes_mb (bench.tokenize_stages)",
    )
    ap.add_argument(
        "--gigatoken_recycle_mib",
        type=int,
        nargs="+",
        default=None,
        help="--stages: gigatoken's encoder rebuilt every N Mi characters (0: never; default: the job's)",
    )
    ap.add_argument(
        "--corpus",
        choices=["distinct", "repeated"],
        default="distinct",
        help="distinct: bench/exactness_corpus.py's documents (no two alike, a growing vocabulary); "
        "repeated: the embedded sample's documents again and again, each with a unique first line",
    )
    args = ap.parse_args()
    # lazy: --help imports nothing heavy (test_bench_package)
    from bench import tokenize_engines

    docs = sample_docs()
    if args.encoders:
        if args.corpus == "distinct":
            texts = distinct_texts(args.sizes_mb[0])
        else:
            texts = [d["text"] for d in docs]
        tokenize_engines.encoders(texts, args.engines, args.repeats)
        return
    if args.stages:
        from bench import tokenize_stages  # lazy: --help imports nothing heavy (test_bench_package)

        with tempfile.TemporaryDirectory(prefix="olmax-bench-") as tmp:
            size = args.sizes_mb[0]
            paths = inputs(args.corpus, Path(tmp) / f"in{size}", docs, size)
            tokenize_stages.stages(
                paths, args.engines, args.repeats, str(Path(tmp) / "out"), args.gigatoken_recycle_mib
            )
        return
    if args.in_bundle:
        with tempfile.TemporaryDirectory(prefix="olmax-bench-") as tmp:
            size = args.sizes_mb[0]
            paths = inputs(args.corpus, Path(tmp) / f"in{size}", docs, size)
            tokenize_engines.in_bundle(paths, configs(args), args.repeats, str(Path(tmp) / "out"), size)
        return
    if args.paired:
        with tempfile.TemporaryDirectory(prefix="olmax-bench-") as tmp:
            paired(args, docs, Path(tmp))
        return
    with tempfile.TemporaryDirectory(prefix="olmax-bench-") as tmp_name:
        work = Path(tmp_name)
        rows = []
        for size in args.sizes_mb:
            paths = inputs(args.corpus, work / f"in{size}", docs, size)
            for w, mode in [(n, m) for n in args.workers for m in (args.modes if n > 1 else ["in_memory"])]:
                raw: dict | None = None
                job: dict | None = None
                for _ in range(args.repeats):  # interleaved, best of N: the VM's speed drifts
                    r = raw_rate(paths, w)
                    j = job_run(paths, work / f"out{size}-{w}", w, args.dedup, work, mode, *configs(args)[0])
                    shutil.rmtree(work / f"out{size}-{w}")
                    assert j["tokens"] == r["list"]["tokens"] == r["array"]["tokens"], (j["tokens"], r)
                    raw = r if raw is None else {f: max(raw[f], r[f], key=lambda x: x["cpu"]) for f in r}
                    job = (
                        j
                        if job is None
                        else {
                            **min(job, j, key=lambda x: x["cpu"]),
                            "seconds": min(job["seconds"], j["seconds"]),
                            "rss_mb": max(job["rss_mb"], j["rss_mb"]),
                            "worker_rss_mb": max(job["worker_rss_mb"], j["worker_rss_mb"]),
                        }
                    )
                assert job is not None  # repeats >= 1
                rows.append(
                    {
                        "size": size,
                        "w": w,
                        "mode": mode,
                        "tokens": job["tokens"],
                        "raw": raw,
                        "job_wall": job["tokens"] / job["seconds"] / w,
                        "job_cpu": job["tokens"] / job["cpu"],
                        **job,
                    }
                )
        print(
            f"cpus={os.cpu_count()} load1={os.getloadavg()[0]:.1f} dedup={args.dedup} best of {args.repeats} (rates in M tokens/s; "
            "raw list = encode_ordinary, raw array = encode_to_numpy)"
        )
        print(
            "| input MiB | workers (mode) | tokens | raw list /core (CPU; wall) | raw array /core (CPU; wall) "
            "| job /worker (CPU; wall) | job ÷ raw list (CPU; wall) | job ÷ raw array (CPU; wall) "
            "| job wall s | job CPU s | peak RSS MiB main / worker |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            rl, ra = r["raw"]["list"], r["raw"]["array"]
            print(
                f"| {r['size']} | {r['w']} ({r['mode']}) | {r['tokens'] / 1e6:.1f}M | {rl['cpu'] / 1e6:.2f}; {rl['wall'] / 1e6:.2f} "
                f"| {ra['cpu'] / 1e6:.2f}; {ra['wall'] / 1e6:.2f} | {r['job_cpu'] / 1e6:.2f}; {r['job_wall'] / 1e6:.2f} "
                f"| {r['job_cpu'] / rl['cpu']:.2f}; {r['job_wall'] / rl['wall']:.2f} "
                f"| {r['job_cpu'] / ra['cpu']:.2f}; {r['job_wall'] / ra['wall']:.2f} | {r['seconds']:.1f} | {r['cpu']:.1f} "
                f"| {r['rss_mb']:.0f} / {r['worker_rss_mb']:.0f} |"
            )
        for w, mode in dict.fromkeys((r["w"], r["mode"]) for r in rows):
            pts = sorted((r for r in rows if (r["w"], r["mode"]) == (w, mode)), key=lambda r: r["size"])
            if len(pts) >= 2:
                a, b = pts[0], pts[-1]
                dn = b["tokens"] - a["tokens"]
                m_cpu = dn / (b["cpu"] - a["cpu"])
                m_wall = dn / (b["seconds"] - a["seconds"]) / w
                ratios = []
                for form in ("list", "array"):
                    raw_cpu = (a["raw"][form]["cpu"] + b["raw"][form]["cpu"]) / 2
                    raw_wall = (a["raw"][form]["wall"] + b["raw"][form]["wall"]) / 2
                    ratios.append(f"{m_cpu / raw_cpu:.2f} (CPU), {m_wall / raw_wall:.2f} (wall) of raw {form}")
                print(
                    f"workers={w} ({mode}): marginal job rate (start-up excluded) {m_cpu / 1e6:.2f}M tok/CPU-s, "
                    f"{m_wall / 1e6:.2f}M tok/s/worker wall = " + "; ".join(ratios)
                )


if __name__ == "__main__":
    main()
