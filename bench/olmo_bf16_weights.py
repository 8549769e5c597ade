"""`python -m bench.olmo_bf16_weights DIR` — the final weights of a finished `bench.olmo_bf16` folder,
both frameworks', through ONE float32 forward: how far apart the trained weights are, apart from how
each side's bf16 step measures its own training loss.

`bench.olmo_bf16` compares the per-update training loss each step logs: olmax's bf16 forward with
float32 logits against OLMo-core's with bf16 logits, each with its own rounding. That cross gap has a
shape over updates common to the seeds (bench/RESULTS.md). Here every run's final float32 weights
(olmax: its last checkpoint; OLMo-core: the master weights `olmo_bf16.save_final_weights` wrote) are
scored by olmax's model in float32 on the same token windows of the training files, so the
measurement is common and only the weights differ:

  cross      |CE(olmax, 1 microbatch) − CE(OLMo-core, 1 microbatch)|
  self       |CE(1 microbatch) − CE(2 microbatches)|, olmax's and OLMo-core's
  moments    |CE(olmax with bf16 Adam moments) − CE(OLMo-core, 1 microbatch)|

Measured (3 seeds × 40 updates, 2026-12-08, this CPU host): cross 1.0e-4..2.4e-4 nats, 1.1–2.1× the
larger self gap; moments 5.7e-3..6.6e-3 (41–80×); the logged update-40 gaps were 6.9e-4..2.6e-3. So
the trained weights agree within each framework's own noise, and the swing of the logged gap is in
the bf16 loss measurement. Writes DIR/weights.json and prints the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from bench import olmo_bf16
from bench import olmo_reference as ref_lib
from contract.outputs import write_atomic
from trainer.config.schema import load_config

WINDOWS = 64  # token windows of the training files scored (64 × the recipe's 32 tokens)


def olmax_weights(run_dir: str, overrides: list[str], steps: int) -> dict:
    """An olmax run's parameters after its last update (a pytree of numpy arrays)."""
    import jax  # JAX after main's JAX_PLATFORMS=cpu

    from bench import olmo_step_for_step as sfs  # JAX (sfs imports it) after main's JAX_PLATFORMS=cpu

    params, _ = ref_lib.restore_step(load_config(sfs.TINY, overrides), f"{run_dir}/checkpoints/{steps}")
    return jax.tree.map(np.asarray, params)


def reference_weights(path: str, like: dict) -> dict:
    """OLMo-core's saved final weights (flat, olmax's paths) as a pytree shaped like `like`."""
    import jax  # JAX after main's JAX_PLATFORMS=cpu

    flat = dict(np.load(path))
    treedef = jax.tree_util.tree_structure(like)
    names = list(ref_lib.flat_params(like))  # in the tree's leaf order
    if missing := sorted(set(names) - set(flat)):
        raise ValueError(f"{path} lacks {missing[:3]}")
    return jax.tree_util.tree_unflatten(treedef, [flat[n] for n in names])


