"""Attention benchmark for the chip: today's XLA attention vs the splash kernel, the splash block
sweep, the model's forward + backward MFU per attention and remat policy, and the layer-scan design.

    python -m bench.attention --out attention.json            # on a TPU (about 5 minutes on a v5e)
    python -m bench.attention --tiny --out /tmp/attention.json  # CPU smoke run (splash interpreted)

Sections (``--sections``, default all):

* ``attention``: attention alone, forward + backward, ``[1, 8192, 4096 wide]`` bf16, head layouts
  32x128 and 16x256, causal and window 4096: ``xla_today`` (``attention_chunk`` 1024, every chunk
  scoring all keys, as before key slicing), ``xla`` (the same, sliding chunks reading only their
  window's keys) and ``splash`` (blocks 512). Ratios against ``xla_today``.
* ``sweep``: splash with square blocks 256 / 512 / 1024, both layouts, both masks (the defaults in
  ``model.config.SPLASH_BLOCK_Q`` / ``SPLASH_BLOCK_KV`` are set from it).
* ``model``: the model's forward + backward (7B widths, 4 layers S,S,S,F, vocab 32000, seq 8192,
  batch 1, bf16 compute, fp32 params), xla vs splash at remat ``full``, and splash with
  ``dots_with_no_batch_dims_saveable``, both layouts: step time, MFU (``model.flops_per_token``,
  the dense-causal convention, over the chip's bf16 peak) and peak HBM
  (``memory_stats()["peak_bytes_in_use"]``). Each config runs in its own process, so each peak is
  its own (``--tiny``, on a CPU that reports no peak: every section in one process).
* ``scan``: the per-layer static window under a scan. The model scans over the repeating group of
  layer types (``model.transformer.run_layers``); the alternative is a scan over every layer with
  ``lax.switch`` between the kernels. Compile seconds, XLA's temporary bytes and step time of
  both, fwd + bwd, remat full, the platform's attention (``--scan_topology``: compiled for a TPU).

Writes JSON (``--out``) and prints a markdown table per section. Each program is compiled once
(``jit(...).lower(...).compile()``) and timed as the median of ``--iters`` runs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import model
from model import attention
from model.layers import Block, RMSNorm
from model.transformer import Embed, LMHead, remat_policy

SECTIONS = ("attention", "sweep", "model", "scan")
# bf16 dense peak FLOP/s of one chip, by jax device_kind
PEAK_FLOPS = {
    "TPU v4": 275e12,
    "TPU v5 lite": 197e12,
    "TPU v5e": 197e12,
    "TPU v5": 459e12,
    "TPU v5p": 459e12,
    "TPU v6 lite": 918e12,
    "TPU v6e": 918e12,
}
FULL = dict(
    seq=8192,
    width=4096,
    window=4096,
    chunk=1024,
    layouts=((32, 128), (16, 256)),
    blocks=(256, 512, 1024),
    block=512,
    vocab=32000,
    d_model=4096,
    mlp_hidden=11008,
    dtype="bfloat16",
    iters=5,
    model_iters=3,
    scan_layers=(8, 32),
    scan_seq=1024,
    scan_d=512,
    scan_mlp=1408,
)
# --tiny: CPU shapes, one head layout (4 x 16), every section
TINY = dict(
    seq=256,
    width=64,
    window=64,
    chunk=64,
    layouts=((4, 16),),
    blocks=(128, 256),
    block=128,
    vocab=256,
    d_model=64,
    mlp_hidden=96,
    dtype="float32",
    iters=1,
    model_iters=1,
    scan_layers=(8,),
    scan_seq=64,
    scan_d=64,
    scan_mlp=96,
)
REMATS = ("full", "dots_with_no_batch_dims_saveable")
# the model section: xla vs splash at remat full, then splash's remat policies
MODEL_CASES = (("xla", REMATS[0]), ("splash", REMATS[0]), ("splash", REMATS[1]))


# ------------------------------------------------------------------------------ worker side (JAX)


def _compile_and_time(fn, args, iters: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    mem = compiled.memory_analysis()
    return {
        "ms": 1e3 * statistics.median(times),
        "compile_s": compile_s,
        "temp_bytes": None if mem is None else int(mem.temp_size_in_bytes),
    }


def attention_case(p: dict, heads: int, hd: int, window: int | None, impl: str, block: int) -> dict[str, Any]:
    """Attention alone, forward + backward (vjp against a fixed cotangent)."""
    cfg = model.get_config(
        "olmo3-7b",
        n_heads=heads,
        n_kv_heads=heads,
        head_dim=hd,
        attention_chunk=p["chunk"],
        splash_block_q=block,
        splash_block_kv=block,
        compute_dtype=p["dtype"],
    )
    keys = jax.random.split(jax.random.key(0), 4)
    q = jax.random.normal(keys[0], (1, p["seq"], heads, 1, hd), p["dtype"])
    k, v = (jax.random.normal(kk, (1, p["seq"], heads, hd), p["dtype"]) for kk in keys[1:3])
    ct = jax.random.normal(keys[3], q.shape, p["dtype"])
    interpret = jax.default_backend() == "cpu"
    attend = {
        "xla_today": lambda q, k, v: attention.attend_xla(q, k, v, None, window, cfg, slice_keys=False),
        "xla": lambda q, k, v: attention.attend_xla(q, k, v, None, window, cfg),
        "splash": lambda q, k, v: attention.attend_splash(q, k, v, None, window, cfg, interpret=interpret),
    }[impl]

    def fwd_bwd(q, k, v):
        out, vjp = jax.vjp(attend, q, k, v)
        return out, vjp(ct)

    return _compile_and_time(fwd_bwd, (q, k, v), p["iters"]) | dict(dtype=str(jnp.dtype(p["dtype"])))


def model_config(p: dict, heads: int, hd: int, impl: str, remat: str, n_layers: int = 4, **over):
    types = ("sliding_attention",) * 3 + ("full_attention",)
    return model.get_config(
        "olmo3-7b",
        n_layers=n_layers,
        layer_types=types * (n_layers // 4) + types[: n_layers % 4],
        vocab_size=p["vocab"],
        d_model=p["d_model"],
        mlp_hidden=p["mlp_hidden"],
        n_heads=heads,
        n_kv_heads=heads,
        head_dim=hd,
        max_seq_len=p["seq"],
        sliding_window=p["window"],
        compute_dtype=p["dtype"],
        param_dtype="float32",
        attention_impl=impl,
        remat=remat,
        attention_chunk=p["chunk"],
        splash_block_q=p["block"],
        splash_block_kv=p["block"],
        **over,
    )


def _loss(cfg, forward=None):
    """value_and_grad of the next-token loss; ``forward(params, tokens) -> logits`` (default: the model's)."""

    def loss(params, tokens):
        logits = model.forward(cfg, params, tokens[:, :-1]) if forward is None else forward(params, tokens[:, :-1])
        logp = jax.nn.log_softmax(logits)
        return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))

    return jax.value_and_grad(loss)


