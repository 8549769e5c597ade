"""Run-check scale benchmark: seconds and peak RSS of `python -m audit --run`'s run check at
growing run lengths, and the extrapolation to OLMo 3 stage 1 (not a test).

    python -m bench.audit_scale [--cases 1000x8 10000x8 3000x256 10000x256] [--out FILE.json]
    python -m bench.audit_scale --write DIR --steps N --hosts H    # one case, not audited

Each case is a valid synthetic run: a manifest (two sources, no shards on disk: the run check
reads none) whose training plan has steps × G positions (rounded up to a multiple of 5) (the run reads one epoch, as
stage 1 does), and a run directory (`run.json`, `summary.json`, `data_log/host-*.jsonl`) whose
logs are what a correct trainer writes, computed with the loader's own plan functions
(`dataloader.hosts`, `dataloader.order`, `dataloader.plan`) and the contract's log rows and
stream hash. `python -m audit --data DIR/data/manifest.json --run DIR/run --out REPORT` accepts it:
the run, mixture and sharding checks pass; integrity and statistics fail because the shards
are absent by design.

Each case is audited in a fresh process (its own ru_maxrss): the run check exactly as
`audit.run_audit` calls it (plan from the manifest, `runlog.check_run` with the run's record and
summary). The extrapolation to stage 1 (7.24·10⁸ positions = 1.41 M steps × G 512, 256 hosts):
time = the growth in seconds per step between the two longest cases at the largest host count
(the seconds per step of its longest case when there is one) × 1.41 M, plus that case's fixed
part; peak = that case's peak + the growth of the peak per planned position × the positions it
lacks, the growth measured between the two longest cases at the smallest host count but never
taken below one byte per position (the read counts: a byte per example of the plan, and a plan
that reads every example has at most one example per position).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time

from contract.rundir import RunDir  # light: no JAX, no Beam (the children import those)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the repository
G = 512
STAGE1 = {"positions": 724_000_000, "steps": 1_414_063, "hosts": 256, "global_batch_size": G}
SEQ_LEN = 8192
# web is read once per epoch, code twice (so per-example multiplicities of 1 and 2 are checked);
# integer weights keep the plan's exact rational arithmetic exact: 3·R web + 2·R code slots
WEB_WEIGHT, CODE_WEIGHT = 3.0, 2.0


def manifest_for(positions: int) -> dict:
    """A contract manifest whose training plan has the first multiple of 5 ≥ `positions` slots:
    web (3/5 of them, each record read once) and code (1/5 of them as records, each read twice),
    tokens proportional to records."""
    import contract  # lazy: the parent's writer stays out of the measured child
    from pipelines.dolma2_tokenizer import CL100K_RANKS_SHA256, EOS_ID, PAD_ID, VOCAB_SIZE

    code = -(-positions // 5)
    web = 3 * code
    sources, mixture = {}, []
    for name, records, weight in (("web", web, WEB_WEIGHT), ("code", code, CODE_WEIGHT)):
        shards = {
            split: [{"path": f"{name}/{split}-00000-of-00001.arrayrecord", "records": n, "sha256": "0" * 64}]
            for split, n in (("train", records), ("heldout", 1))
        }
        sources[name] = {
            "counts": {"documents": records + 1, "train": records, "heldout": 1, "duplicates": 0, "rejected": {}},
            "tokens": {"train": records * SEQ_LEN, "heldout": SEQ_LEN, "padding": 0},
            "splits": {split: {"examples": s[0]["records"], "shards": s} for split, s in shards.items()},
        }
        mixture.append({"name": name, "paths": [f"synthetic://{name}"], "weight": weight, "max_repetition": 2.0})
    return contract.with_fingerprint(
        {
            "format_version": 1,
            "tokenizer": {
                "name": "dolma2",
                "ranks_sha256": CL100K_RANKS_SHA256,
                "vocab_size": VOCAB_SIZE,
                "eos_id": EOS_ID,
                "pad_id": PAD_ID,
            },
            "seq_len": SEQ_LEN,
            "record_format": "uint32-le[seq_len]",
            "mixture": {
                "name": "audit-scale",
                "tokenizer": "dolma2",
                "seq_len": SEQ_LEN,
                "seed": 0,
                "heldout_fraction": 0.0,
                "dedup": "exact",
                "sources": mixture,
            },
            "sources": sources,
        }
    )


def write_case(root: str, steps: int, hosts: int, seed: int = 0, positions: int | None = None) -> tuple[str, str]:
    """Writes root/data/manifest.json and root/run (run.json, summary.json, data_log/) of a correct
    run of `steps` steps on `hosts` hosts, global batch G, over a plan of (about) `positions`
    positions (default steps × G: the run reads one epoch). Returns (manifest path, run dir)."""
    import numpy as np  # lazy: the parent's writer stays out of the measured child

    import contract  # lazy: the parent's writer stays out of the measured child
    from dataloader import hosts as hosts_mod
    from dataloader import order
    from dataloader.plan import plan_from_manifests

    if G % hosts:
        raise ValueError(f"hosts must divide the global batch {G}, got {hosts}")
    data, run = os.path.join(root, "data"), os.path.join(root, "run")
    os.makedirs(data, exist_ok=True)
    positions = steps * G if positions is None else positions
    manifest = manifest_for(positions)
    mpath = os.path.join(data, "manifest.json")
    with open(mpath, "w") as f:
        json.dump(manifest, f, indent=1)
    plan = plan_from_manifests([manifest], "train")
    assert 0 <= plan.size - positions < 5, (plan.size, positions)
    log_dir = os.path.join(run, contract.DATA_LOG_DIR)
    os.makedirs(log_dir, exist_ok=True)
    files = [
        open(os.path.join(log_dir, contract.data_log_name(h, hosts)), "w")  # noqa: SIM115 - closed in the finally
        for h in range(hosts)
    ]
    stream = ""
    try:
        for step in range(steps):
            pos = np.arange(step * G, (step + 1) * G, dtype=np.int64)
            examples = plan.example_ids(*plan.locate(order.train_slots(pos, plan.size, seed)))
            for h, f in enumerate(files):
                idx = hosts_mod.host_positions(step, G, h, hosts)
                f.write(json.dumps(contract.data_log_row(step, idx, examples[idx - step * G])) + "\n")
            stream = contract.chain_data_sha256(stream, step, examples)
    finally:
        for f in files:
            f.close()
    contract.RunRecord(
        global_batch_size=G,
        seed=seed,
        data=(os.path.abspath(mpath),),
        manifest_fingerprints=(manifest["fingerprint"],),
        loader_fingerprint=plan.fingerprint,
        order=contract.INDEX_SHUFFLE,
        seq_len=SEQ_LEN,
        tokenizer=contract.TokenizerInfo.from_json(manifest["tokenizer"]),
        hosts=(contract.HostRange(0, hosts),),
    ).write(run)
    with open(contract.summary_path(run), "w") as f:
        json.dump({"step": steps, "data_sha256": stream, "process_count": hosts}, f)
    return mpath, run


def audit_case(mpath: str, run: str) -> dict:
    """The run check of one case, as `audit.run_audit` calls it; seconds, peak RSS, the verdict."""
    from audit import runlog  # lazy: the audit loads in the measured child only
    from audit.runner import load_manifests, other_data, read_run
    from contract import INDEX_SHUFFLE
    from dataloader.plan import plan_from_manifests

    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # the imports' share of the peak
    t0 = time.perf_counter()
    run_dir = RunDir.resolved(run)  # as the audit's --run resolves it
    inputs = read_run(run_dir)
    rec, summary = inputs.record, inputs.summary
    assert rec is not None and summary is not None, f"{run} is no finished run"
    manifests = load_manifests([mpath], rec, from_record=False)
    plan = plan_from_manifests([m.raw for m in manifests], "train", None)
    found = runlog.check_run(
        run_dir,
        plan,
        runlog.RunConfig(
            rec.global_batch_size,
            rec.seed,
            rec.loader_fingerprint,
            summary.data_sha256,
            summary.step,
            rec.hosts,
            INDEX_SHUFFLE,
            inputs.missing,
            other_data(rec, manifests, [mpath]),
        ),
    )
    seconds = time.perf_counter() - t0
    r = found.result
    return {
        "seconds": seconds,
        "rss_peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_peak_before_check_mib": before,
        "passed": r.passed,
        "summary": r.summary,
        "plan_size": plan.size,
        "steps_logged": r.figures.get("steps_logged"),
    }


def parse_case(text: str) -> tuple[int, int]:
    steps, _, hosts = text.partition("x")
    try:
        return int(steps), int(hosts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a case is STEPSxHOSTS, e.g. 10000x8; got {text!r}") from None


def measure(steps: int, hosts: int, workdir: str, keep: bool) -> dict:
    """Writes the case (or reuses one a previous `--workdir` run kept), audits it in a fresh process."""
    root = os.path.join(workdir, f"{steps}x{hosts}")
    mpath, run = os.path.join(root, "data", "manifest.json"), os.path.join(root, "run")
    t0 = time.perf_counter()
    if not (keep and RunDir(run).summary.exists()):
        mpath, run = write_case(root, steps, hosts)
    written = time.perf_counter() - t0
    proc = subprocess.run(
        [sys.executable, "-m", "bench.audit_scale", "--child", json.dumps([mpath, run])],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    if proc.returncode:
        raise SystemExit(f"error: auditing case {steps}x{hosts} failed:\n{proc.stderr[-2000:]}")
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    logs = sum(p.stat().st_size for p in RunDir(run).data_log.iterdir())
    if not keep:
        shutil.rmtree(root)
    return {
        "steps": steps,
        "hosts": hosts,
        "global_batch_size": G,
        "positions": steps * G,
        "log_mib": logs / 2**20,
        "write_seconds": written,
        **r,
    }


COUNTS_BYTES_PER_POSITION = 1.0  # the floor of the peak's growth (see the module docstring)


def extrapolate(rows: list[dict]) -> dict:
    """Stage 1 from the measured cases (see the module docstring)."""
    top = max(r["hosts"] for r in rows)
    wide = sorted((r for r in rows if r["hosts"] == top), key=lambda r: r["steps"])
    per_step, fixed = wide[-1]["seconds"] / wide[-1]["steps"], 0.0
    if len(wide) >= 2 and wide[-1]["steps"] > wide[-2]["steps"]:
        a, b = wide[-2], wide[-1]
        per_step = (b["seconds"] - a["seconds"]) / (b["steps"] - a["steps"])
        fixed = max(0.0, b["seconds"] - per_step * b["steps"])
    narrow = sorted((r for r in rows if r["hosts"] == min(x["hosts"] for x in rows)), key=lambda r: r["positions"])
    measured = 0.0
    if len(narrow) >= 2 and narrow[-1]["positions"] > narrow[-2]["positions"]:
        a, b = narrow[-2], narrow[-1]
        measured = (b["rss_peak_mib"] - a["rss_peak_mib"]) / (b["positions"] - a["positions"])
    slope = max(measured, COUNTS_BYTES_PER_POSITION / 2**20)
    seconds = fixed + per_step * STAGE1["steps"]
    peak = wide[-1]["rss_peak_mib"] + slope * (STAGE1["positions"] - wide[-1]["positions"])
    return {
        **STAGE1,
        "seconds": seconds,
        "hours": seconds / 3600,
        "rss_peak_gib": peak / 1024,
        "seconds_per_step": per_step,
        "fixed_seconds": fixed,
        "from_case": f"{wide[-1]['steps']}x{top}",
        "rss_mib_per_million_positions_measured": measured * 1e6,
        "rss_mib_per_million_positions_used": slope * 1e6,
    }


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.audit_scale", description=__doc__.splitlines()[0])
    p.add_argument(
        "--cases",
        type=parse_case,
        nargs="+",
        default=[(1000, 8), (10_000, 8), (3000, 256), (10_000, 256)],
        help="STEPSxHOSTS cases to audit (hosts must divide 512)",
    )
    p.add_argument("--out", help="write the measurements and the extrapolation to this JSON file")
    p.add_argument(
        "--workdir",
        help="where the cases are written and kept (a case already there is audited "
        "again, not rewritten; default: a temporary directory, removed)",
    )
    p.add_argument("--write", metavar="DIR", help="write one case (DIR/data/manifest.json, DIR/run) and exit")
    p.add_argument("--steps", type=int, default=100, help="with --write: the run's steps")
    p.add_argument("--hosts", type=int, default=8, help="with --write: the run's hosts (a divisor of 512)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.child:
        print(json.dumps(audit_case(*json.loads(a.child))))
        return
    if a.write:
        if a.steps < 1 or a.hosts < 1 or G % a.hosts:
            print(f"error: --steps must be ≥ 1 and --hosts a divisor of {G}, got {a.steps}, {a.hosts}", file=sys.stderr)
            sys.exit(2)
        mpath, run = write_case(a.write, a.steps, a.hosts)
        print(f"wrote {mpath} and {run}: python -m audit --data {mpath} --run {run} --out REPORT_DIR")
        return
    for steps, hosts in a.cases:
        if steps < 1 or hosts < 1 or G % hosts:
            print(f"error: case {steps}x{hosts}: steps must be ≥ 1 and hosts a divisor of {G}", file=sys.stderr)
            sys.exit(2)
    workdir = a.workdir or tempfile.mkdtemp(prefix="audit-scale-")
    rows = []
    for steps, hosts in a.cases:
        r = measure(steps, hosts, workdir, keep=bool(a.workdir))
        rows.append(r)
        print(
            f"{steps:>9} steps × {hosts:>3} hosts ({r['positions']:.2e} positions, logs {r['log_mib']:.0f} MiB): "
            f"run check {r['seconds']:.1f} s, peak RSS {r['rss_peak_mib']:.0f} MiB, "
            f"{'pass' if r['passed'] else 'FAIL: ' + r['summary']}",
            flush=True,
        )
    if not a.workdir:
        shutil.rmtree(workdir, ignore_errors=True)
    stage1 = extrapolate(rows)
    print(
        f"stage 1 ({stage1['positions']:.2e} positions, {stage1['steps']} steps, {stage1['hosts']} hosts, "
        f"G {G}), from case {stage1['from_case']}: ~{stage1['hours']:.2f} h ({stage1['seconds_per_step'] * 1e3:.2f} ms "
        f"per step), ~{stage1['rss_peak_gib']:.2f} GiB peak RSS"
    )
    if a.out:
        with open(a.out, "w") as f:
            json.dump(
                {"cases": rows, "stage1": stage1, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())},
                f,
                indent=1,
            )


if __name__ == "__main__":
    main()