def windows(data: str, seq_len: int, n: int = WINDOWS) -> np.ndarray:
    """[n, seq_len] int32: the first n windows of the training token files (`data`: the manifest)."""
    npy = sorted((Path(data).parent / "npy").glob("web-*.npy"))  # sfs.write_data's raw uint32 files
    ids = np.concatenate([np.fromfile(f, "<u4") for f in npy]).astype(np.int32)
    n = min(n, len(ids) // seq_len)
    return ids[: n * seq_len].reshape(n, seq_len)


def float32_ce(mc, params: dict, tokens: np.ndarray) -> float:
    """Mean next-token cross-entropy of `params` on `tokens` by olmax's forward in float32."""
    import jax  # JAX after main's JAX_PLATFORMS=cpu
    import jax.numpy as jnp

    import model  # JAX after main's JAX_PLATFORMS=cpu

    mc32 = dataclasses.replace(mc, compute_dtype="float32")
    logits = model.forward(mc32, params, jnp.asarray(tokens), None).astype(jnp.float32)[:, :-1]
    target = jnp.take_along_axis(logits, jnp.asarray(tokens)[:, 1:, None], -1)[..., 0]
    return float(jnp.mean(jax.nn.logsumexp(logits, -1) - target))


def seed_weights(root: Path, seed: int, steps: int) -> dict[str, Any]:
    """One seed's final-weight CEs and gaps (see the module docstring)."""
    from bench import olmo_step_for_step as sfs  # JAX (sfs imports it) after main's JAX_PLATFORMS=cpu

    olmax, refs = olmo_bf16.layout(root, [seed])
    data = str(root / "data" / "manifest.json")
    extra = dict(olmo_bf16.OLMAX)
    over = {n: olmo_bf16.recipe(data, seed, steps, *extra[n]) for n in extra}
    cfg = load_config(sfs.TINY, over["mb1"])
    tokens = windows(data, int(json.loads(Path(data).read_text())["seq_len"]))
    ox = {n: olmax_weights(olmax[seed][n], over[n], steps) for n in extra}
    oc = {n: reference_weights(t + olmo_bf16.STATE_SUFFIX, ox["mb1"]) for n, t in refs[seed].items()}
    ce = {f"olmax_{n}": float32_ce(cfg.model_cfg(), p, tokens) for n, p in ox.items()}
    ce |= {f"olmo_core_{n}": float32_ce(cfg.model_cfg(), p, tokens) for n, p in oc.items()}
    f: dict[str, Any] = {"tokens": int(tokens.size), "ce": ce}
    f["cross"] = abs(ce["olmax_mb1"] - ce["olmo_core_mb1"])
    f["cross_mb2"] = abs(ce["olmax_mb2"] - ce["olmo_core_mb2"])
    f["self_olmax"] = abs(ce["olmax_mb1"] - ce["olmax_mb2"])
    f["self_olmo_core"] = abs(ce["olmo_core_mb1"] - ce["olmo_core_mb2"])
    f["moments"] = abs(ce["olmax_bf16_moments"] - ce["olmo_core_mb1"])
    larger = max(f["self_olmax"], f["self_olmo_core"], 1e-30)
    f["cross_ratio"], f["moments_ratio"] = f["cross"] / larger, f["moments"] / larger
    logged = olmo_bf16.losses(run_dir=olmax[seed]["mb1"]) - olmo_bf16.losses(table=refs[seed]["mb1"])
    f["logged_last"] = float(abs(logged[-1]))  # the logged gap at the last update, for contrast
    return f


COLUMNS = (
    "cross",
    "cross_mb2",
    "self_olmax",
    "self_olmo_core",
    "cross_ratio",
    "moments",
    "moments_ratio",
    "logged_last",
)


def markdown(figures: dict[int, dict[str, Any]]) -> str:
    lines = ["| seed | " + " | ".join(COLUMNS) + " |", "|---" * (len(COLUMNS) + 1) + "|"]
    lines += [f"| {s} | " + " | ".join(f"{f[c]:.3g}" for c in COLUMNS) + " |" for s, f in figures.items()]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.olmo_bf16_weights", description=__doc__.splitlines()[0])
    p.add_argument("dir", help="a finished `python -m bench.olmo_bf16 --out DIR` folder (its runs kept)")
    p.add_argument("--seeds", type=int, nargs="+", default=list(olmo_bf16.SEEDS))
    p.add_argument("--steps", type=int, default=olmo_bf16.STEPS)
    a = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    root = Path(a.dir)
    _, refs = olmo_bf16.layout(root, a.seeds)
    if lacking := [t for s in a.seeds for t in refs[s].values() if not Path(t + olmo_bf16.STATE_SUFFIX).is_file()]:
        print(
            f"error: {lacking[0]}{olmo_bf16.STATE_SUFFIX} not found: not a finished bench.olmo_bf16 folder",
            file=sys.stderr,
        )
        return 2
    figures = {s: seed_weights(root, s, a.steps) for s in a.seeds}
    write_atomic(root / "weights.json", json.dumps(figures, indent=1) + "\n")
    print(markdown(figures), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
