"""Numerics at length (issue 57): N optimizer updates of a long recipe (default: the 65k proxy) with
its splash blocks against the same updates with other kernel settings (default: 512 x 512 splash
blocks; trailing key=value overrides apply to both runs), from the same initial state on the same batches: the per-step losses agree within
``LOSS_ATOL``, the on-chip splash test's bound (``tests/model/test_attention_tpu.py``: ``ATOL_BF16``,
the largest bf16 error it accepts on values of order one).

    python -m bench.long_numerics [--config trainer/configs/olmo3-7b-proxy-v5e-65k.yaml] [--steps 24]
        [--other "model_overrides.splash_block_q=512 model_overrides.splash_block_kv=512"]
        [--docs 8] [--out FILE.json] [key=value ...]

Each run is ``trainer.build.build`` (trainer.main's optimizer, skip step, z-loss, clipping, jitted
step) in a process of its own (one chip holds one 65k state at a time). The batches are a learnable
synthetic language, so the loss moves over the updates: ``--docs`` documents per row (random lengths,
document masking and per-document positions, as packed data has), each a walk of a fixed random
graph over 1,024 ordinary token ids with 4 successors per id (the floor is ln 4 nats). Exit 0 when
every step's losses agree, 1 when one does not, 2 for bad input (one ``error:`` line).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from contract import cli
from contract.outputs import check_out_file, write_atomic
from trainer import libtpu_flags
from trainer.config.schema import load_config

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = "trainer/configs/olmo3-7b-proxy-v5e-65k.yaml"
DEFAULT_OTHER = "model_overrides.splash_block_q=512 model_overrides.splash_block_kv=512"
LOSS_ATOL = 3e-2  # tests/model/test_attention_tpu.py ATOL_BF16
WORDS, SUCCESSORS = 1024, 4
WORKER_TIMEOUT_S = 540


def doc_lengths(rng: np.random.Generator, seq_len: int, docs: int) -> np.ndarray:
    """``docs`` positive lengths summing to ``seq_len`` (cut at distinct random points)."""
    cuts = np.sort(rng.choice(np.arange(1, seq_len), size=docs - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [seq_len]]))


def walk_batch(step: int, global_batch: int, seq_len: int, eos_id: int, docs: int) -> dict:
    """Loader-shaped host batch of step ``step`` (deterministic in it): each row ``docs`` documents,
    each a random walk of the fixed successor graph (seed 0) over ``WORDS`` ids below ``eos_id``."""
    graph = np.random.default_rng(0).choice(min(WORDS, eos_id), size=(min(WORDS, eos_id), SUCCESSORS))
    rng = np.random.default_rng(1000 + step)
    tokens = np.empty((global_batch, seq_len), np.int32)
    segment_ids = np.empty_like(tokens)
    positions = np.empty_like(tokens)
    for row in range(global_batch):
        lengths = doc_lengths(rng, seq_len, docs)
        segment_ids[row] = np.repeat(np.arange(1, docs + 1), lengths)
        positions[row] = np.concatenate([np.arange(n) for n in lengths])
        choice = rng.integers(0, SUCCESSORS, seq_len)
        word = int(rng.integers(0, graph.shape[0]))
        for t in range(seq_len):  # a walk restarts nowhere: the documents cut one long walk
            tokens[row, t] = word
            word = int(graph[word, choice[t]])
    return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions, "loss_mask": np.ones_like(tokens)}


def compare(reference: Sequence[float], other: Sequence[float], atol: float = LOSS_ATOL) -> dict:
    """Per-step agreement of two loss trajectories: the largest absolute and relative difference, the
    step where the absolute one is largest, and whether every step is within ``atol``."""
    a, b = np.asarray(reference, np.float64), np.asarray(other, np.float64)
    if a.shape != b.shape or a.size == 0:
        raise ValueError(f"the runs have {a.size} and {b.size} losses")
    diff = np.abs(a - b)
    return {
        "max_abs_diff": float(diff.max()),
        "max_rel_diff": float((diff / np.abs(a)).max()),
        "worst_step": int(diff.argmax()),
        "atol": atol,
        "within": bool(np.isfinite(diff).all() and (diff <= atol).all()),
    }


def _worker(config: str, overrides: Sequence[str], steps: int, docs: int) -> dict:
    """The losses of ``steps`` updates of one config from its init seed (see the module docstring)."""
    cfg = load_config(config, overrides)
    libtpu_flags.apply(cfg.libtpu_flags)  # as trainer.main does: before JAX loads libtpu
    import jax  # JAX after the recipe's libtpu flags: never at this module's import

    from trainer import mesh as mesh_lib  # (imports JAX)
    from trainer.build import build  # (imports JAX)

    if cfg.seq_len is None:
        raise SystemExit(f"error: {config} sets no seq_len")
    b = build(cfg)
    G, T = cfg.global_batch_size, cfg.seq_len
    params, opt_state = b.init_state(jax.random.key(cfg.init_seed))
    losses, skipped = [], 0
    for step in range(steps):
        batch = mesh_lib.global_batch(walk_batch(step, G, T, b.model_cfg.eos_id, docs), b.mesh, G)
        params, opt_state, m = b.train_step(params, opt_state, np.float32(b.schedule(step)), batch)
        losses.append(float(m["loss"]))
        skipped += int(m["skipped"])
    return {
        "config": config,
        "overrides": list(overrides),
        "losses": losses,
        "skipped": skipped,
        "device_kind": jax.devices()[0].device_kind,
    }


def _run(config: str, overrides: Sequence[str], steps: int, docs: int) -> dict:
    args = ["--worker", "--config", config, "--steps", str(steps), "--docs", str(docs), *overrides]
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    proc = subprocess.run(
        [sys.executable, "-m", "bench.long_numerics", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        timeout=WORKER_TIMEOUT_S,
        check=False,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"error: bench.long_numerics worker {' '.join(overrides) or 'recipe'} failed (exit {proc.returncode})"
        )
    return json.loads(proc.stdout.strip().splitlines()[-1])


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = cli.Parser(prog="python -m bench.long_numerics", description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default=DEFAULT_CONFIG, help="the long recipe")
    ap.add_argument("--steps", type=cli.integer(1), default=24, help="optimizer updates per run")
    ap.add_argument("--docs", type=cli.integer(1), default=8, help="documents per row")
    ap.add_argument("--other", default=DEFAULT_OTHER, help="the compared run's trainer key=value overrides")
    ap.add_argument("--out", default=None, metavar="FILE", help="write the result as JSON")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("overrides", nargs="*", help="trainer key=value overrides applied to both runs")
    return ap.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    common, other = list(args.overrides), [*args.overrides, *args.other.split()]
    if args.worker:
        print(json.dumps(_worker(args.config, common, args.steps, args.docs)))
        return 0
    try:
        cfg = load_config(args.config, other)
        if cfg.seq_len is None or cfg.seq_len <= args.docs:
            raise ValueError(f"{args.config}: seq_len {cfg.seq_len} leaves no room for {args.docs} documents")
        if args.out:
            check_out_file(args.out)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ref = _run(args.config, common, args.steps, args.docs)
    alt = _run(args.config, other, args.steps, args.docs)
    verdict = compare(ref["losses"], alt["losses"])
    result = {"config": args.config, "steps": args.steps, "docs": args.docs, "reference": ref, "other": alt, **verdict}
    print(f"{'step':>4} {'recipe':>10} {'other':>10} {'|diff|':>9}")
    for i, (a, b) in enumerate(zip(ref["losses"], alt["losses"])):
        print(f"{i:4d} {a:10.5f} {b:10.5f} {abs(a - b):9.2e}")
    print(
        f"{ref['device_kind']}: {args.steps} updates, max |diff| {verdict['max_abs_diff']:.2e} (step "
        f"{verdict['worst_step']}), max relative {verdict['max_rel_diff']:.2e}; bound {LOSS_ATOL}: "
        f"{'within' if verdict['within'] else 'OUTSIDE'}; skipped steps {ref['skipped']} / {alt['skipped']}"
    )
    if args.out:
        write_atomic(args.out, json.dumps(result, indent=1) + "\n")
    return 0 if verdict["within"] else 1


if __name__ == "__main__":
    sys.exit(main())
