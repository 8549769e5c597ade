"""The 7B stage-1 recipes compiled for TPU slices: fits?, peak HBM per device, compile seconds.

Runs ``python -m trainer.compile`` (the trainer's own train + eval steps, ahead of time, on this
CPU machine) once per (recipe, topology, rows per device per microbatch), one at a time, at low
priority, keeping the recipe's global batch (512 x 8192) and reaching the rows per device with
``microbatches`` = rows per device / that. Writes each run's JSON and a Markdown table.

    python -m bench.compile_table [--recipes olmo3-7b-stage1 olmo3-7b-stage1-mxu]
        [--topologies v5p:2x2x1 v5p:2x4x4 tpu7x:2x2x1 tpu7x:2x4x4] [--rows 1 2 4]
        [--out out/compile_table] [key=value ...]

It measures memory as the TPU compiler plans it, not time per step or MFU (those need a chip).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


def device_count(topology: str) -> int:
    """Devices libtpu describes for one slice of ``topology`` (asked in a subprocess, so that this
    process never loads libtpu)."""
    code = (
        "import os; os.environ['JAX_PLATFORMS'] = 'cpu'; os.environ['ALLOW_MULTIPLE_LIBTPU_LOAD'] = '1'\n"
        "from trainer.compile import hidden_stderr, topology_devices\n"
        f"with hidden_stderr(False):\n    n = len(topology_devices({topology!r}, 1))\nprint(n)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    return int(out.stdout.split()[-1])


def row(r: dict) -> str:
    peak = (r.get("per_device_bytes") or {}).get("peak")
    eval_peak = (r.get("eval_per_device_bytes") or {}).get("peak")
    fmt = lambda b: "RESOURCE_EXHAUSTED" if b is None else f"{b / GIB:.1f}"
    seconds = r["compile_seconds"] + r.get("eval_compile_seconds", 0.0)
    return (
        f"| {r['model']} | {r['topology']} | {r['devices']} | {r['rows_per_device'] / r['microbatches']:g} | "
        f"{r['microbatches']} | {'yes' if r['fits'] else '**no**'} | {fmt(peak)} | {fmt(eval_peak)} | "
        f"{r['hbm_bytes_per_device'] / GIB:.2f} | {seconds:.0f} |"
    )


HEADER = (
    "| model | topology | devices | rows per device per microbatch | microbatches | fits | peak GiB/device "
    "(train) | peak GiB/device (eval) | capacity GiB | compile s (train + eval) |\n"
    "|---|---|---|---|---|---|---|---|---|---|"
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--recipes", nargs="+", default=["olmo3-7b-stage1", "olmo3-7b-stage1-mxu"])
    ap.add_argument("--topologies", nargs="+", default=["v5p:2x2x1", "v5p:2x4x4", "tpu7x:2x2x1", "tpu7x:2x4x4"])
    ap.add_argument("--rows", nargs="+", type=int, default=[1, 2, 4])
    ap.add_argument("--out", default="out/compile_table")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [HEADER]
    for topology in args.topologies:
        devices = device_count(topology)
        for recipe in args.recipes:
            for rows in args.rows:
                G = 512  # the recipe's
                if G % (devices * rows):
                    continue
                name = f"{recipe}_{topology.replace(':', '-')}_r{rows}"
                cmd = [
                    "nice",
                    "-n",
                    "10",
                    sys.executable,
                    "-m",
                    "trainer.compile",
                    "--config",
                    f"trainer/configs/{recipe}.yaml",
                    "--topology",
                    topology,
                    "--out",
                    str(out / f"{name}.json"),
                    f"microbatches={G // (devices * rows)}",
                    *args.overrides,
                ]
                t0 = time.perf_counter()
                proc = subprocess.run(
                    cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)}
                )
                (out / f"{name}.log").write_text(proc.stdout + proc.stderr)
                if not (out / f"{name}.json").exists():
                    print(f"{name}: exit {proc.returncode}, no report:\n{proc.stderr[-2000:]}", flush=True)
                    continue
                lines.append(row(json.loads((out / f"{name}.json").read_text())))
                print(f"{lines[-1]}   ({time.perf_counter() - t0:.0f} s wall)", flush=True)
                (out / "table.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