def model_case(p: dict, heads: int, hd: int, impl: str, remat: str) -> dict[str, Any]:
    """The model's forward + backward on one device: ms, MFU, peak HBM (this process only)."""
    cfg = model_config(p, heads, hd, impl, remat)
    params = model.init(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (1, p["seq"] + 1), 0, cfg.vocab_size, jnp.int32)
    out = _compile_and_time(_loss(cfg), (params, tokens), p["model_iters"])
    device = jax.devices()[0]
    stats = device.memory_stats() or {}
    flops = model.flops_per_token(cfg, p["seq"]) * p["seq"]
    peak = PEAK_FLOPS.get(device.device_kind)
    out.update(
        device_kind=device.device_kind,
        tflops=flops / out["ms"] * 1e-9,
        mfu=None if peak is None else flops / (out["ms"] / 1e3) / peak,
        peak_hbm_gib=stats.get("peak_bytes_in_use", 0) / 2**30 if stats else None,
    )
    return out


def run_layers_switch(cfg, layers, x, segment_ids, positions, rules=None, mesh=None):
    """The alternative design measured in ``scan``: a scan over all L layers, each choosing its
    kernel with ``lax.switch`` on its layer type (both kernels compiled into the one body)."""
    windows = sorted({cfg.window_of(i) for i in range(cfg.n_layers)}, key=lambda w: -1 if w is None else w)
    index = jnp.asarray([windows.index(cfg.window_of(i)) for i in range(cfg.n_layers)], jnp.int32)

    def branch(window):
        block = Block(cfg, rules, mesh, window, parent=None)
        fn = lambda params, h: block.apply({"params": params}, h, segment_ids, positions)[0]
        return jax.checkpoint(fn, policy=remat_policy(cfg.remat), prevent_cse=False)

    branches = [branch(w) for w in windows]
    body = lambda h, xs: (jax.lax.switch(xs[1], branches, xs[0], h), None)
    return jax.lax.scan(body, x, (layers, index))[0]


