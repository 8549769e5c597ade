"""Token files in OLMo-core's format and contract datasets holding their instances.

`write_token_files` makes headerless uint32 files (documents + EOS, uneven sizes, some shorter
than L, documents crossing instance boundaries, and file boundaries: every second file ends
without EOS). `write_instances_dataset` writes one
shard per file whose record j is the file's instance j (`pipelines.token_files.instances`), sources
and files in listed order, and a contract manifest over them.
"""

from __future__ import annotations

import json
import os

import numpy as np

from contract import with_fingerprint
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE
from pipelines.token_files import instances
from tests.dataloader.conftest import ORDINARY_IDS, write_shard


def token_file(rng: np.random.Generator, n_tokens: int, mean_doc: int, end_with_eos: bool = True) -> np.ndarray:
    """uint32 [n_tokens]: documents of random length, each followed by EOS; the file's last id is
    EOS when `end_with_eos`, else an ordinary id (its last document goes on in the next file, as
    when `dolma tokens` splits a stream across files)."""
    out = rng.integers(0, ORDINARY_IDS, size=n_tokens, dtype=np.uint32)
    ends = np.cumsum(rng.integers(1, 2 * mean_doc, size=n_tokens))
    ends = ends[ends < n_tokens]
    out[ends] = EOS_ID
    if n_tokens:
        out[-1] = EOS_ID if end_with_eos else rng.integers(0, ORDINARY_IDS)
    return out


def write_token_files(
    root: str, rng: np.random.Generator, sizes: dict[str, list[int]], mean_doc: int = 11
) -> dict[str, list[str]]:
    """sizes: {source: [tokens per file]} → {source: [paths]} (listed order). Every second file
    (odd index within its source) ends without EOS: a document crosses into the next file."""
    out = {}
    for name, ns in sizes.items():
        os.makedirs(os.path.join(root, "npy", name), exist_ok=True)
        out[name] = []
        for i, n in enumerate(ns):
            path = os.path.join(root, "npy", name, f"part-{i:06d}.npy")
            token_file(rng, n, mean_doc, end_with_eos=i % 2 == 0).astype("<u4").tofile(path)
            out[name].append(path)
    return out


def write_instances_dataset(root: str, files: dict[str, list[str]], seq_len: int) -> str:
    """A contract dataset whose train split of source s is its files' instances, one shard per
    file in listed order. Returns the manifest path."""
    sources, mixture_sources = {}, []
    for name, paths in files.items():
        shards, records, tokens = [], 0, 0
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i, p in enumerate(paths):
            rec = instances(np.fromfile(p, dtype="<u4"), seq_len)
            rel = f"{name}/train-{i:05d}-of-{len(paths):05d}.arrayrecord"
            shards.append({"path": rel, "records": len(rec), "sha256": write_shard(os.path.join(root, rel), rec)})
            records += len(rec)
            tokens += rec.size
        empty = []
        for i in range(len(paths)):
            rel = f"{name}/heldout-{i:05d}-of-{len(paths):05d}.arrayrecord"
            empty.append(
                {
                    "path": rel,
                    "records": 0,
                    "sha256": write_shard(os.path.join(root, rel), np.zeros((0, seq_len), np.uint32)),
                }
            )
        sources[name] = {
            "counts": {"documents": 0, "train": 0, "heldout": 0, "duplicates": 0, "rejected": {}},
            "tokens": {"train": tokens, "heldout": 0, "padding": 0},
            "splits": {"train": {"examples": records, "shards": shards}, "heldout": {"examples": 0, "shards": empty}},
        }
        mixture_sources.append(
            {"name": name, "paths": paths, "weight": 1.0, "max_repetition": None, "format": "tokens", "dtype": "uint32"}
        )
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
        "mixture": {
            "name": "olmo-fixture",
            "tokenizer": "dolma2",
            "seq_len": seq_len,
            "seed": 0,
            "heldout_fraction": 0.0,
            "dedup": False,
            "sources": mixture_sources,
        },
        "sources": sources,
    }
    manifest = with_fingerprint(manifest)
    path = os.path.join(root, "manifest.json")
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
    return path


VALIDATION_MIXTURE = os.path.join(
    os.path.dirname(__file__), "..", "..", "data_manifests", "mixtures", "olmo3-ppl-validation-ai2.yaml"
)
VALIDATION_ROOT = "gs://YOUR_BUCKET/ai2-llm"  # the shipped mixture's placeholder for AI2's bucket


def write_validation_mix(root: str, seq_len: int, seed: int = 3, mean_doc: int = 24) -> tuple[str, str]:
    """AI2's validation sets in small: a token file at each path of the shipped mixture
    (data_manifests/mixtures/olmo3-ppl-validation-ai2.yaml, OLMo-core's v3-small-ppl-validation with
    AI2's bucket as `root`), then the tokenize job on that mixture at `seq_len`. Documents longer than
    seq_len (mean_doc), files whose remainder holds documents, and one file that ends without EOS.
    Returns (mix_base_dir for OLMo-core's DataMix, the held-out manifest's path)."""
    import yaml

    from pipelines.tokenize import run

    base = os.path.join(root, "ai2-llm")
    mixture = yaml.safe_load(open(VALIDATION_MIXTURE))
    rng = np.random.default_rng(seed)
    for i, source in enumerate(mixture["sources"]):
        source["paths"] = [p.replace(VALIDATION_ROOT, base) for p in source["paths"]]
        for p in source["paths"]:
            os.makedirs(os.path.dirname(p), exist_ok=True)
            ids = token_file(
                rng, int(rng.integers(4, 14)) * seq_len + int(rng.integers(1, seq_len)), mean_doc, end_with_eos=i != 1
            )
            ids[np.flatnonzero(ids == EOS_ID)[0]] = EOS_ID  # (every file holds a document)
            ids.astype("<u4").tofile(p)
    mixture["seq_len"] = seq_len
    path = os.path.join(root, "validation.yaml")
    with open(path, "w") as f:
        yaml.safe_dump(mixture, f, sort_keys=False)
    run(["--mixture", path, "--output", os.path.join(root, "validation")])
    return base, os.path.join(root, "validation", "manifest.json")
