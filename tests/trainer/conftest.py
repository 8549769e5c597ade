"""A small learnable dataset in the pipeline's output contract, and a trainer launcher.

The dataset is written directly (ArrayRecord `group_size:1` shards of uint32-le[seq_len] +
manifest.json, one packing unit per shard) from generated template sentences tokenized with
dolma2 — independent of the Beam job so these tests exercise the trainer alone, in well under
a second. Every trainer run is a `python -m trainer.main` process, as a user runs it: its own, or,
for the start-up refusals and the short runs that need no process of their own, one shared by the
session (`trainer_process`, tests/trainer/shared_process.py), one command after the other.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter

from contract import with_fingerprint
from pipelines.dolma2_tokenizer import CL100K_RANKS_SHA256, EOS_ID, PAD_ID, VOCAB_SIZE, dolma2
from tests.shared import build_once
from tests.trainer.shared_process import OneProcess

ROOT = Path(__file__).resolve().parents[2]
PYTHON = sys.executable
SEQ_LEN = 32
SHARDS = 2
WORDS = {
    "adj": ["red", "small", "quiet", "old", "bright", "heavy", "green", "fast"],
    "noun": ["cat", "river", "engine", "garden", "teacher", "window", "market", "song"],
    "verb": ["sees", "moves", "likes", "follows", "paints", "builds", "finds", "hears"],
}


def sentence(rng: np.random.Generator) -> str:
    pick = lambda k: WORDS[k][rng.integers(len(WORDS[k]))]
    return f"The {pick('adj')} {pick('noun')} {pick('verb')} the {pick('adj')} {pick('noun')}."


def make_docs(rng: np.random.Generator, n: int) -> list[list[int]]:
    enc = dolma2()
    return [enc.encode_ordinary(" ".join(sentence(rng) for _ in range(rng.integers(2, 8)))) for _ in range(n)]


def pack(docs: list[list[int]], seq_len: int) -> np.ndarray:
    """docs + EOS concatenated, cut into seq_len rows, the last one PAD-filled: uint32 [n, seq_len]."""
    flat = np.concatenate([np.asarray(d + [EOS_ID], np.uint32) for d in docs])
    out = np.full(-(-len(flat) // seq_len) * seq_len, PAD_ID, np.uint32)
    out[: len(flat)] = flat
    return out.reshape(-1, seq_len)


def write_dataset(root: Path, n_train: int = 300, n_heldout: int = 40, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    entry = {
        "counts": {
            "documents": n_train + n_heldout,
            "train": n_train,
            "heldout": n_heldout,
            "duplicates": 0,
            "rejected": {},
        },
        "tokens": {"train": 0, "heldout": 0, "padding": 0},
        "splits": {},
    }
    (root / "prose").mkdir(parents=True)
    for split, n in (("train", n_train), ("heldout", n_heldout)):
        docs, shards, total = make_docs(rng, n), [], 0
        for i, part in enumerate(np.array_split(np.arange(n), SHARDS)):
            rows = pack([docs[j] for j in part], SEQ_LEN)
            rel = f"prose/{split}-{i:05d}-of-{SHARDS:05d}.arrayrecord"
            writer = ArrayRecordWriter(str(root / rel), "group_size:1")
            for row in rows:
                writer.write(row.astype("<u4").tobytes())
            writer.close()
            shards.append(
                {"path": rel, "records": len(rows), "sha256": hashlib.sha256((root / rel).read_bytes()).hexdigest()}
            )
            total += len(rows)
            entry["tokens"][split] += int((rows != PAD_ID).sum())
            entry["tokens"]["padding"] += int((rows == PAD_ID).sum())
        entry["splits"][split] = {"examples": total, "shards": shards}
    mixture = {
        "name": "trainer-tests",
        "tokenizer": "dolma2",
        "seq_len": SEQ_LEN,
        "seed": seed,
        "heldout_fraction": n_heldout / (n_train + n_heldout),
        "dedup": True,
        "sources": [{"name": "prose", "paths": ["generated"], "weight": 1.0, "max_repetition": 4}],
    }
    manifest = {
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
        "mixture": mixture,
        "sources": {"prose": entry},
    }
    manifest = with_fingerprint(manifest)
    path = root / "manifest.json"
    path.write_text(json.dumps(manifest, indent=1))
    return path


@pytest.fixture(scope="session")
def data_manifest(tmp_path_factory) -> Path:
    return build_once(tmp_path_factory, "trainer_data", write_dataset)


# Small, fast runs of the tiny model: 2 CPU devices per run (the same mesh as 2 processes with
# one device each), global batch 4 of 32 tokens, a schedule fixed at 16 steps so runs can stop
# early and be extended without changing the learning rates.
BASE_OVERRIDES = [
    "model=olmo3-tiny",
    "model_overrides.compute_dtype=float32",
    "global_batch_size=4",
    "lr=1e-2",
    "schedule.kind=cosine",
    "schedule.warmup_steps=2",
    "schedule.decay_steps=16",
    "eval.every=4",
    "eval_batches=2",
    "checkpoint.every=4",
    "checkpoint.keep=10",
    "log.progress_every=1",
    "downstream.every=0",  # the tiny recipe's tasks are built for seq_len 512 (test_downstream_in_loop.py runs them)
]


def trainer_cmd(
    data: Path, run_dir: Path, *overrides: str, cpu_devices: int = 2, dist: tuple[int, int, int] | None = None
) -> list[str]:
    """`python -m trainer.main` for the tiny config on `data`; dist = (port, num_processes, process_id)."""
    cmd = [PYTHON, "-m", "trainer.main", "--config", str(ROOT / "trainer/configs/tiny.yaml"), "--run_dir", str(run_dir)]
    if dist:
        port, n, i = dist
        cmd += ["--coordinator", f"127.0.0.1:{port}", "--num_processes", str(n), "--process_id", str(i)]
    return cmd + [f"data={data}", f"mesh.cpu_devices={cpu_devices}", *BASE_OVERRIDES, *overrides]


COMPILATION_CACHE = Path(os.environ.get("TMPDIR", "/tmp")) / f"olmax-trainer-tests-jax-cache-{os.getuid()}"


def trainer_env() -> dict[str, str]:
    """CPU only; a persistent XLA compilation cache shared by the test runs (the same programs
    are compiled by every run; a cached executable is the same program, so bit-exactness holds):
    the session's (tests/conftest.py) when it has one, else COMPILATION_CACHE."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["JAX_PLATFORMS"] = "cpu"
    env.setdefault("JAX_COMPILATION_CACHE_DIR", str(COMPILATION_CACHE))
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    env.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
    return env


