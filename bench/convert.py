"""`python -m bench.convert --out DIR [--layers N]` — `trainer.convert from-olmo-core` (then
`to-olmo-core` of its output, the way back) on a
checkpoint of OLMo 3 7B's width (d_model 4096, 32 heads, MLP 11008, 100,352 embedding rows, Adam's
moments beside every tensor), with as many layers as the disk holds (default 2): peak RSS of the
converting process and seconds per GB, extrapolated to 32 layers.

The input is synthetic but in AI2's format: an OLMo-core `model_and_optim/` DCP directory (model.*,
optim.state.*.{exp_avg,exp_avg_sq,step}, float32), written by torch.distributed.checkpoint one
tensor at a time (`synthetic_step`: one DCP save per tensor, the metadata merged; this process never
holds more than one tensor either). The conversion runs in a process of its own
(`measured`: `trainer.convert`'s main after its imports and JAX's CPU client, the baseline RSS), a
thread there sampling its RSS every 5 ms (killing it past baseline + `--cap_gib`), and the kernel's
high-water mark (VmHWM) reported at the end: the peak RSS.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RECIPE = "olmo3-7b-stage2"
# the 7B's OLMo-core embedding rows: padded_vocab_size() = 100,352 = 100,278 rounded up to 128
PADDED = ["model_overrides.vocab_pad_multiple=128"]


def recipe_overrides(layers: int) -> list[str]:
    return [f"model_overrides.n_layers={layers}", *PADDED]


def synthetic_step(root: Path, mc: Any, step: int = 1000, seed: int = 0, optim: bool = True) -> Path:
    """An OLMo-core step directory (``root/model_and_optim``) of random float32 tensors with the
    shapes of ``mc``'s OLMo-core model (and SkipStepAdamW's state when ``optim``), written one tensor
    at a time (``trainer.convert.dcp_write``). Returns ``root``."""
    import torch  # optional: the test extra (torch)

    from trainer.convert import olmo_core_names as names  # JAX after the caller's JAX_PLATFORMS
    from trainer.convert.dcp_write import DcpWriter

    out = DcpWriter(root / "model_and_optim", sync_files=False)  # a scratch input: no fsync per file
    gen = torch.Generator().manual_seed(seed)
    for e in names.entries(mc):
        shape = names.olmo_shape(mc, e)
        kinds = {f"model.{e.olmo}": 0.02}
        if optim:
            kinds |= {f"optim.state.{e.olmo}.exp_avg": 1e-3, f"optim.state.{e.olmo}.exp_avg_sq": 1e-6}
        for key, scale in kinds.items():
            t = torch.randn(shape, generator=gen) * scale
            tensors = {key: t.abs() if key.endswith("_sq") else t}
            if optim and key.endswith("exp_avg"):
                tensors[f"optim.state.{e.olmo}.step"] = torch.tensor(float(step))
            out.add(tensors)
            del t, tensors
    out.finish()
    return root


def _rss(pid: int, field: str = "VmRSS") -> int:
    """A process's resident set (or its peak, VmHWM), bytes; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def measured(argv: list[str], cap: int | None) -> int:
    """``python -m bench.convert --measured [--cap BYTES] -- CONVERT_ARGS``: the conversion in this
    process after everything it imports is imported and JAX's CPU client started (the baseline
    RSS), a thread killing the process once its RSS passes baseline + ``cap``; prints one JSON line:
    the baseline, the peak (VmHWM: the kernel's own high-water mark) and the exit code."""
    from trainer.convert import __main__ as convert  # first: its malloc setting precedes the imports below

    convert.limit_malloc_arenas()  # as the command does first
    import jax  # the converter's imports, before the baseline
    import orbax.checkpoint  # noqa: F401
    import tensorstore  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401 - optional: the test extra (torch)

    jax.devices()
    base = _rss(os.getpid())

    def guard() -> None:
        while True:
            if cap is not None and _rss(os.getpid()) > base + cap:
                print(json.dumps({"killed_at_cap": True, "baseline": base, "cap": cap}), flush=True)
                os._exit(137)
            time.sleep(0.005)

    threading.Thread(target=guard, daemon=True).start()
    start = time.monotonic()
    code = convert.main(argv)
    seconds = time.monotonic() - start
    peak = _rss(os.getpid(), "VmHWM")
    print(json.dumps({"baseline": base, "peak": peak, "seconds": seconds, "returncode": code}), flush=True)
    return code


