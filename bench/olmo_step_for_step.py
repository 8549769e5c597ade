"""`python -m bench.olmo_step_for_step --out DIR` — olmax's training step against OLMo-core's, measured.

Writes token files both trainers read (OLMo-core's `NumpyFSLDataset`, olmax's `data_order:
olmo-core`) and a contract manifest over them, trains each scenario on both sides — olmax with
`trainer.main` (its CLI entry point; the olmax runs in two processes beside this one, each run
paying its own compilation but not JAX's start-up: `build`), OLMo-core with `bench.olmo_reference`
(on one torch thread) — and writes
the largest per-step differences (DIR/figures.json, and a table on stdout):

  a      step for step: 50 updates, 10 of warmup then cosine to 0.1x, float32, crossing an epoch
  skip   a batch of one repeated id planted at update 31 (skip step window 40, sigma 3; 36 updates)
  s2     stage 2 from run a's last checkpoint with its Adam state: linear to 0, no warmup, and in
         microbatches: olmax's 4 against OLMo-core's rank_microbatch_size of one instance (20 updates)

tests/trainer/test_olmo_reference.py asserts its bounds on these same runs (its fixture is
`bench.olmo_lessons.build`: this `build` with the lessons' runs and reference beside). The
learning rate's difference is 0: both log OLMo-core's scheduler's Python float.

A toy tokenizer (512 ids: ordinary ids below 500, EOS 511, PAD 510) keeps the LM head small, so
that 50+ updates of both trainers take seconds; ids are Zipf-distributed (`zipf_tokens`: a model
learns their frequencies within tens of updates, so the loss falls by ~2.5 nats) and never
SPIKE_ID, so a batch of only that id is a loss spike. Every file
is a whole number of instances (no remainder), ends with EOS and holds no PAD id (OLMo-core
would score a PAD target that olmax's loss mask drops: pipelines never write one into a
document). Train files come first in the mixture (OLMo-core numbers their instances in listed
order); the held-out file is a `split: heldout` source evaluated by both (packed instances).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from bench import olmo_reference as ref_lib
from contract import with_fingerprint
from contract.rundir import RunDir
from dataloader import olmo_order
from trainer.config.schema import load_config

VOCAB, EOS, PAD, ORDINARY = 512, 511, 510, 500
SPIKE_ID = 499  # an ordinary id the chain never emits: a batch of only this id is a loss spike


def zipf_tokens(rng: np.random.Generator, n: int, mean_doc: int = 24) -> np.ndarray:
    """uint32 [n]: Zipf(1.2) ids below SPIKE_ID (the tail folded onto SPIKE_ID - 1), an EOS after each
    document, the last id EOS."""
    ids = np.minimum(rng.zipf(1.2, size=n) - 1, SPIKE_ID - 1).astype(np.uint32)
    ends = np.cumsum(rng.integers(1, 2 * mean_doc, size=n))
    ids[ends[ends < n]] = EOS
    ids[-1] = EOS
    return ids


def _shard(path: str, rows: np.ndarray) -> dict:
    w = ArrayRecordWriter(path, "group_size:1")
    for r in rows:
        w.write(r.astype("<u4").tobytes())
    w.close()
    return {"records": len(rows), "sha256": hashlib.sha256(open(path, "rb").read()).hexdigest()}


def write_data(
    root: str,
    seq_len: int,
    train_instances: tuple[int, ...] = (96, 64),
    heldout_instances: int = 8,
    seed: int = 0,
    spike: tuple[int, int, int] | None = None,
) -> str:
    """Token files + manifest under root; returns the manifest path. spike = (step, data seed,
    global batch size): the instances OLMo-core's order puts in batch `step` of epoch 1 (data seed,
    G) are all SPIKE_ID, so both trainers meet the spike at that step."""
    rng = np.random.default_rng(seed)
    os.makedirs(os.path.join(root, "npy"), exist_ok=True)
    files = [zipf_tokens(rng, n * seq_len) for n in train_instances]
    if spike is not None:
        step, data_seed, g = spike
        flat = np.concatenate(files).reshape(-1, seq_len)
        order = olmo_order.permutation(len(flat), data_seed, olmo_order.FIRST_EPOCH)
        flat[order[step * g : (step + 1) * g]] = SPIKE_ID
        files = np.split(flat.reshape(-1), np.cumsum([n * seq_len for n in train_instances])[:-1])
    heldout = zipf_tokens(rng, heldout_instances * seq_len)
    tokenizer = {"name": "toy", "ranks_sha256": None, "vocab_size": VOCAB, "eos_id": EOS, "pad_id": PAD}
    return write_token_dataset(root, seq_len, files, heldout, tokenizer)


def write_token_dataset(
    root: str,
    seq_len: int,
    train: list[np.ndarray],
    heldout: np.ndarray,
    tokenizer: dict,
    more_heldout: dict[str, np.ndarray] | None = None,
) -> str:
    """Token files (uint32, each a whole number of seq_len instances) + a contract manifest under
    root: source `web` (train, the files in order), `val` (split: heldout) and each of
    `more_heldout` (name: its one file, split: heldout). Returns its path."""
    os.makedirs(os.path.join(root, "npy"), exist_ok=True)
    files = train
    sources, mixture = {}, []
    extra = [(name, "heldout", [ids]) for name, ids in (more_heldout or {}).items()]
    for name, split, arrays in (("web", "train", files), ("val", "heldout", [heldout]), *extra):
        paths: list[str] = []
        shards: dict[str, list[dict]] = {"train": [], "heldout": []}
        for i, ids in enumerate(arrays):
            path = os.path.join(root, "npy", f"{name}-{i:03d}.npy")
            ids.astype("<u4").tofile(path)
            paths.append(path)
            rows = ids.reshape(-1, seq_len)
            for sp in ("train", "heldout"):
                rel = f"{name}/{sp}-{i:05d}-of-{len(arrays):05d}.arrayrecord"
                os.makedirs(os.path.join(root, name), exist_ok=True)
                part = rows if sp == split else rows[:0]
                shards[sp].append({"path": rel, **_shard(os.path.join(root, rel), part)})
        n = sum(len(a) // seq_len for a in arrays)
        tokens = sum(len(a) for a in arrays)
        sources[name] = {
            "counts": {"documents": 0, "train": 0, "heldout": 0, "duplicates": 0, "rejected": {}},
            "tokens": {
                "train": tokens if split == "train" else 0,
                "heldout": tokens if split == "heldout" else 0,
                "padding": 0,
            },
            "splits": {sp: {"examples": n if sp == split else 0, "shards": shards[sp]} for sp in ("train", "heldout")},
        }
        src = {
            "name": name,
            "paths": paths,
            "weight": 1.0,
            "max_repetition": None,
            "format": "tokens",
            "dtype": "uint32",
        }
        mixture.append({**src, "split": "heldout"} if split == "heldout" else src)
    manifest = with_fingerprint(
        {
            "format_version": 1,
            "tokenizer": tokenizer,
            "seq_len": seq_len,
            "record_format": "uint32-le[seq_len]",
            "mixture": {
                "name": "olmo-reference",
                "tokenizer": tokenizer["name"],
                "seq_len": seq_len,
                "seed": 0,
                "heldout_fraction": 0.0,
                "dedup": False,
                "sources": mixture,
            },
            "sources": sources,
        }
    )
    path = os.path.join(root, "manifest.json")
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
    return path


def recipe(manifest: str, steps: int, *extra: str) -> list[str]:
    """trainer.main overrides (on trainer/configs/tiny.yaml) of a recipe both trainers run alike."""
    return [
        f"data=[{manifest}]",
        "data_order=olmo-core",
        "model_overrides.compute_dtype=float32",
        f"model_overrides.vocab_size={VOCAB}",
        f"model_overrides.eos_id={EOS}",
        f"model_overrides.pad_id={PAD}",
        "model_overrides.ranks_sha256=null",
        "model_overrides.sliding_window=8",  # the sliding layers' window acts within the 32-token sequence
        "document_masking=false",
        "global_batch_size=4",
        f"steps={steps}",
        "lr=3e-3",
        "schedule.kind=cosine",
        "schedule.warmup_steps=10",
        "schedule.final_lr_ratio=0.1",
        "schedule.step_offset=1",
        "skip_step.enabled=true",
        "loss_chunk=16",  # the chunked loss with its fused backward (the defaults): 2 chunks of 16 positions
        "eval.every=10",
        "eval_batches=null",
        "checkpoint.every=0",
        "downstream.every=0",
        "mesh.cpu_devices=1",
        "verify_data_gib=0",
        "log.progress_every=0",
        *extra,
    ]


# ------------------------------------------------------------------------------------ scenarios

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "trainer/configs/tiny.yaml")
L, G = 32, 4
STEPS, SKIP_STEPS, STAGE2_STEPS = 50, 36, 20
SPIKE_STEP = 30  # 0-based olmax step (OLMo-core's step 31), after the 19 earlier steps window 40 needs
# OLMo-core's rolling_interval_length 40 (it may skip from its 20th loss) and sigma 3 (the spike, ~2x
# the loss, must stand out of a history that still holds the first steps' fall)
SKIP = ["skip_step.window=40", "skip_step.sigma=3"]
STAGE2 = ["schedule.kind=linear", "schedule.warmup_steps=0", "schedule.final_lr_ratio=0.0", "lr=2e-3", "seed=1337"]


def scenarios(root: Path, data: str, spiked: str) -> dict[str, tuple[str, list[str], int]]:
    """{name: (olmax run dir, its overrides on tiny.yaml, updates)}."""
    runs = root / "runs"
    a = str(runs / "a")
    return {
        "a": (a, recipe(data, STEPS), STEPS),
        "skip": (str(runs / "skip"), recipe(spiked, SKIP_STEPS, *SKIP), SKIP_STEPS),
        "s2": (
            str(runs / "s2"),
            recipe(data, STAGE2_STEPS, *STAGE2, "microbatches=4", f"checkpoint.init_from={a}/checkpoints/{STEPS}"),
            STAGE2_STEPS,
        ),
    }


def build(
    root: Path,
    extra_runs: Sequence[tuple[str, list[str]]] = (),
    extra_references: Sequence[tuple[list[str], str]] = (),
) -> dict:
    """Data, the olmax runs and OLMo-core's references of every scenario under root; and, in the
    same processes (the tests' one fixture builds both), `extra_runs` ((run dir, overrides on
    tiny.yaml)) and `extra_references` ((overrides, table path)): bench.olmo_lessons'
    (`olmo_lessons.build`).

    Three processes share the cores: this one trains OLMo-core's references; two olmax processes
    (`run_olmax`) train beside it — stage 1 then stage 2 (its `init_from` is stage 1's last
    checkpoint), and the other runs. OLMo-core's stage 2 starts from the same checkpoint, so it waits
    for the first olmax process only; the stage line is short, so its reference is not left to the end.
    The second olmax process starts once OLMo-core's first reference is done: by then the first has
    compiled the programs every run shares (the parameters' init, the evaluation), and with a
    persistent compilation cache (the tests' session cache, tests/conftest.py) the second reads them
    instead of compiling them a second time at once (measured: bench/RESULTS.md)."""

    root = Path(root)
    data = write_data(str(root / "data"), L)
    spiked = write_data(str(root / "spiked"), L, seed=1, spike=(SPIKE_STEP, 0, G))
    runs = scenarios(root, data, spiked)
    lines = {
        "stages": [runs["a"][:2], runs["s2"][:2]],
        "others": [runs["skip"][:2], *((d, list(o)) for d, o in extra_runs)],
    }
    olmax = {"stages": start_olmax(root / "olmax_stages", lines["stages"])}
    refs = {}
    try:
        for name in ("a", "skip"):
            if name == "skip":  # after OLMo-core's first run: see the docstring
                olmax["others"] = start_olmax(root / "olmax_others", lines["others"])
            out, state = str(root / f"ref_{name}.jsonl"), str(root / f"ref_{name}.npz")
            overrides = runs[name][1]
            if name == "a":  # the command itself, as a user runs it
                if ref_lib.main(["--config", TINY, "--out", out, "--state", state, *overrides]):
                    raise RuntimeError("bench.olmo_reference failed")
            else:
                ref_lib.run(load_config(TINY, overrides), out, str(root / f"work_{name}"), state)
            refs[name] = (out, state)
        for i, (overrides, out) in enumerate(extra_references):
            ref_lib.run(load_config(TINY, overrides), out, str(root / f"work_extra{i}"))
        wait_olmax(root / "olmax_stages", olmax["stages"])
        # stage 2 starts from olmax's stage-1 checkpoint (params and Adam state): after run a
        out, state = str(root / "ref_s2.jsonl"), str(root / "ref_s2.npz")
        ref_lib.run(load_config(TINY, runs["s2"][1]), out, str(root / "work_s2"), state)
        refs["s2"] = (out, state)
        wait_olmax(root / "olmax_others", olmax["others"])
    finally:
        for proc in olmax.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return {"runs": runs, "refs": refs, "data": data, "spiked": spiked}


def start_olmax(stem: Path, specs: Sequence[tuple[str, list[str]]], keep_going: bool = False) -> subprocess.Popen:
    """`python -m bench.olmo_step_for_step --olmax_runs STEM.json` (the runs in order, one process,
    its output in STEM.log), started beside this process."""
    spec = stem.with_suffix(".json")
    spec.write_text(json.dumps([[d, o] for d, o in specs]))
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu"}
    with open(stem.with_suffix(".log"), "w") as log:  # the child holds its own copy
        return subprocess.Popen(
            [sys.executable, "-m", "bench.olmo_step_for_step", "--olmax_runs", str(spec)]
            + (["--keep_going"] if keep_going else []),
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def wait_olmax(stem: Path, proc: subprocess.Popen, timeout: float = 1800) -> None:
    """Wait for `start_olmax`'s process; RuntimeError with its log's tail when it failed."""
    if proc.wait(timeout=timeout):
        log = stem.with_suffix(".log").read_text(errors="replace")
        raise RuntimeError(
            f"the olmax runs of {stem.with_suffix('.json')} failed (exit {proc.returncode}):\n{log[-3000:]}"
        )


# ---------------------------------------------------------------------------------- differences


def rows_of(run_dir: str) -> dict[int, dict]:
    return {r["step"]: r for r in map(json.loads, RunDir(run_dir).metrics.read_text().splitlines())}


def ref_rows(path: str) -> dict[int, dict]:
    return {r[ref_lib.STEP]: r for r in map(json.loads, Path(path).read_text().splitlines())}


def differences(run_dir: str, ref_path: str, heldout_set: str = "val") -> dict[str, np.ndarray]:
    """Per update (olmax's row s is OLMo-core's step s + 1): run − reference, and the reference's own
    values where a test needs them. ValueError when the two did not log the same updates."""
    run, ref = rows_of(run_dir), ref_rows(ref_path)
    if sorted(s + 1 for s in run) != sorted(s for s in ref if ref_lib.CE in ref[s]):
        raise ValueError(f"{run_dir} and {ref_path} logged other updates")
    steps = sorted(run)

    def pick(key: str, rkey: str) -> tuple[np.ndarray, np.ndarray]:
        return (
            np.array([float(run[s][key]) for s in steps], np.float64),
            np.array([ref[s + 1][rkey] for s in steps], np.float64),
        )

    loss, rloss = pick("loss", ref_lib.CE)
    z, rz = pick("z_loss", ref_lib.Z)
    gn, rgn = pick("grad_norm", ref_lib.GRAD_NORM)
    lr, rlr = pick("lr", ref_lib.LR)
    sk, rsk = pick("skipped", ref_lib.SKIPPED)
    key, rkey = f"heldout/{heldout_set}/loss", ref_lib.HELDOUT.format(label=heldout_set)
    held = [(run[s][key], ref[s + 1][rkey]) for s in steps if key in run[s]]
    if not held or len(held) != sum(rkey in ref[s + 1] for s in steps):
        raise ValueError("the two evaluated the held-out set at other steps")
    return {
        "loss": loss - rloss,
        "loss_ref": rloss,
        "z": z - rz,
        "grad_rel": gn / rgn - 1,
        # both log the scheduler's Python float (olmax: trainer.optim.make_schedule, OLMo-core's
        # operations): 0 when bit-equal; both then apply its float32 rounding
        "lr": lr - rlr,
        "lr_ref": rlr,
        "skipped": sk,
        "skipped_ref": rsk,
        "heldout": np.array([a - b for a, b in held]),
    }


def final_params(run_dir: str, overrides: list[str], steps: int, ref_state: str) -> tuple[dict, dict]:
    """(olmax's params after its last update, OLMo-core's), olmax's layout, flat {path: array}."""
    params, _ = ref_lib.restore_step(load_config(TINY, overrides), f"{run_dir}/checkpoints/{steps}")
    flat = ref_lib.flat_params(params)
    ref = dict(np.load(ref_state))
    if flat.keys() != ref.keys():
        raise ValueError("the two final states hold other tensors")
    return flat, ref


EMBED = "embed/embedding"


def figures(built: dict) -> dict[str, dict[str, Any]]:
    """{scenario: the largest difference of each kind} (see `differences`; params: max abs of every
    tensor but the embedding, the embedding's max abs and its difference's norm / its norm)."""
    out = {}
    for name, (run_dir, overrides, steps) in built["runs"].items():
        ref_path, ref_state = built["refs"][name]
        d = differences(run_dir, ref_path)
        flat, ref = final_params(run_dir, overrides, steps, ref_state)
        out[name] = {
            "updates": len(d["loss"]),
            "loss_abs": float(np.abs(d["loss"]).max()),
            "z_abs": float(np.abs(d["z"]).max()),
            "grad_norm_rel": float(np.abs(d["grad_rel"]).max()),
            "lr_abs": float(np.abs(d["lr"]).max()),
            "heldout_abs": float(np.abs(d["heldout"]).max()),
            "skipped_steps_run": [int(i) for i in np.flatnonzero(d["skipped"])],
            "skipped_steps_reference": [int(i) for i in np.flatnonzero(d["skipped_ref"])],
            "params_abs": max(float(np.abs(flat[k] - ref[k]).max()) for k in flat if k != EMBED),
            "embed_abs": float(np.abs(flat[EMBED] - ref[EMBED]).max()),
            "embed_rel_norm": float(np.linalg.norm(flat[EMBED] - ref[EMBED]) / np.linalg.norm(ref[EMBED])),
        }
    return out


def run_olmax(spec: str, keep_going: bool = False) -> int:
    """The olmax runs of `spec` ([[run_dir, overrides], ...]) through trainer.main.main, in order;
    the first failure's exit status (after the rest, with `keep_going`), else 0."""
    from trainer import main as trainer_main  # JAX after the worker's JAX_PLATFORMS=cpu

    first = 0
    for run_dir, overrides in json.loads(Path(spec).read_text()):
        code = trainer_main.main(["--config", TINY, "--run_dir", run_dir, *overrides])
        if code and not keep_going:
            return code
        first = first or code
    return first


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.olmo_step_for_step", description=__doc__.splitlines()[0])
    p.add_argument("--out", help="folder for the data, the runs and figures.json (must not exist)")
    p.add_argument("--olmax_runs", help=argparse.SUPPRESS)  # build()'s olmax process
    p.add_argument("--keep_going", action="store_true", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.olmax_runs:
        return run_olmax(a.olmax_runs, a.keep_going)
    if not a.out:
        p.error("--out is required")
    out = Path(a.out)
    if out.exists():
        print(f"error: --out {out} exists; choose a new folder", file=sys.stderr)
        return 2
    out.mkdir(parents=True)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    result = figures(build(out))
    (out / "figures.json").write_text(json.dumps(result, indent=1) + "\n")
    keys = list(next(iter(result.values())))
    print("| scenario | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for name, f in result.items():
        print(f"| {name} | " + " | ".join(f"{v:.3g}" if isinstance(v, float) else str(v) for v in f.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
