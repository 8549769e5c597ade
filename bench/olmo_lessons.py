"""`python -m bench.olmo_lessons --out DIR` — the case study's lessons against OLMo-core's own curve.

`make lessons` (trainer/compare/lessons.py) compares bf16 Adam moments and the double-sharding
replay with olmax's *own* correct run. Here the reference is OLMo-core 3.0.0 itself
(`bench.olmo_reference`), so the prose slice is written as token files both trainers read in AI2's
order: the first `--docs` prose documents of the embedded sample, tokenized with dolma2, each
followed by EOS, concatenated and cut into `--seq_len` instances (the remainder dropped), 80% of the
documents to two train files, the rest to the held-out file. The runs are the lessons' settings
(tiny.yaml, G 8, lr 5e-3, 20 warmup, held-out every 10) in float32 with `data_order: olmo-core`,
`document_masking: false` and `schedule.step_offset: 1` (what OLMo-core can run): olmax correct,
olmax with bf16 moments, olmax with `UNSAFE_double_sharding_experiment_hosts=2` (when the trainer
accepts it with this order), each `trainer.compare`d against OLMo-core's table. Prints the table;
DIR/lessons.json holds it.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

from contract.rundir import RunDir

RUNS = {
    "correct": [],
    "bf16_moments": [
        "optimizer.mu_dtype=bfloat16",
        "optimizer.nu_dtype=bfloat16",
        "allow_low_precision_optimizer_state=true",
    ],
    "double_sharding": ["UNSAFE_double_sharding_experiment_hosts=2"],
}


def prose_token_files(docs: int, seq_len: int) -> tuple[list[np.ndarray], np.ndarray]:
    """(two train token arrays, the held-out array), each a whole number of seq_len instances."""
    import gzip

    from pipelines.dolma2_tokenizer import EOS_ID, dolma2
    from pipelines.sample import build_sample

    texts = []
    for part in sorted((Path(build_sample()) / "prose").glob("*.jsonl.gz")):
        with gzip.open(part, "rt", encoding="utf-8") as f:
            texts += [json.loads(line)["text"] for line in f if line.strip()]
    if len(texts) < docs:
        raise SystemExit(f"the sample has {len(texts)} prose documents, fewer than --docs {docs}")
    enc = dolma2()
    ids = [np.asarray(enc.encode_ordinary(t) + [EOS_ID], np.uint32) for t in texts[:docs]]
    cut = int(0.8 * docs)

    def whole(parts: list[np.ndarray]) -> np.ndarray:
        flat = np.concatenate(parts)
        return flat[: len(flat) // seq_len * seq_len]

    half = cut // 2
    return [whole(ids[:half]), whole(ids[half:cut])], whole(ids[cut:])


def overrides(manifest: str, steps: int, seq_len: int) -> list[str]:
    return [
        f"data=[{manifest}]",
        "data_order=olmo-core",
        "model_overrides.compute_dtype=float32",
        "document_masking=false",
        "global_batch_size=8",
        f"steps={steps}",
        "lr=5e-3",
        "schedule.kind=cosine",
        "schedule.warmup_steps=20",
        "schedule.step_offset=1",
        "loss_chunk=0",
        "eval.every=10",
        "eval_batches=null",
        "checkpoint.every=0",
        "downstream.every=0",
        "mesh.cpu_devices=1",
        "verify_data_gib=0",
        "log.progress_every=20",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.olmo_lessons", description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="a new folder")
    p.add_argument("--docs", type=int, default=100)
    p.add_argument("--seq_len", type=int, default=128)
    p.add_argument("--steps", type=int, default=120)
    a = p.parse_args(argv)
    out = Path(a.out)
    if out.exists():
        print(f"error: --out {out} exists; choose a new folder", file=sys.stderr)
        return 2
    out.mkdir(parents=True)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    from bench import olmo_reference as ref_lib
    from bench.olmo_step_for_step import ROOT, TINY, write_token_dataset
    from pipelines.dolma2_tokenizer import CL100K_RANKS_SHA256, EOS_ID, PAD_ID, VOCAB_SIZE
    from trainer.config.schema import load_config

    train, heldout = prose_token_files(a.docs, a.seq_len)
    tokenizer = {
        "name": "dolma2",
        "ranks_sha256": CL100K_RANKS_SHA256,
        "vocab_size": VOCAB_SIZE,
        "eos_id": EOS_ID,
        "pad_id": PAD_ID,
    }
    manifest = write_token_dataset(str(out / "data"), a.seq_len, train, heldout, tokenizer)
    base = overrides(manifest, a.steps, a.seq_len)
    spec = out / "olmax_runs.json"
    spec.write_text(json.dumps([[str(out / "runs" / n), base + extra] for n, extra in RUNS.items()]))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    with open(out / "olmax.log", "w") as log:
        olmax = subprocess.Popen(
            [sys.executable, "-m", "bench.olmo_step_for_step", "--olmax_runs", str(spec), "--keep_going"],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        ref = str(out / "ref.jsonl")
        ref_lib.run(load_config(TINY, base), ref, str(out / "work"))
        olmax.wait()
    from trainer.compare import cli

    rows: dict[str, dict[str, Any]] = {}
    for name in RUNS:
        run_dir = out / "runs" / name
        if not RunDir(run_dir).summary.is_file():
            rows[name] = {"compare": "not run (see olmax.log)"}
            continue
        code = cli.main([str(run_dir), ref, "--out", str(out / "compare" / name)])
        result = json.loads((out / "compare" / name / "compare.json").read_text())
        held = result["aligned"]["heldout_loss"]
        train_gap = (result["verdict"].get("train_loss_gap") or {}).get("final")
        rows[name] = {
            "compare": {0: "PASS", 1: "FAIL", 2: "UNKNOWN"}[code],
            "heldout_max_abs_diff": held["max_abs_diff"],
            "heldout_final_diff": held["diff"][-1] if held["diff"] else None,
            "train_gap_final_smoothed": train_gap,
            "summary": result["verdict"]["summary"],
        }
    (out / "lessons.json").write_text(json.dumps(rows, indent=1) + "\n")
    for name, r in rows.items():
        print(name, json.dumps(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