def convert_measured(args: list[str], cap: int | None = None) -> dict[str, Any]:
    """``trainer.convert ARGS`` in a child process (``measured``), its RSS capped at its baseline +
    ``cap``; its JSON line, with ``stderr`` (the progress lines) and ``killed_at_cap``."""
    cmd = [sys.executable, "-m", "bench.convert", *(["--cap", str(cap)] if cap else []), "--measured", "--", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if not lines:
        raise RuntimeError(f"the conversion reported nothing (exit {proc.returncode}): {proc.stderr[-2000:]}")
    return {"killed_at_cap": False, **json.loads(lines[-1]), "exit": proc.returncode, "stderr": proc.stderr}


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run(out: Path, layers: int, cap_gib: float | None) -> dict[str, Any]:
    from trainer.config.schema import load_config  # JAX after the caller's JAX_PLATFORMS
    from trainer.main import config_path

    cfg = load_config(config_path(RECIPE), recipe_overrides(layers))
    mc = cfg.model_cfg()
    t0 = time.monotonic()
    synthetic_step(out / "olmo", mc)
    written_s = time.monotonic() - t0
    size = dir_bytes(out / "olmo")
    args = ["from-olmo-core", str(out / "olmo"), "--out", str(out / "olmax"), "--config", RECIPE]
    os.environ.setdefault("OLMAX_PROGRESS_S", "30")
    r = convert_measured([*args, *recipe_overrides(layers)], int(cap_gib * 2**30) if cap_gib else None)
    if r["exit"] or r["killed_at_cap"]:
        raise RuntimeError(f"conversion failed (exit {r['exit']}): {r['stderr'][-2000:]}")
    back = convert_measured(["to-olmo-core", str(out / "olmax"), "--out", str(out / "olmo_back")])
    if back["exit"]:
        raise RuntimeError(f"export failed (exit {back['exit']}): {back['stderr'][-2000:]}")
    size_32 = size + (32 - layers) * _layer_bytes(mc)
    gb = size / 1e9
    return {
        "layers": layers,
        "input_gb": round(gb, 3),
        "output_gb": round(dir_bytes(out / "olmax") / 1e9, 3),
        "synthetic_write_s": round(written_s, 1),
        "input_gb_32_layers": round(size_32 / 1e9, 1),
        "from_olmo_core": _figures(r, gb, size_32),
        "to_olmo_core": _figures(back, gb, size_32),
    }


def _figures(r: dict[str, Any], gb: float, size_32: int) -> dict[str, Any]:
    lines = r["stderr"].strip().splitlines()
    return {
        "seconds": round(r["seconds"], 1),
        "s_per_gb": round(r["seconds"] / gb, 2),
        "peak_rss_gib": round(r["peak"] / 2**30, 3),
        "baseline_rss_gib": round(r["baseline"] / 2**30, 3),
        "peak_above_baseline_gib": round((r["peak"] - r["baseline"]) / 2**30, 3),
        "seconds_32_layers_extrapolated": round(r["seconds"] / gb * size_32 / 1e9, 0),
        "last_progress_line": [x for x in lines if "MiB in" in x][-1:],
    }


def _layer_bytes(mc: Any) -> int:
    """Bytes of one layer's tensors and their two moments (float32)."""
    from trainer.convert import olmo_core_names as names  # JAX after the caller's JAX_PLATFORMS

    return sum(3 * 4 * int(np.prod(names.olmo_shape(mc, e))) for e in names.entries(mc) if e.layer == 0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.convert", description=__doc__.splitlines()[0])
    p.add_argument("--out", help="a new folder for the synthetic checkpoint and the conversion")
    p.add_argument("--layers", type=int, default=2, help="layers of the synthetic 7B-width checkpoint")
    p.add_argument("--cap_gib", type=float, default=None, help="kill the conversion past this RSS")
    p.add_argument("--keep", action="store_true", help="keep the checkpoints (default: removed after)")
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--measured" in argv:  # measured()'s child: [--cap BYTES] --measured -- CONVERT_ARGS
        head, rest = argv[: argv.index("--measured")], argv[argv.index("--measured") + 2 :]
        return measured(rest, int(head[1]) if head[:1] == ["--cap"] else None)
    a = p.parse_args(argv)
    out = Path(a.out)
    if out.exists():
        print(f"error: --out {out} exists; choose a new folder", file=sys.stderr)
        return 2
    out.mkdir(parents=True)
    try:
        result = run(out, a.layers, a.cap_gib)
    finally:
        if not a.keep:
            for sub in ("olmo", "olmax", "olmo_back"):
                shutil.rmtree(out / sub, ignore_errors=True)
    (out / "figures.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
