"""MFU of the trainer's own step: tokens/s, TFLOP/s per device, MFU against the chip's spec and
against its bf16 matmul peak measured in the same run, peak HBM, and the MXU/stock ratio.

    python -m bench.mfu [--configs A.yaml,B.yaml] [--steps 6] [--warmup 2] [--matmul_n 8192]
                        [--variants "k=v k=v;k=v;…"] [--profile DIR] [--out FILE.json] [key=value ...]

Each config (default: the one-chip proxy recipes, stock 32 x 128 then MXU 16 x 256) runs
``trainer.build.build`` — the builder ``trainer.main`` uses: its optimizer, skip step, z-loss,
clipping, shardings and jitted step — on synthetic batches (uniform ordinary token ids, one document
per row: full causal attention, no block a document mask would let a kernel skip), after
``--warmup`` steps (compilation), each step synchronised as the trainer's loop is (its metrics read
back once the next step is dispatched; a step's time is the time between two reads). Overrides apply
to every config. Every config and the matmul run in a process of their own, one after the other, so
each peak-HBM figure (``memory_stats()["peak_bytes_in_use"]``)
is that config's alone; on a CPU there is none.

FLOPs are ``model.flops_per_token`` (6 x matmul params incl. the LM head, causal attention at half
of S², sliding windows not discounted) x tokens per step. MFU of spec divides by the chip's
published dense bf16 peak per device (``trainer/peak.py``; none on a CPU), MFU of measured by the
TFLOP/s of a bf16 [n, n] @ [n, n] matmul timed here. The ratio row is each config's tokens/s over
the first's (the case study's MXU/stock: 1.124). ``--variants`` runs each config once per
``;``-separated set of overrides (after the common ones): a sweep of knobs against one matmul peak;
an override ``env.NAME=value`` sets an environment variable of that worker (e.g.
``env.LIBTPU_INIT_ARGS=--xla_tpu_scoped_vmem_limit_kib=65536``), and an item ``@NAME`` runs that
variant only for the config of that file name (``@olmo3-7b-proxy-v5e-mxu``: one command sweeps each
recipe with its own settings). With ``--out`` the JSON is rewritten after each variant (``"partial":
true`` until the end), so a sweep its time limit cuts short keeps the rows it measured.

``--profile DIR`` traces two more steps per config with ``jax.profiler`` (DIR/<config>/) and prints
where the step's time goes by phase (``bench.phases``: attention forward/backward, the layers'
matmuls, the LM head and loss, gradient accumulation, the optimizer update, the host gap) and the
ops that took the most device time, read from the trace's XSpace with ``jax.profiler.ProfileData``
and the compiled step's HLO (no TensorBoard or xprof needed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from bench import matmul_flops, phases
from trainer import libtpu_flags
from trainer.config.schema import load_config

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIGS = ("trainer/configs/olmo3-7b-proxy-v5e.yaml", "trainer/configs/olmo3-7b-proxy-v5e-mxu.yaml")
CASE_STUDY_RATIO = 1.124  # MXU / stock TFLOP/s on Ironwood: 571 / 508
PROFILE_STEPS = 2
TOP_OPS = 15
GiB = 2**30
WORKER_TIMEOUT_S = 420  # one config's compile + steps (~40 s on v5e); a hung worker must not stall a sweep


# ----------------------------------------------------------------------------- arithmetic (pure)


def summarize(
    step_seconds: Sequence[float],
    tokens_per_step: int,
    flops_per_token: float,
    devices: int,
    spec_tflops: float | None,
    measured_tflops: float | None,
) -> dict:
    """Rates of a step from its timed runs (median): tokens/s, model TFLOP/s per device and MFU of
    the spec and of the measured matmul peak (None where that peak is unknown)."""
    if not step_seconds:
        raise ValueError("no timed steps")
    step_s = statistics.median(step_seconds)
    tokens_per_s = tokens_per_step / step_s
    tflops = flops_per_token * tokens_per_s / devices / 1e12
    return {
        "step_s": step_s,
        "tokens_per_s": tokens_per_s,
        "tflops_per_device": tflops,
        "mfu_spec": None if not spec_tflops else tflops / spec_tflops,
        "mfu_measured": None if not measured_tflops else tflops / measured_tflops,
    }


def ratios(rows: Sequence[dict]) -> list[float]:
    """Each row's tokens/s over the first row's (the same tokens and FLOPs per step: the TFLOP/s ratio)."""
    return [r["tokens_per_s"] / rows[0]["tokens_per_s"] for r in rows]


def top_ops(events: Iterable[tuple[str, float, str]], n: int = TOP_OPS) -> list[dict]:
    """(op name, duration ns, detail) events → the n ops with the most total time: op, ms, share of
    all op time, count, and the first detail seen (what the op computes, where the trace says)."""
    total: dict[str, float] = {}
    count: dict[str, int] = {}
    detail: dict[str, str] = {}
    for name, ns, what in events:
        total[name] = total.get(name, 0.0) + ns
        count[name] = count.get(name, 0) + 1
        detail.setdefault(name, what)
    grand = sum(total.values()) or 1.0
    best = sorted(total.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return [{"op": k, "ms": v / 1e6, "share": v / grand, "count": count[k], "detail": detail[k]} for k, v in best]


# XStat names (tsl/profiler/utils/xplane_schema.h) that say what an op is: its category and the
# framework op (JAX's name stack) it came from.
DETAIL_STATS = ("hlo_category", "tf_op", "long_name")


def _detail(stats: dict) -> str:
    return " | ".join(str(stats[k])[:120] for k in DETAIL_STATS if stats.get(k))


def trace_events(xspace_path: str) -> tuple[list[tuple[str, float, str]], float | None]:
    """(XLA op events (name, duration ns, detail), the device's busy ns or None) of a jax.profiler
    trace: on a TPU/GPU the device planes' "XLA Ops" lines, and their "XLA Modules" lines' time (the
    busy time; None without them); failing those (a CPU), events anywhere that name an HLO op."""
    # JAX after the worker's libtpu flags (_step_worker): never at this module's import
    from jax.profiler import ProfileData

    planes = list(ProfileData.from_file(xspace_path).planes)
    on_device = [p for p in planes if p.name.startswith("/device:")]
    device = [line for p in on_device for line in p.lines if line.name == "XLA Ops"]
    if device:
        modules = [e for p in on_device for line in p.lines if line.name == "XLA Modules" for e in line.events]
        busy = sum(float(e.duration_ns) for e in modules) if modules else None
        return [(e.name, float(e.duration_ns), _detail(dict(e.stats))) for line in device for e in line.events], busy
    out: list[tuple[str, float, str]] = []
    for plane in planes:
        for line in plane.lines:
            for e in line.events:
                stats = dict(e.stats)
                if "hlo_op" in stats:
                    out.append((e.name, float(e.duration_ns), _detail(stats)))
    return out, None


# ----------------------------------------------------------------------------- workers (one process each)


def _matmul_worker(n: int) -> dict:
    """TFLOP/s of a bf16 [n, n] @ [n, n] on the default device (bench.matmul_flops), and the devices."""
    import jax  # JAX after the worker's libtpu flags (_step_worker): never at this module's import

    d = jax.devices()[0]
    return {
        "matmul_n": n,
        "matmul_tflops": matmul_flops(n, "bfloat16") / 1e12,
        "device_kind": d.device_kind,
        "devices": jax.device_count(),
        "platform": d.platform,
        "jax": jax.__version__,
    }


def synthetic_batch(rng, global_batch: int, seq_len: int, eos_id: int) -> dict:
    """Loader-shaped host batch: ordinary ids (below EOS), one document per row (int32 [G, T])."""
    tokens = rng.integers(0, eos_id, size=(global_batch, seq_len), dtype=np.int32)
    ones = np.ones((global_batch, seq_len), np.int32)
    positions = np.broadcast_to(np.arange(seq_len, dtype=np.int32), (global_batch, seq_len)).copy()
    return {"tokens": tokens, "segment_ids": ones, "positions": positions, "loss_mask": ones.copy()}


def _step_worker(config: str, overrides: Sequence[str], steps: int, warmup: int, profile: str | None) -> dict:
    """Times the trainer's step for one config (see the module docstring)."""
    cfg = load_config(config, overrides)

    libtpu_flags.apply(cfg.libtpu_flags)  # as trainer.main does: before JAX loads libtpu
    import jax

    if cfg.mesh.cpu_devices > 0:
        jax.config.update("jax_num_cpu_devices", cfg.mesh.cpu_devices)
    import model  # JAX after the worker's libtpu flags (_step_worker): never at this module's import
    from trainer import mesh as mesh_lib
    from trainer import peak as peak_lib
    from trainer.build import build

    if cfg.seq_len is None:
        raise SystemExit(f"error: {config} sets no seq_len (the benchmark's sequence length)")
    b = build(cfg)  # trainer.main's builder: optimizer, skip step, z-loss, clipping, shardings, jit
    G, T = cfg.global_batch_size, cfg.seq_len
    params, opt_state = b.init_state(jax.random.key(cfg.init_seed))
    rng = np.random.default_rng(0)
    skipped = 0
    first_batch = mesh_lib.global_batch(synthetic_batch(np.random.default_rng(0), G, T, b.model_cfg.eos_id), b.mesh, G)

    def dispatch(step: int):
        nonlocal params, opt_state
        batch = mesh_lib.global_batch(synthetic_batch(rng, G, T, b.model_cfg.eos_id), b.mesh, G)
        params, opt_state, m = b.train_step(params, opt_state, np.float32(b.schedule(step)), batch)
        return m

    def run(first: int, n: int = 1) -> list[tuple[float, dict]]:
        """n steps from ``first`` as trainer.loop runs them: a step's metrics are read (its
        synchronisation) once the next step is dispatched; each step's time is the time between two
        reads (the first: from the start)."""
        nonlocal skipped
        out, held, last = [], None, time.perf_counter()
        for step in [*range(first, first + n), None]:
            m = dispatch(step) if step is not None else None
            if held is not None:
                row = {k: float(v) for k, v in held.items()}
                now = time.perf_counter()
                out.append((now - last, row))
                skipped, last = skipped + int(row["skipped"]), now
            held = m
        return out

    run(0, warmup) if warmup else None
    timed = run(warmup, steps)
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    peak = peak_lib.device_peak(cfg.log.peak_tflops_per_device, device)
    out = {
        "config": config,
        "model": cfg.model,
        "heads": f"{b.model_cfg.n_heads}x{b.model_cfg.head_dim}",
        "layers": b.model_cfg.n_layers,
        "params": model.count_params(b.model_cfg),
        "seq_len": T,
        "global_batch": G,
        "tokens_per_step": G * T,
        "flops_per_token": model.flops_per_token(b.model_cfg, T),
        "devices": jax.device_count(),
        "step_seconds": [t for t, _ in timed],
        "skipped": skipped,
        "last_loss": timed[-1][1]["loss"],
        "spec_tflops": peak.tflops,
        "spec_why": peak.why,
        "peak_hbm_bytes": stats.get("peak_bytes_in_use"),
        "hbm_limit_bytes": stats.get("bytes_limit"),
    }
    if profile:
        hlo = b.train_step.lower(params, opt_state, np.float32(b.schedule(0)), first_batch).compile().as_text()
        out["top_ops"], out["phases"] = _profile(Path(profile) / Path(config).stem, run, warmup + steps, hlo)
    return out


def _profile(directory: Path, run, first_step: int, hlo_text: str) -> tuple[list[dict], list[dict]]:
    """(top ops, phase table) of ``PROFILE_STEPS`` traced steps (bench.phases)."""
    import jax  # JAX after the worker's libtpu flags (_step_worker): never at this module's import

    directory.mkdir(parents=True, exist_ok=True)
    (directory / "step.hlo.txt").write_text(hlo_text)  # what the phase table maps the trace's ops with
    with jax.profiler.trace(str(directory)):
        t0 = time.perf_counter()
        run(first_step, PROFILE_STEPS)
        wall_ns = (time.perf_counter() - t0) * 1e9
    planes = sorted(directory.rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    if not planes:
        return [], []
    events, busy = trace_events(str(planes[-1]))
    names = phases.hlo_op_names(hlo_text)
    leaves = [(phases.event_op(n)[0], ns, what) for n, ns, what in events if not phases.event_op(n)[1]]
    named = [(n, ns, f"{names.get(n, '')[-120:]} | {what}"[:240]) for n, ns, what in leaves]
    return top_ops(named), phases.phase_table(events, names, PROFILE_STEPS, wall_ns, busy)


# ----------------------------------------------------------------------------- orchestration


def runs(configs: Sequence[str], variants: Sequence[Sequence[str]]) -> list[tuple[str, list[str]]]:
    """(config, variant) pairs in run order: each config in turn with each variant in turn, except
    that a variant holding ``@NAME`` items runs only for the configs so named (a config's file name,
    with or without ``.yaml``; the ``@`` items are dropped from the variant). ValueError for an
    ``@NAME`` that names none of the configs (a typo would silently drop the variant)."""
    names = {c: {Path(c).name, Path(c).stem} for c in configs}
    out = []
    for v in variants:
        wanted = {item[1:] for item in v if item.startswith("@")}
        unknown = wanted - set().union(*names.values())
        if unknown:
            raise ValueError(f"variant {' '.join(v)!r} names no config of --configs: @{', @'.join(sorted(unknown))}")
    for c in configs:
        for v in variants:
            wanted = {item[1:] for item in v if item.startswith("@")}
            if not wanted or wanted & names[c]:
                out.append((c, [item for item in v if not item.startswith("@")]))
    return out


def split_variant(overrides: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(trainer overrides, worker environment) of one variant: ``env.NAME=value`` items are the latter."""
    env = {o[4:].split("=", 1)[0]: o.split("=", 1)[1] for o in overrides if o.startswith("env.") and "=" in o}
    return [o for o in overrides if not o.startswith("env.")], env


def _worker(args: list[str], env: dict[str, str] | None = None, required: bool = True) -> dict | None:
    """Runs this module as a worker process; returns its JSON result (its stderr goes through).
    A failed worker stops the benchmark, or with ``required=False`` gives None (a sweep's variant that
    does not compile or fit is reported as such)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "bench.mfu", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {}), "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
    )
    try:
        out, _ = child.communicate(timeout=WORKER_TIMEOUT_S)
        proc = subprocess.CompletedProcess(args, child.returncode, out)
    except subprocess.TimeoutExpired:
        proc = subprocess.CompletedProcess(args, returncode=124)
        print(f"bench.mfu worker {args[:4]}: no result in {WORKER_TIMEOUT_S} s, killed", file=sys.stderr)
    finally:
        # A worker holds the chip: one left running (the benchmark itself stopped by a timeout's SIGTERM,
        # which main() turns into an exit) keeps every later TPU program waiting on it.
        if child.poll() is None:
            child.kill()
            child.wait()
    if proc.returncode != 0:
        if not required:
            return None
        raise SystemExit(f"error: bench.mfu worker {args[:3]} failed (exit {proc.returncode})")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def label(row: dict) -> str:
    """A row's name in the table: its config, and its variant's overrides if any."""
    return Path(row["config"]).name + (f" {row['variant']}" if row.get("variant") else "")


def table(result: dict) -> str:
    """The printed table (Markdown, as bench/RESULTS.md records it)."""
    m = result["matmul"]
    lines = [
        f"{m['device_kind']} x {m['devices']} ({m['platform']}, jax {m['jax']}); bf16 {m['matmul_n']}³ matmul "
        f"{m['matmul_tflops']:.1f} TFLOP/s; spec: {result['rows'][0]['spec_why']}",
        "",
        "| config | heads | layers | params | tokens/s | step s | TFLOP/s/device | MFU (spec) | "
        "MFU (measured matmul) | peak HBM GiB | vs first |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, ratio in zip(result["rows"], result["ratios"]):
        spec = "—" if r["mfu_spec"] is None else f"{r['mfu_spec']:.1%}"
        hbm = "—" if r["peak_hbm_bytes"] is None else f"{r['peak_hbm_bytes'] / GiB:.2f}"
        lines.append(
            f"| {label(r)} | {r['heads']} | {r['layers']} | {r['params'] / 1e6:.1f}M | "
            f"{r['tokens_per_s']:,.0f} | {r['step_s']:.3f} | {r['tflops_per_device']:.4g} | {spec} | "
            f"{r['mfu_measured']:.1%} | {hbm} | {ratio:.3f} |"
        )
    lines.append(f"(case study, Ironwood: MXU/stock {CASE_STUDY_RATIO})")
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m bench.mfu", description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--configs",
        default=",".join(DEFAULT_CONFIGS),
        help="comma-separated trainer recipes "
        "(default: the one-chip proxy, stock then MXU); the ratio column is each over the first",
    )
    ap.add_argument("--steps", type=int, default=6, help="timed steps per config (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation)")
    ap.add_argument("--matmul_n", type=int, default=8192, help="size of the bf16 matmul that measures the peak")
    ap.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="trace 2 more steps per config into DIR and print the ops with the most device time",
    )
    ap.add_argument(
        "--variants",
        default="",
        help="';'-separated override sets, each run per config (env.NAME=value sets a worker's environment; "
        "@NAME runs the set for the config of that file name only)",
    )
    ap.add_argument("--out", default=None, metavar="FILE", help="write the result as JSON")
    ap.add_argument("--worker", choices=("matmul", "step"), help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="trainer key=value overrides applied to every config")
    args = ap.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.matmul_n < 1:
        ap.error("--steps must be >= 1, --warmup >= 0, --matmul_n >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker == "matmul":
        print(json.dumps(_matmul_worker(args.matmul_n)))
        return 0
    if args.worker == "step":
        try:
            print(json.dumps(_step_worker(args.configs, args.overrides, args.steps, args.warmup, args.profile)))
        except Exception as e:  # noqa: BLE001 (any failure: one line, and out at once)
            print(
                f"bench.mfu worker {Path(args.configs).name} {' '.join(args.overrides)}: {type(e).__name__}: "
                f"{str(e).splitlines()[0] if str(e) else ''}",
                file=sys.stderr,
                flush=True,
            )
            # os._exit, not a return: after a failed TPU compilation the runtime's teardown at interpreter
            # exit can wait forever (seen on v5e, 2026-12-06: a CompileTimeScopedVmemOom variant hung until
            # the sweep's timeout killed every later variant)
            os._exit(3)
        return 0
    # SIGTERM (a timeout, a preemption) unwinds through _worker's finally, which kills the running worker
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    configs = [c for c in args.configs.split(",") if c]
    variants = [v.split() for v in args.variants.split(";")] if args.variants else [[]]

    try:
        plan = runs(configs, variants)
        for c, v in plan:
            load_config(c, [*args.overrides, *split_variant(v)[0]])
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    matmul = _worker(["--worker", "matmul", "--matmul_n", str(args.matmul_n)])
    assert matmul is not None
    rows, failed = [], []
    head = {
        "command": "python -m bench.mfu " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": datetime.date.today().isoformat(),
        "matmul": matmul,
    }
    for c, v in plan:
        overrides, env = split_variant(v)
        extra = ["--profile", args.profile] if args.profile else []
        step_args = ["--worker", "step", "--configs", c, "--steps", str(args.steps), "--warmup", str(args.warmup)]
        r = _worker([*step_args, *extra, *args.overrides, *overrides], env, required=len(variants) == 1)
        if r is None:
            failed.append(f"{Path(c).name} {' '.join(v)}")
            continue
        r["variant"] = " ".join(v)
        r.update(
            summarize(
                r["step_seconds"],
                r["tokens_per_step"],
                r["flops_per_token"],
                r["devices"],
                r["spec_tflops"],
                matmul["matmul_tflops"],
            )
        )
        rows.append(r)
        mfu_text = "" if r["mfu_spec"] is None else f", {r['mfu_spec']:.1%} MFU of spec"
        print(f"bench.mfu: {label(r)}: {r['tokens_per_s']:,.0f} tokens/s{mfu_text}", file=sys.stderr, flush=True)
        if args.out:  # the rows so far: a sweep cut short by its time limit keeps what it measured
            Path(args.out).write_text(json.dumps({**head, "rows": rows, "failed_variants": failed, "partial": True}))
    if not rows:
        print("error: no variant ran: " + "; ".join(failed), file=sys.stderr)
        return 1
    result = {
        **head,
        "rows": rows,
        "ratios": ratios(rows),
        "case_study_ratio": CASE_STUDY_RATIO,
        "failed_variants": failed,
    }
    print(table(result))
    for f in failed:
        print(f"did not run (compile, memory or kernel error; its worker's stderr above): {f}")
    for r in rows:
        if r.get("phases"):
            print(f"\nphases of the step, {Path(r['config']).name} ({PROFILE_STEPS} steps traced):")
            print(phases.format_table(r["phases"]))
        if r.get("top_ops"):
            print(f"\ntop ops by device time, {Path(r['config']).name} ({PROFILE_STEPS} steps traced):")
            for op in r["top_ops"]:
                print(f"  {op['share']:6.1%} {op['ms']:10.2f} ms  x{op['count']:<5d} {op['op']}  {op['detail']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
