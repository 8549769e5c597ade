"""Token files both trainers read (OLMo-core's `NumpyFSLDataset`, olmax's `data_order: olmo-core`),
a contract manifest over them, and the recipe overrides the reference tests share.

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

import hashlib
import json
import os

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

from contract import with_fingerprint
from dataloader import olmo_order

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
    sources, mixture = {}, []
    for name, split, arrays in (("web", "train", files), ("val", "heldout", [heldout])):
        paths, shards = [], {"train": [], "heldout": []}
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
            "tokenizer": {"name": "toy", "ranks_sha256": None, "vocab_size": VOCAB, "eos_id": EOS, "pad_id": PAD},
            "seq_len": seq_len,
            "record_format": "uint32-le[seq_len]",
            "mixture": {
                "name": "olmo-reference",
                "tokenizer": "toy",
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
        "loss_chunk=0",
        "eval_every=10",
        "eval_batches=null",
        "checkpoint_every=0",
        "downstream.interval=0",
        "mesh.cpu_devices=1",
        "verify_data_gib=0",
        "log.progress_every=0",
        *extra,
    ]
