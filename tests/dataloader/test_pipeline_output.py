"""The loader reads the real output of `pipelines.tokenize` (a tiny generated corpus)."""

import json
import random

import numpy as np
import pytest
import yaml

from dataloader import LoaderConfig, make_loader
from dataloader.plan import RECORD_BITS
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID, dolma2

SEQ_LEN = 32


@pytest.fixture(scope="module")
def pipeline_output(tmp_path_factory):
    from pipelines.tokenize import run

    root = tmp_path_factory.mktemp("pipeline")
    rng = random.Random(3)
    words = ["alpha", "beta", "gamma", "δέλτα", "数据", "x=1+2", "ok", "new\nline"]
    texts = {}
    for source, n in (("web", 40), ("code", 25)):
        docs = [
            " ".join(rng.choice(words) + str(rng.randrange(100)) for _ in range(rng.randrange(3, 30))) for _ in range(n)
        ]
        texts[source] = set(docs)
        (root / source).mkdir()
        (root / source / "part.jsonl").write_text(
            "".join(json.dumps({"id": f"{source}{i}", "text": t}) + "\n" for i, t in enumerate(docs))
        )
    mixture = {
        "name": "tiny",
        "tokenizer": "dolma2",
        "seq_len": SEQ_LEN,
        "seed": 0,
        "heldout_fraction": 0.2,
        "dedup": True,
        "sources": [
            {"name": "web", "paths": [str(root / "web" / "*.jsonl")], "weight": 0.6, "max_repetition": 4},
            {"name": "code", "paths": [str(root / "code" / "*.jsonl")], "weight": 0.4, "max_repetition": 4},
        ],
    }
    (root / "mixture.yaml").write_text(yaml.safe_dump(mixture))
    run(["--mixture", str(root / "mixture.yaml"), "--output", str(root / "out")])
    return str(root / "out" / "manifest.json"), texts


def documents(batches, names):
    """Loader rows → {source: set of documents (token tuples)}, each record once, record order."""
    rows = {}
    for b in batches:
        for ex, toks in zip(b["example"].tolist(), b["tokens"]):
            if ex >= 0:
                rows[ex] = toks
    out = {n: set() for n in names}
    for s, name in enumerate(names):
        ids = sorted(e for e in rows if e >> RECORD_BITS == s)
        assert [e & ((1 << RECORD_BITS) - 1) for e in ids] == list(range(len(ids)))
        stream = np.concatenate([rows[e] for e in ids]) if ids else np.zeros(0, np.int32)
        stream = stream[stream != PAD_ID].tolist()
        doc, docs = [], out[name]
        for t in stream:
            if t == EOS_ID:
                docs.add(tuple(doc))
                doc = []
            else:
                doc.append(t)
        assert doc == []  # every packed document ends with EOS
    return out


def test_loader_reads_every_document_of_the_pipeline_output_once_per_split(pipeline_output):
    path, texts = pipeline_output
    names = list(texts)
    train = make_loader(LoaderConfig(data=[path], global_batch_size=8, seed=1), 0, 1)
    assert [s.name for s in train.plan.sources] == names
    # One epoch reads every record at least once (each source is repeated ≥ 1×).
    train_batches = [train.batch_at(s) for s in range(-(-train.plan.size // 8))]
    held = make_loader(LoaderConfig(data=[path], global_batch_size=8, split="heldout"), 0, 1)
    got_train, got_held = documents(train_batches, names), documents(list(held), names)
    enc = dolma2()
    for name in names:
        expected = {tuple(enc.encode_ordinary(t)) for t in texts[name]}
        assert got_train[name] | got_held[name] == expected
        assert not got_train[name] & got_held[name]  # held-out is held out
        assert got_held[name]  # the split really held something out