def scan_case(p: dict, n_layers: int, design: str, remat: str = "full", topology: str | None = None) -> dict[str, Any]:
    """Both layer-scan designs, fwd + bwd. Without ``topology``: the ``scan_*`` sizes with the
    platform's attention (``auto``), compiled and run here. With one (e.g. ``v5e:2x2``, libtpu installed): 7B widths at seq 8192 with
    splash, compiled ahead of time for one device of that TPU topology (compile seconds and XLA's
    temporary bytes; nothing runs)."""
    if topology:
        cfg = model_config(FULL, 32, 128, "splash", remat, n_layers=n_layers)
    else:
        q = dict(
            p,
            seq=p["scan_seq"],
            d_model=p["scan_d"],
            mlp_hidden=p["scan_mlp"],
            window=p["scan_seq"] // 2,
            chunk=p["scan_seq"] // 4,
        )
        cfg = model_config(q, max(1, q["d_model"] // 64), 64, "auto", remat, n_layers=n_layers)

    mesh = _topology_mesh(topology) if topology else None
    rules = None if mesh is None else model.ShardingConfig().rules

    def group_forward(params, tokens):
        return model.forward(cfg, params, tokens, sharding=None if mesh is None else model.ShardingConfig(), mesh=mesh)

    def switch_forward(params, tokens):
        pos = jnp.broadcast_to(jnp.arange(tokens.shape[1]), tokens.shape)
        x = Embed(cfg).apply({"params": params["embed"]}, tokens)
        x = run_layers_switch(cfg, params["layers"], x, None, pos, rules, mesh)
        x = RMSNorm(cfg, ("embed",)).apply({"params": params["final_norm"]}, x)
        return LMHead(cfg).apply({"params": params["lm_head"]}, x)

    fn = _loss(cfg, group_forward if design == "group" else switch_forward)
    if topology:
        return _compile_for_topology(fn, cfg, mesh)
    params = model.init(cfg, jax.random.key(0))
    tokens = jax.random.randint(jax.random.key(1), (1, cfg.max_seq_len + 1), 0, cfg.vocab_size, jnp.int32)
    return _compile_and_time(fn, (params, tokens), p["model_iters"])


def _topology_mesh(topology: str):
    """A one-device ("data", "fsdp", "tensor") mesh of an abstract TPU of ``topology`` (the model
    then resolves its kernels for TPU: splash compiled by Mosaic, not interpreted)."""
    devices = topologies.get_topology_desc(topology_name=topology, platform="tpu").devices
    return Mesh(np.asarray(devices[:1]).reshape(1, 1, 1), model.MESH_AXES)


def _compile_for_topology(fn, cfg, mesh) -> dict[str, Any]:
    one = NamedSharding(mesh, PartitionSpec())
    params = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=one), model.abstract_params(cfg))
    tokens = jax.ShapeDtypeStruct((1, cfg.max_seq_len + 1), jnp.int32, sharding=one)
    t0 = time.perf_counter()
    mem = jax.jit(fn).lower(params, tokens).compile().memory_analysis()
    assert mem is not None, "this backend reports no memory analysis"
    return {"ms": None, "compile_s": time.perf_counter() - t0, "temp_bytes": int(mem.temp_size_in_bytes)}


