"""Where one worker's CPU goes, stage by stage, inside the job's own DoFn: part of
`bench.tokenize_job` (its `--stages` mode), not run on its own.

    .venv/bin/python -m bench.tokenize_job --stages --sizes_mb 256 --engines quicktok gigatoken [--repeats 2]
        [--gigatoken_recycle_mib 64 256 0]

Each engine runs in a fresh process (a new worker: its encoder and any cache start empty) that
imports the job as the CLI does, builds `pipelines.job.TokenizeFile`, runs its `setup` and then
`process` over every input file, `--repeats` passes (pass 1 cold, later passes warm). Inside the
DoFn each stage is timed with the process's CPU clock (every thread of the process counts, so work
an engine hands to threads of its own would show): the engine's `encode_batch`, the cross-check
(tiktoken on the sampled documents), packing, ArrayRecord's writes (the shard compression) and
each shard's commit (close, copy, sha256); the rest is reading (decompression, line split, JSON,
text digest) and the per-document Python. Also per pass: the process's user and system CPU, the
documents cross-checked, and how many gigatoken encoders were built (its recycling, see
`pipelines.dolma2_tokenizer.GIGATOKEN_RECYCLE_CHARS`). `--gigatoken_recycle_mib 0` never rebuilds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

STAGES = ("engine", "cross-check", "packing", "shard writes", "shard commit")

CHILD = r"""
import json, os, resource, sys, time
from collections import defaultdict
t0 = time.process_time()
from pipelines import startup
startup.lean()  # as `python -m pipelines.tokenize` does
import pipelines.tokenize  # noqa: F401  (Beam and the job, imported as the CLI imports them)
from pipelines import dolma2_tokenizer as tk, job, pack, shards
engine, out, recycle, passes, paths = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5:]
if recycle >= 0:
    tk.GIGATOKEN_RECYCLE_CHARS = recycle if recycle > 0 else 1 << 62
cpu = defaultdict(float)
calls = defaultdict(int)
def timed(name, f):
    def w(*a, **k):
        c = time.process_time()
        try:
            return f(*a, **k)
        finally:
            cpu[name] += time.process_time() - c
            calls[name] += 1
    return w
builds = [0]
backend = tk._gigatoken_backend
def counted(ranks):
    builds[0] += 1
    return backend(ranks)
tk._gigatoken_backend = counted
pack.Packer.add_batch = timed("packing", pack.Packer.add_batch)
shards.ShardWriter._write = timed("shard writes", shards.ShardWriter._write)
shards.ShardWriter.commit = timed("shard commit", shards.ShardWriter.commit)
fn = job.TokenizeFile("dolma2", 0.001, out, 8192, tk.EOS_ID, tk.PAD_ID, engine=engine, crosscheck=0.01)
t1 = time.process_time()
fn.setup()
startup.settle()
e = fn._engine
fn._engine = tk.Engine(e.name, e.version, timed("engine", e.encode_batch), e.token_bytes, e.special_tokens)
fn._reference = timed("cross-check", fn._reference)
start = {"imports": t1 - t0, "setup": time.process_time() - t1, "builds": builds[0]}
print(json.dumps(start), flush=True)
for k in range(passes):
    cpu.clear(); calls.clear(); builds[0] = 0
    r0, c = resource.getrusage(resource.RUSAGE_SELF), time.process_time()
    tokens = 0
    for i, p in enumerate(paths):
        for o in fn.process(("bench", p, i, len(paths))):
            if isinstance(o, dict):
                tokens += o["tokens"] - o["documents"]
    dofn, r1 = time.process_time() - c, resource.getrusage(resource.RUSAGE_SELF)
    print(json.dumps({
        "pass": k + 1, "tokens": tokens, "dofn": dofn, "stages": dict(cpu), "checked": calls["cross-check"],
        "user": r1.ru_utime - r0.ru_utime, "sys": r1.ru_stime - r0.ru_stime, "builds": builds[0],
        "threads": len(os.listdir("/proc/self/task")),
        "rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }), flush=True)
"""


def run_child(engine: str, paths: list[str], out: str, passes: int, recycle_chars: int | None = None) -> list[dict]:
    """One fresh process: its start-up line, then one line per pass (see CHILD). `recycle_chars`:
    gigatoken's rebuild limit (0: never; None: the job's)."""
    recycle = -1 if recycle_chars is None else recycle_chars
    proc = subprocess.run(
        [sys.executable, "-c", CHILD, engine, out, str(recycle), str(passes), *paths],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def stage_rows(label: str, lines: list[dict]) -> list[str]:
    """Markdown rows: per pass, the DoFn's rate, each stage's CPU-s (share), the rest, user/sys."""
    start, rows = lines[0], []
    for p in lines[1:]:
        st, dofn = p["stages"], p["dofn"]
        rest = dofn - sum(st.get(s, 0.0) for s in STAGES)
        cells = " | ".join(f"{st.get(s, 0.0):.2f} ({st.get(s, 0.0) / dofn:.0%})" for s in STAGES)
        rows.append(
            f"| {label} | {p['pass']} | {p['tokens'] / 1e6:.1f}M | {p['tokens'] / dofn / 1e6:.2f} | {dofn:.2f} "
            f"| {cells} | {rest:.2f} ({rest / dofn:.0%}) | {p['user']:.2f} / {p['sys']:.2f} | {p['checked']} "
            f"| {p['builds'] + (start['builds'] if p['pass'] == 1 else 0)} | {p['rss_mb']:.0f} |"
        )
    return rows


def stages(paths: list[str], engines: list[str], passes: int, out_dir: str, recycles: list[int] | None) -> None:
    """Print the per-stage table (module docstring) for each engine (and gigatoken recycling limit)."""
    runs: list[tuple[str, str, int | None]] = []
    for engine in engines:
        if engine == "gigatoken" and recycles:
            runs += [(engine, f"gigatoken (recycle {'never' if r == 0 else f'{r} Mi'})", r) for r in recycles]
        else:
            runs.append((engine, engine, None))
    print(
        f"stages inside TokenizeFile.process, one fresh process per row group, {passes} pass(es); CPU-s "
        f"(share of the DoFn); cpus={os.cpu_count()} load1={os.getloadavg()[0]:.1f}"
    )
    head = " | ".join(STAGES)
    print(
        f"| engine | pass | tokens | DoFn M tok/CPU-s | DoFn CPU-s | {head} | rest: reading, JSON, digest, Python "
        "| user / sys CPU-s | cross-checked docs | encoders built | peak RSS MiB |"
    )
    print("|---" * (10 + len(STAGES)) + "|")
    starts = []
    for engine, label, recycle in runs:
        chars = None if recycle is None else recycle << 20
        lines = run_child(engine, paths, str(Path(out_dir) / label.replace(" ", "_")), passes, chars)
        starts.append((label, {**lines[0], "threads": lines[-1].get("threads")}))
        for row in stage_rows(label, lines):
            print(row)
    for label, s in starts:
        print(
            f"start-up {label}: imports {s['imports']:.2f} CPU-s, setup (engine, checks) {s['setup']:.2f} CPU-s; "
            f"OS threads of the process after the passes: {s['threads']}"
        )
