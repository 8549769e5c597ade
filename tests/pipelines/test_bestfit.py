"""Best-fit packing (`pipelines.bestfit`): OLMo-core's best-fit decreasing, every token once, the
document mask's segments equal the documents' pieces, and the job's best-fit shards pass the audit
and do not depend on the worker count."""

from __future__ import annotations

import json

import numpy as np
import pytest
import yaml
from olmo_core.data.utils import InstancePacker

from contract import TOKEN_DTYPE, unpack
from dataloader.loader import batch_fields
from pipelines.bestfit import BestFitPacker, best_fit_decreasing, pieces

EOS, PAD = 1, 2


def _docs(seed: int, n: int, longest: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, 1000, size=k).astype(np.uint32) for k in rng.integers(0, longest, size=n)]


def _pack(docs, seq_len, window, batch=False) -> np.ndarray:
    p = BestFitPacker(seq_len, EOS, PAD, window)
    out: list[bytes] = []
    if batch:
        offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
        out += p.add_batch(np.concatenate(docs).astype(np.uint32), offsets)
    else:
        for d in docs:
            out += p.add(d)
    out += p.finish()
    assert p.documents == len(docs) and p.tokens == sum(len(d) + 1 for d in docs)
    return np.frombuffer(b"".join(out), TOKEN_DTYPE).reshape(-1, seq_len)


@pytest.mark.parametrize("seed", range(5))
def test_best_fit_decreasing_places_items_as_olmo_cores_instance_packer(seed):
    rng = np.random.default_rng(seed)
    cap = 128  # OLMo-core's segment tree wants a power of two
    lengths = rng.integers(1, cap + 1, size=300)
    ends = np.cumsum(lengths)
    indices = np.stack([ends - lengths, ends], axis=1).astype(np.uint64)
    bins, sorted_indices, _ = InstancePacker(cap).pack_documents(indices)
    theirs = [[int(sorted_indices[j, 1] - sorted_indices[j, 0]) for j in b] for b in bins]
    ours = [[int(lengths[i]) for i in b] for b in best_fit_decreasing(lengths.tolist(), cap)]
    assert ours == theirs


def test_a_bin_holds_at_most_one_continuation_the_next_best_fit_takes_the_second():
    # 5 opens bin 0 (room 5); 4 best-fits there, but both are continuations: 4 opens bin 1; 1 best-fits bin 0
    assert best_fit_decreasing([5, 4, 1], 10) == [[0, 1, 2]]
    assert best_fit_decreasing([5, 4, 1], 10, [True, True, False]) == [[0, 2], [1]]
    # a continuation and ordinary items share a bin as before
    assert best_fit_decreasing([5, 4, 1], 10, [True, False, False]) == [[0, 1, 2]]


@pytest.mark.parametrize("window", [1, 3, 1000])
def test_every_token_once_and_every_document_recovered(window):
    docs = _docs(0, 120, 300)
    records = _pack(docs, 64, window)
    assert sorted(map(tuple, unpack(records, EOS, PAD))) == sorted(tuple(d.tolist()) for d in docs)
    real = records[records != PAD]
    assert np.array_equal(np.sort(real), np.sort(np.concatenate([np.append(d, EOS) for d in docs])))


def test_add_batch_packs_as_add_does():
    docs = _docs(1, 50, 200)
    assert np.array_equal(_pack(docs, 32, 4, batch=True), _pack(docs, 32, 4))


def test_no_piece_is_longer_than_seq_len_and_a_long_document_is_split_at_seq_len():
    assert pieces(10, 4) == [4, 4, 2] and pieces(8, 4) == [4, 4] and pieces(3, 4) == [3]
    docs = _docs(2, 40, 500)
    records = _pack(docs, 50, 2)
    long_ = [d for d in docs if len(d) + 1 > 50]
    assert long_  # the sample has documents to split
    for d in long_:  # its full pieces are whole records, in order
        first = np.flatnonzero((records == d[:50]).all(axis=1))
        assert first.size == 1
        full = (len(d) + 1) // 50
        for k in range(full):
            assert np.array_equal(records[first[0] + k], np.append(d, EOS)[k * 50 : (k + 1) * 50])


def test_the_document_masks_segments_are_the_documents_pieces():
    seq_len = 48
    docs = _docs(3, 60, 150)
    records = _pack(docs, seq_len, 4)
    fields = batch_fields(records.astype(np.int32), EOS, PAD)
    want = sorted(
        tuple(p) for d in docs for p in np.array_split(np.append(d, EOS), range(seq_len, len(d) + 1, seq_len))
    )
    got = []
    for row, seg in zip(records, fields["segment_ids"]):
        for s in np.unique(seg[seg > 0]):
            got.append(tuple(row[seg == s].tolist()))
        assert np.all(row[seg == 0] == PAD)  # PAD is segment 0, and only PAD
    assert sorted(got) == want


def _mixture(tmp_path, packing) -> str:
    rng = np.random.default_rng(5)
    words = ["alpha", "beta", "gamma", "delta", "long", "context", "packing"]
    src = tmp_path / "src"
    src.mkdir()
    for f in range(3):
        with open(src / f"{f}.jsonl", "w") as fh:
            for i in range(40):
                n = int(rng.integers(1, 120))
                fh.write(json.dumps({"id": f"{f}-{i}", "text": " ".join(rng.choice(words, size=n))}) + "\n")
    path = tmp_path / "mixture.yaml"
    raw = {
        "name": "bf",
        "tokenizer": "dolma2",
        "seq_len": 32,
        "seed": 0,
        "heldout_fraction": 0.1,
        "dedup": True,
        "sources": [{"name": "web", "paths": [str(src / "*.jsonl")], "weight": 1.0}],
        "packing": packing,
    }
    path.write_text(yaml.safe_dump(raw))
    return str(path)


def _shard_hashes(manifest: dict) -> list[str]:
    return [s["sha256"] for sp in manifest["sources"]["web"]["splits"].values() for s in sp["shards"]]


def test_the_jobs_best_fit_shards_pass_the_audit_and_do_not_depend_on_the_worker_count(tmp_path):
    from audit.runner import AuditConfig, run_audit
    from pipelines.tokenize import main

    mixture = _mixture(tmp_path, {"method": "best_fit", "window": 4})
    for workers, mode in ((1, "in_memory"), (2, "multi_threading")):
        out = tmp_path / f"out{workers}"
        flags = [f"--direct_num_workers={workers}", f"--direct_running_mode={mode}"]
        assert main(["--mixture", mixture, "--output", str(out), *flags]) == 0
    m1 = json.loads((tmp_path / "out1" / "manifest.json").read_text())
    m2 = json.loads((tmp_path / "out2" / "manifest.json").read_text())
    assert m1["mixture"]["packing"] == {"method": "best_fit", "window": 4}
    assert _shard_hashes(m1) == _shard_hashes(m2)
    web = m1["sources"]["web"]
    records = sum(s["records"] for sp in web["splits"].values() for s in sp["shards"])
    tokens = web["tokens"]
    assert records > 2 * len(web["splits"]["train"]["shards"])  # several records per shard: packing happened
    assert tokens["padding"] == records * 32 - tokens["train"] - tokens["heldout"]  # PAD counted in the manifest
    results, _ = run_audit(AuditConfig(data=str(tmp_path / "out1" / "manifest.json"), out=str(tmp_path / "a")))
    verdicts = {r.name: r.passed for r in results}
    failed = {r.name: r.failures[:2] for r in results if r.passed is False}
    assert failed == {}
    assert all(verdicts[k] is True for k in ("integrity", "accounting", "sharding", "statistics")), verdicts
