"""A small, self-contained writer of pipeline outputs for the audit tests.

It follows the pipeline contract (contract/README.md) without importing the pipeline (only the
leaf `contract` for the fingerprint, log names and run record), so the audit is tested
against the contract itself: ArrayRecord shards written with `group_size:1`,
each record `seq_len` little-endian uint32 token ids; documents encoded with
`encode_ordinary`, followed by EOS, concatenated and cut into records; each shard is one packing
unit whose last record is PAD-filled; held-out chosen by a hash of the text; a manifest whose
counts and shard digests describe exactly what was written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random

import numpy as np
from array_record.python.array_record_module import ArrayRecordWriter

import contract
from pipelines.dolma2_tokenizer import CL100K_RANKS_SHA256, EOS_ID, PAD_ID, VOCAB_SIZE, dolma2

HELDOUT_PERCENT = 10


@dataclasses.dataclass(frozen=True)
class FixtureSource:
    name: str
    weight: float
    documents: int
    max_repetition: float = 4.0
    duplicates: int = 2
    rejected: tuple[tuple[str, int], ...] = (
        ("empty_text", 1),
        ("invalid_json", 1),
    )  # reasons of pipelines.read.REASONS


DEFAULT_SOURCES = (FixtureSource("web", 0.7, 80), FixtureSource("code", 0.3, 40))


def _words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(5000)}" for _ in range(n))


def _is_heldout(text: str) -> bool:
    return int(hashlib.sha256(text.encode()).hexdigest(), 16) % 100 < HELDOUT_PERCENT


def pack(docs: list[list[int]], seq_len: int) -> np.ndarray:
    """docs (token lists without EOS) → `[n, seq_len]` uint32, last record PAD-filled."""
    flat: list[int] = []
    for d in docs:
        flat.extend(d)
        flat.append(EOS_ID)
    n = -(-len(flat) // seq_len)
    out = np.full(n * seq_len, PAD_ID, np.uint32)
    out[: len(flat)] = flat
    return out.reshape(n, seq_len)


def write_shard(path: str, records: np.ndarray) -> dict:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    w = ArrayRecordWriter(path, "group_size:1")
    for r in records:
        w.write(r.astype("<u4").tobytes())
    w.close()
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return {"records": int(records.shape[0]), "sha256": digest}


def write_sample(
    root: str,
    *,
    sources=DEFAULT_SOURCES,
    seq_len: int = 32,
    shards: int = 2,
    seed: int = 0,
    inject_heldout_into_train: bool = False,
    heldout_only: bool = False,
    extra_heldout: tuple[list[int], ...] = (),
    extra_train: tuple[list[int], ...] = (),
) -> str:
    """Writes `root/manifest.json` + shards; returns the manifest path.

    inject_heldout_into_train: the first held-out document of the first source is also packed
    into that source's training split (counted there too, so every other check stays green).
    heldout_only: every source says `split: heldout` (all its documents held out; its training
    split has empty shards), as a validation-set manifest. extra_heldout / extra_train: token
    documents (no EOS) appended to the first source's held-out / training documents, counted.
    """
    enc = dolma2()
    rng = random.Random(seed)
    manifest_sources = {}
    mixture_sources = []
    injected = None
    for si, src in enumerate(sources):
        texts = [_words(rng, rng.randrange(3, 60)) for _ in range(src.documents)]
        split_docs: dict[str, list[list[int]]] = {"train": [], "heldout": []}
        for t in texts:
            split_docs["heldout" if heldout_only or _is_heldout(t) else "train"].append(enc.encode_ordinary(t))
        if si == 0:
            split_docs["heldout"].extend(list(d) for d in extra_heldout)
            split_docs["train"].extend(list(d) for d in extra_train)
        assert split_docs["heldout"], "fixture needs held-out documents; raise `documents`"
        if inject_heldout_into_train and si == 0:
            injected = split_docs["heldout"][0]
            split_docs["train"].insert(len(split_docs["train"]) // 2, injected)
        entry = {"counts": {}, "tokens": {"train": 0, "heldout": 0, "padding": 0}, "splits": {}}
        for split, docs in split_docs.items():
            shard_entries = []
            for k in range(shards):
                part = docs[k::shards]
                records = pack(part, seq_len)
                rel = f"{src.name}/{split}-{k:05d}-of-{shards:05d}.arrayrecord"
                info = write_shard(os.path.join(root, rel), records)
                shard_entries.append({"path": rel, **info})
                entry["tokens"]["padding"] += int(np.count_nonzero(records == PAD_ID))
            entry["tokens"][split] = sum(len(d) + 1 for d in docs)
            entry["splits"][split] = {"examples": sum(s["records"] for s in shard_entries), "shards": shard_entries}
        rejected = dict(src.rejected)
        entry["counts"] = {
            "documents": len(split_docs["train"])
            + len(split_docs["heldout"])
            + src.duplicates
            + sum(rejected.values()),
            "train": len(split_docs["train"]),
            "heldout": len(split_docs["heldout"]),
            "duplicates": src.duplicates,
            "rejected": rejected,
        }
        manifest_sources[src.name] = entry
        mixture_sources.append(
            {
                "name": src.name,
                "paths": [f"fixture://{src.name}"],
                "weight": src.weight,
                "max_repetition": src.max_repetition,
                **({"split": "heldout"} if heldout_only else {}),
            }
        )
    mixture = {
        "name": "fixture",
        "tokenizer": "dolma2",
        "seq_len": seq_len,
        "seed": seed,
        "heldout_fraction": HELDOUT_PERCENT / 100,
        "dedup": "exact",
        "sources": mixture_sources,
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
        "seq_len": seq_len,
        "record_format": "uint32-le[seq_len]",
        "mixture": mixture,
        "sources": manifest_sources,
    }
    manifest = contract.with_fingerprint(manifest)
    path = os.path.join(root, "manifest.json")
    with open(path, "w") as f:
        json.dump(manifest, f, indent=1)
    return path


def tamper_one_byte(path: str, offset_fraction: float = 0.5) -> None:
    """Flips one byte in the middle of a file."""
    with open(path, "r+b") as f:
        data = bytearray(f.read())
        i = int(len(data) * offset_fraction)
        data[i] ^= 0x01
        f.seek(0)
        f.write(data)


def edit_manifest(path: str, fn, refingerprint: bool = True, run_dir: str | None = None) -> None:
    """Edits the manifest. refingerprint: as a buggy writer would (the fingerprint matches the edited
    content, so the audit's checks must find what is wrong); else as a hand edit after writing.
    run_dir: that run trained on the edited manifest (its run.json gets the new fingerprints)."""
    with open(path) as f:
        m = json.load(f)
    fn(m)
    with open(path, "w") as f:
        json.dump(contract.with_fingerprint(m) if refingerprint else m, f, indent=1)
    if run_dir is not None:
        from dataloader.plan import plan_from_manifests

        with open(path) as f:
            m = json.load(f)
        rec = contract.RunRecord.load(run_dir)
        dataclasses.replace(
            rec,
            manifest_fingerprints=(m["fingerprint"],),
            loader_fingerprint=plan_from_manifests([m], "train").fingerprint,
        ).write(run_dir)


def first_document(manifest_path: str, source: str, split: str = "train") -> list[int]:
    """The tokens (without EOS) of document 0 of `source`/`split`: the start of its first shard."""
    from audit.shard_reader import iter_record_chunks

    m = contract.Manifest.load(manifest_path)
    chunks = iter_record_chunks(m.shards(split, source)[0].abspath)
    tokens = np.concatenate([np.frombuffer(b"".join(c), "<u4") for c in chunks])
    return tokens[: int(np.argmax(tokens == EOS_ID))].tolist()


def write_run_logs(
    run_dir: str,
    manifest_path: str | list[str],
    *,
    hosts: int,
    steps: int,
    global_batch_size: int,
    seed: int = 0,
    restart_hosts: int | None = None,
    restart_step: int | None = None,
) -> None:
    """Writes `run_dir/data_log/host-HHHHH-of-HHHHH.jsonl` as a correct trainer would, using the
    loader's pure functions (positions from `hosts`, slots from `order`, examples from `plan`),
    plus `run.json` (the contract's run record: global batch, seed, loader fingerprint, order, hosts per
    step range) and `summary.json` with the trainer's hash of the consumed stream. With `restart_hosts`, steps from `restart_step` on
    run on that many hosts (an elastic restart: the old topology's logs stop before it). A list of manifest paths: a run
    whose `data` is that list (the plan over all of them)."""
    from dataloader import hosts as hosts_mod
    from dataloader import order
    from dataloader.plan import plan_from_manifests

    paths = [manifest_path] if isinstance(manifest_path, str) else list(manifest_path)
    manifests = []
    for path in paths:
        with open(path) as f:
            manifests.append(json.load(f))
    manifest = manifests[0]
    plan = plan_from_manifests(manifests, "train")
    log_dir = os.path.join(run_dir, "data_log")
    os.makedirs(log_dir, exist_ok=True)
    files = {}
    stream = ""
    for step in range(steps):
        H = restart_hosts if restart_hosts and step >= restart_step else hosts
        global_ex = []
        for h in range(H):
            if (H, h) not in files:
                files[(H, h)] = open(os.path.join(log_dir, contract.data_log_name(h, H)), "w")
            idx = hosts_mod.host_positions(step, global_batch_size, h, H)
            ex = plan.example_ids(*plan.locate(order.train_slots(idx, plan.size, seed)))
            global_ex.append(ex)
            files[(H, h)].write(json.dumps({"step": step, "index": idx.tolist(), "example": ex.tolist()}) + "\n")
        stream = contract.chain_data_sha256(stream, step, np.concatenate(global_ex))
    for f in files.values():
        f.close()
    record = contract.RunRecord(
        global_batch_size=global_batch_size,
        seed=seed,
        data=tuple(paths),
        manifest_fingerprints=tuple(m["fingerprint"] for m in manifests),
        loader_fingerprint=plan.fingerprint,
        order=contract.INDEX_SHUFFLE,
        seq_len=manifest["seq_len"],
        tokenizer=contract.TokenizerInfo.from_json(manifest["tokenizer"]),
        hosts=(contract.HostRange(0, hosts),),
    )
    if restart_hosts:
        record = record.restarted(restart_step, restart_hosts)
    record.write(run_dir)
    with open(os.path.join(run_dir, "summary.json"), "w") as f:
        json.dump({"step": steps, "data_sha256": stream, "process_count": H}, f)


def read_log(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def write_log(path: str, lines: list[dict]) -> None:
    with open(path, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in lines)
