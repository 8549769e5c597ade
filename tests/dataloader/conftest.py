"""A small writer of pipeline-contract datasets (manifest.json + ArrayRecord shards).

It follows the contract of issue 2 independently of `pipelines.tokenize`: each shard is
one packing unit (docs' tokens + EOS, concatenated, cut into seq_len examples, only the
last one PAD-filled), records are uint32-le[seq_len] written with group_size:1.
"""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest
from array_record.python.array_record_module import ArrayRecordWriter

from contract import with_fingerprint
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE

SEQ_LEN = 16
ORDINARY_IDS = 100256  # dolma2 ordinary token ids are [0, 100256)


def pack(docs: list[np.ndarray], seq_len: int) -> np.ndarray:
    """docs → uint32 [n, seq_len]: docs + EOS concatenated, last example PAD-filled."""
    flat = np.concatenate([np.append(d, EOS_ID) for d in docs]).astype(np.uint32)
    n = -(-len(flat) // seq_len)
    out = np.full(n * seq_len, PAD_ID, dtype=np.uint32)
    out[: len(flat)] = flat
    return out.reshape(n, seq_len)


def write_shard(path: str, examples: np.ndarray, options: str = "group_size:1") -> str:
    writer = ArrayRecordWriter(path, options)
    for row in examples:
        writer.write(row.astype("<u4").tobytes())
    writer.close()
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def random_docs(rng: np.random.Generator, n: int, max_len: int) -> list[np.ndarray]:
    return [rng.integers(0, ORDINARY_IDS, size=int(rng.integers(1, max_len))) for _ in range(n)]


def write_dataset(root: str, sources: dict[str, dict], seq_len: int = SEQ_LEN, shards: int = 3, seed: int = 0) -> str:
    """sources: {name: {"train": [docs], "heldout": [docs], "weight": w, "max_repetition": r}}.
    Returns the manifest path."""
    os.makedirs(root, exist_ok=True)
    manifest_sources = {}
    for name, spec in sources.items():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        entry = {
            "counts": {"documents": 0, "train": 0, "heldout": 0, "duplicates": 0, "rejected": {}},
            "tokens": {"train": 0, "heldout": 0, "padding": 0},
            "splits": {},
        }
        for split in ("train", "heldout"):
            docs = spec.get(split, [])
            entry["counts"][split] = len(docs)
            entry["counts"]["documents"] += len(docs)
            groups = [g for g in np.array_split(np.arange(len(docs)), shards)]
            shard_list, total = [], 0
            for i, g in enumerate(groups):
                ex = pack([docs[j] for j in g], seq_len) if len(g) else np.zeros((0, seq_len), np.uint32)
                rel = f"{name}/{split}-{i:05d}-of-{shards:05d}.arrayrecord"
                sha = write_shard(os.path.join(root, rel), ex)
                shard_list.append({"path": rel, "records": int(len(ex)), "sha256": sha})
                total += len(ex)
                entry["tokens"][split] += int((ex != PAD_ID).sum())
                entry["tokens"]["padding"] += int((ex == PAD_ID).sum())
            entry["splits"][split] = {"examples": total, "shards": shard_list}
        manifest_sources[name] = entry
    mixture = {
        "name": "fixture",
        "tokenizer": "dolma2",
        "seq_len": seq_len,
        "seed": seed,
        "heldout_fraction": 0.1,
        "dedup": True,
        "sources": [
            {"name": n, "paths": [f"{n}/*.jsonl"], "weight": s["weight"], "max_repetition": s.get("max_repetition", 1)}
            for n, s in sources.items()
        ],
    }
    manifest = {
        "format_version": 1,
        "tokenizer": {
            "name": "dolma2",
            "ranks_sha256": "fixture",
            "vocab_size": VOCAB_SIZE,
            "eos_id": EOS_ID,
            "pad_id": PAD_ID,
        },
        "seq_len": seq_len,
        "record_format": "uint32-le[seq_len]",
        "mixture": mixture,
        "sources": manifest_sources,
    }
    manifest = with_fingerprint(manifest)
    path = os.path.join(root, "manifest.json")
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
    return path


def two_sources(rng: np.random.Generator) -> dict[str, dict]:
    """'web' (weight 0.7, ~150 records) anchors the epoch; 'code' (0.3, ~45) is repeated."""
    return {
        "web": {
            "train": random_docs(rng, 120, 40),
            "heldout": random_docs(rng, 9, 40),
            "weight": 0.7,
            "max_repetition": 2,
        },
        "code": {
            "train": random_docs(rng, 40, 34),
            "heldout": random_docs(rng, 5, 30),
            "weight": 0.3,
            "max_repetition": 4,
        },
    }


@pytest.fixture(scope="session")
def manifest_path(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("data")
    return write_dataset(str(root), two_sources(np.random.default_rng(1234)))


@pytest.fixture(scope="session")
def manifest(manifest_path) -> dict:
    with open(manifest_path) as f:
        return json.load(f)