def _guarded(fn, *args) -> dict[str, Any]:
    """fn's result, or {"error": its one-line reason} (e.g. a config the chip cannot hold): one
    failing case must not hide the others' figures."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001 - reported in the table and the JSON, and the exit status
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"}


def worker(section: str, case: dict, p: dict) -> dict[str, Any]:
    if section in ("attention", "sweep"):
        return attention_case(p, case["heads"], case["hd"], case["window"], case["impl"], case["block"])
    if section == "model":
        return model_case(p, case["heads"], case["hd"], case["impl"], case["remat"])
    return scan_case(p, case["layers"], case["design"], case.get("remat", "full"), case.get("topology"))


# ------------------------------------------------------------------------- orchestration (no JAX)


def cases(section: str, p: dict) -> list[dict]:
    masks = (("causal", None), (f"window {p['window']}", p["window"]))
    layouts = [{"layout": f"{h}x{hd}", "heads": h, "hd": hd} for h, hd in p["layouts"]]
    if section == "attention":
        return [
            {**lay, "mask": m, "window": w, "impl": impl, "block": p["block"]}
            for lay in layouts
            for m, w in masks
            for impl in (("xla_today", "splash") if w is None else ("xla_today", "xla", "splash"))
        ]
    if section == "sweep":
        return [
            {**lay, "mask": m, "window": w, "impl": "splash", "block": b}
            for lay in layouts
            for m, w in masks
            for b in p["blocks"]
        ]
    if section == "model":
        return [{**lay, "impl": impl, "remat": r} for lay in layouts for impl, r in MODEL_CASES]
    if p.get("scan_topology"):
        return [
            {"layers": 8, "design": d, "remat": r, "topology": p["scan_topology"]}
            for r in REMATS
            for d in ("group", "switch")
        ]
    return [{"layers": n, "design": d} for n in p["scan_layers"] for d in ("group", "switch")]


def run_worker_process(section: str, batch: list[dict], tiny: bool) -> list[dict]:
    """Runs ``batch`` in a fresh process (its own device, its own peak memory); one JSON line back.
    section ``all``: each case names its own (``"section"``), as the --tiny run sends them."""
    cmd = [sys.executable, "-m", "bench.attention", "--_worker", section, "--_cases", json.dumps(batch)]
    topology = next((c["topology"] for c in batch if "topology" in c), None)
    cmd += (["--tiny"] if tiny else []) + (["--scan_topology", topology] if topology else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
    if proc.returncode != 0:
        return [
            {**c, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"} for c in batch
        ]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def markdown(section: str, rows: list[dict]) -> str:
    def fmt(x, spec=".1f"):
        return "—" if x is None else format(x, spec)

    if section == "attention":
        base = {(r["layout"], r["mask"]): r.get("ms") for r in rows if r["impl"] == "xla_today"}
        lines = ["| heads | mask | impl | ms (fwd+bwd) | × today's xla |", "|---|---|---|---|---|"]
        for r in rows:
            ratio = (
                base.get((r["layout"], r["mask"])) / r["ms"]
                if r.get("ms") and base.get((r["layout"], r["mask"]))
                else None
            )
            lines.append(f"| {r['layout']} | {r['mask']} | {r['impl']} | {fmt(r.get('ms'))} | {fmt(ratio, '.2f')} |")
    elif section == "sweep":
        lines = ["| heads | mask | block | ms (fwd+bwd) |", "|---|---|---|---|"]
        lines += [f"| {r['layout']} | {r['mask']} | {r['block']} | {fmt(r.get('ms'))} |" for r in rows]
    elif section == "model":
        lines = [
            "| heads | attention | remat | ms | TFLOP/s | MFU | peak HBM GiB | compile s |",
            "|---|---|---|---|---|---|---|---|",
        ]
        lines += [
            f"| {r['layout']} | {r['impl']} | {r['remat']} | {fmt(r.get('ms'))} | {fmt(r.get('tflops'))} | "
            f"{fmt(None if r.get('mfu') is None else 100 * r['mfu'])}% | {fmt(r.get('peak_hbm_gib'), '.2f')} | "
            f"{fmt(r.get('compile_s'))} |"
            for r in rows
        ]
    else:
        lines = ["| layers | design | remat | compile s | temp MiB | ms |", "|---|---|---|---|---|---|"]
        lines += [
            f"| {r['layers']} | {r['design']} | {r.get('remat', 'full')} | {fmt(r.get('compile_s'))} | "
            f"{fmt(None if r.get('temp_bytes') is None else r['temp_bytes'] / 2**20)} | {fmt(r.get('ms'))} |"
            for r in rows
        ]
    errors = [f"- {r}: {r['error']}" for r in rows if "error" in r]
    return "\n".join([f"### {section}", *lines, *errors])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m bench.attention", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", help="write the results as JSON here")
    ap.add_argument("--tiny", action="store_true", help="CPU-sized shapes (splash runs interpreted)")
    ap.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, of {SECTIONS}")
    ap.add_argument(
        "--scan_topology",
        help="compile the scan section for this TPU topology (e.g. v5e:2x2) "
        "instead of running it here: 7B widths, seq 8192, splash, 8 layers (needs libtpu)",
    )
    ap.add_argument("--_worker", help=argparse.SUPPRESS)
    ap.add_argument("--_cases", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    p = dict(TINY if args.tiny else FULL, scan_topology=args.scan_topology)
    if args._worker:
        todo = json.loads(args._cases)
        print(json.dumps([{**c, **_guarded(worker, c.get("section", args._worker), c, p)} for c in todo]))
        return 0
    sections = [s for s in args.sections.split(",") if s]
    unknown = sorted(set(sections) - set(SECTIONS))
    if unknown:
        print(f"error: unknown sections {unknown}; known: {SECTIONS}", file=sys.stderr)
        return 2
    t0 = time.perf_counter()
    results: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "tiny": args.tiny, "shapes": p, "sections": {}}
    # --tiny (a CPU smoke run, no memory figures): every section's cases in one worker process, one
    # JAX start instead of one a section
    every_case = [{**c, "section": s} for s in sections for c in cases(s, p)]
    tiny_rows = run_worker_process("all", every_case, True) if args.tiny else []
    for section in sections:
        if args.tiny:
            rows = [{k: v for k, v in r.items() if k != "section"} for r in tiny_rows if r["section"] == section]
        else:
            todo = cases(section, p)
            # one process per model config on the chip (its own peak memory); the small programs share one
            batches = [[c] for c in todo] if section == "model" else [todo]
            rows = [r for b in batches for r in run_worker_process(section, b, False)]
        results["sections"][section] = rows
        print(markdown(section, rows), flush=True)
        print(f"({section}: {time.perf_counter() - t0:.0f} s since the start)", flush=True)
    results["total_s"] = time.perf_counter() - t0
    print(f"total {results['total_s']:.0f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1, default=str)
    failed = [r for rows in results["sections"].values() for r in rows if "error" in r]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