# A trainer subprocess's hang guard, not a speed check: a run of the tiny model takes seconds alone, but
# two pytest-xdist workers (make test) on a machine other jobs load slow it several-fold.
HANG_GUARD_S = 900


def run_trainer(
    data: Path,
    run_dir: Path,
    *overrides: str,
    timeout: float = HANG_GUARD_S,
    via: OneProcess | None = None,
    **kw,
) -> subprocess.CompletedProcess:
    """A trainer run that must finish (exit 0): its own process, or with `via` (the session's
    `trainer_process`) a case of the shared trainer process (tests/trainer/shared_process.py: same argv,
    exit status and output; trainer_cmd's 2 CPU devices, one process, the environment it started
    with, so not for a run whose test sets environment variables)."""
    cmd = trainer_cmd(data, run_dir, *overrides, **kw)
    if via is not None:
        if kw.get("dist") or kw.get("cpu_devices", 2) != 2:
            raise ValueError("the shared trainer process runs one process on 2 CPU devices")
        proc = via.run(cmd, timeout)
    else:
        proc = subprocess.run(cmd, cwd=ROOT, env=trainer_env(), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"trainer failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.fixture(scope="session")
def reference_run(data_manifest, tmp_path_factory, trainer_process) -> Path:
    """An uninterrupted 8-step run on one process with 2 CPU devices (read only: copy to change it)."""

    def build(run_dir: Path) -> Path:
        run_trainer(data_manifest, run_dir, "steps=8", via=trainer_process)
        return run_dir

    return build_once(tmp_path_factory, "reference", build)


@pytest.fixture(scope="session")
def resumed_past_a_damaged_step(reference_run, data_manifest, tmp_path_factory, trainer_process) -> tuple[Path, str]:
    """reference_run copied with its newest checkpoint (8) damaged (one flipped byte in its largest
    parameter file), metrics.jsonl's lines before step 4 lost and summary.json removed, then the same
    8-step command: it must set 8 aside, resume from checkpoint 4 and end as the reference did. One
    resume read by two tests (test_train_run.py: the damaged step; test_summary_kept.py: the summary
    not read from the log), one trainer start fewer. Read only: (run_dir, the resume's stderr)."""

    def build(folder: Path) -> tuple[Path, str]:
        run_dir = folder / "run"
        shutil.copytree(reference_run, run_dir)
        (run_dir / "summary.json").unlink()
        params = run_dir / "checkpoints" / "8" / "params"
        victim = max(
            (p for p in params.rglob("*") if p.is_file() and p.parent.name == "d"), key=lambda p: p.stat().st_size
        )
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 0x01
        victim.write_bytes(bytes(data))
        metrics = run_dir / "metrics.jsonl"
        metrics.write_text(
            "".join(line + "\n" for line in metrics.read_text().splitlines() if json.loads(line)["step"] >= 4)
        )
        return run_dir, run_trainer(data_manifest, run_dir, "steps=8", via=trainer_process).stderr

    return build_once(tmp_path_factory, "resumed_past_a_damaged_step", build)


@pytest.fixture(scope="session")
def trainer_process(tmp_path_factory):
    """`OneProcess` (tests/trainer/shared_process.py): `.run(trainer_cmd(...))` runs a trainer command
    (a start-up refusal; a run through `run_trainer(..., via=trainer_process)`) in one trainer process
    shared by the session (this xdist worker's), as `subprocess.run` of the command would (exit
    status, stdout, stderr). At the end the driver must exit 0 with no traceback: the exit of a
    process that ran those commands is clean too."""
    log = tmp_path_factory.mktemp("trainer_process") / "driver.log"
    driver = OneProcess(PYTHON, ROOT, trainer_env(), log, HANG_GUARD_S)
    yield driver
    if driver.proc is not None:
        code, log = driver.close(), driver.log_text()
        assert code == 0 and "Traceback" not in log, f"the shared trainer process exited {code}:\n{log[-3000:]}"
