"""Documents are digested with XXH3-128 (the xxhash library): the exact-copy lookup and the
deterministic 13-gram and tokens-per-byte samples are keyed by that digest, and `--data-checks
reuse:` refuses an audit whose samples were keyed by another digest (an audit made before the
digest changed) instead of passing its figures off as this audit's."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import xxhash

from audit.__main__ import main
from audit.contamination import ContaminationConfig
from audit.scan import scan
from audit.shard_reader import iter_record_chunks, load_manifest
from audit.shardscan import HeldoutIndex
from contract import DocumentSplitter, parse_records
from tests.audit import audit_fixtures as fx

TRAIN_SAMPLE = 40  # of ~100 training documents: which ones are sampled depends on the digest


def _train_documents(manifest_path: str) -> list[np.ndarray]:
    """Every training document of every source, in reading order (an independent splitter)."""
    m = load_manifest(manifest_path)
    docs: list[np.ndarray] = []
    for name in m.source_names:
        splitter = DocumentSplitter(m.eos_id, m.pad_id)
        for ref in m.shards("train", name):
            for raw in iter_record_chunks(ref.abspath):
                arr, _ = parse_records(raw, m.seq_len, m.vocab_size)
                docs.extend(d.copy() for d in splitter.feed(arr))
    return docs


def test_training_documents_are_sampled_by_their_xxh3_128_digest(tmp_path):
    manifest = fx.write_sample(str(tmp_path / "data"))
    m = load_manifest(manifest)
    train_docs = sum(int(m.source(n)["counts"]["train"]) for n in m.source_names)
    threshold = math.ceil(min(1.0, TRAIN_SAMPLE / train_docs) * 2.0**64)

    def key(doc: np.ndarray) -> int:  # the first 8 bytes of the digest, little-endian
        return int.from_bytes(xxhash.xxh3_128_digest(doc.astype("<u4").tobytes())[:8], "little")

    expected = sum(1 for d in _train_documents(manifest) if d.size and key(d) < threshold)
    assert 0 < expected < train_docs
    found = scan(m, ContaminationConfig(train_sample_docs=TRAIN_SAMPLE)).contamination.figures
    assert found["ngram_heldout_sampled"] > 0  # the training sample is looked up: there are held-out 13-grams
    assert found["ngram_train_sampled"] == expected


@pytest.fixture(scope="module")
def data_audit(tmp_path_factory):
    root = tmp_path_factory.mktemp("digest")
    manifest = fx.write_sample(str(root / "data"))
    assert main(["--data", manifest, "--out", str(root / "audit")]) == 0
    return manifest, root / "audit" / "audit.json"


def test_the_audit_records_its_document_digest_and_reuses_an_audit_with_the_same(data_audit, tmp_path):
    manifest, prev = data_audit
    assert json.loads(prev.read_text())["inputs"]["data_checks"]["document_digest"] == "xxh3_128"
    assert main(["--data", manifest, "--data-checks", f"reuse:{prev}", "--out", str(tmp_path / "r")]) == 0


@pytest.mark.parametrize("digest", [None, "blake2b_128"])
def test_an_audit_keyed_by_another_digest_is_refused_with_one_line(data_audit, tmp_path, capsys, digest):
    manifest, prev = data_audit
    doc = json.loads(prev.read_text())
    if digest is None:  # an audit made before the digest was recorded: its samples were keyed by blake2b
        del doc["inputs"]["data_checks"]["document_digest"]
    else:
        doc["inputs"]["data_checks"]["document_digest"] = digest
    old = tmp_path / "old.json"
    old.write_text(json.dumps(doc))
    capsys.readouterr()
    rc = main(["--data", manifest, "--data-checks", f"reuse:{old}", "--out", str(tmp_path / "r")])
    assert rc == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --data-checks reuse:{old}:") and "\n" not in err
    assert "blake2b_128" in err and "xxh3_128" in err
    assert not (tmp_path / "r" / "audit.json").exists()


def test_held_out_digests_sharing_their_first_8_bytes_are_told_apart():
    # the index is searched by the digest's first 8 bytes, then its last 8: equal first halves
    # (a run of them) must neither hide a held-out document nor match a different one
    def digests(*pairs: tuple[int, int]) -> np.ndarray:
        return np.frombuffer(b"".join(a.to_bytes(8, "little") + b.to_bytes(8, "little") for a, b in pairs), "S16")

    x, y, z = (7, 2), (7, 1), (3, 9)
    held = digests(x, y, x, z, (7, 5))  # in reading order; x occurs twice (its first place counts)
    index = HeldoutIndex.build(held, np.arange(5, dtype=np.int64), np.zeros(5, np.int64), ["web/heldout"], [])
    assert index.documents == 4
    found = index.find(digests(x, y, (7, 3), z, (8, 1), (7, 5), (7, 6)))
    assert [index.where(int(i)) if i >= 0 else None for i in found] == [
        "document 0 of web/heldout",
        "document 1 of web/heldout",
        None,
        "document 3 of web/heldout",
        None,
        "document 4 of web/heldout",
        None,
    ]
