"""dolma2 as issue 2 specifies it: genuine cl100k_base ranks, dolma2's added tokens at fixed ids,
vocabulary 100278, no BOS; document text is ordinary text (no special ids from it)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE, dolma2, get_tokenizer

# The table of the issue, written out independently of pipelines.dolma2_tokenizer.
EXPECTED_SPECIAL = {
    100256: "<|extra_id_0|>",
    100257: "<|endoftext|>",
    100258: "<|fim_prefix|>",
    100259: "<|fim_middle|>",
    100260: "<|fim_suffix|>",
    100261: "|||PHONE_NUMBER|||",
    100262: "|||EMAIL_ADDRESS|||",
    100263: "|||IP_ADDRESS|||",
    100264: "<|im_start|>",
    100265: "<|im_end|>",
    **{100265 + i: f"<|extra_id_{i}|>" for i in range(1, 11)},
    100276: "<|endofprompt|>",
    100277: "<|pad|>",
}


def test_vocabulary_and_added_tokens_are_dolma2s():
    enc = dolma2()
    assert enc.n_vocab == VOCAB_SIZE == 100278
    assert (EOS_ID, PAD_ID) == (100257, 100277)
    assert {i: enc.decode_single_token_bytes(i).decode() for i in range(100256, VOCAB_SIZE)} == EXPECTED_SPECIAL
    for i, text in EXPECTED_SPECIAL.items():
        assert enc.encode(text, allowed_special="all") == [i]
    assert get_tokenizer("dolma2") is enc
    with pytest.raises(ValueError, match="unknown tokenizer"):
        get_tokenizer("gpt2")


def test_ordinary_tokens_are_cl100k_base():
    enc = dolma2()
    # cl100k_base ids, as OpenAI's tiktoken gives them
    assert enc.encode_ordinary("hello world") == [15339, 1917]
    assert enc.encode_ordinary(" the") == [279]
    assert max(enc.encode_ordinary("naïve Straße 数据 🙂 x=1+2\n\tdef f(): pass")) < 100256


def test_special_token_text_in_a_document_is_ordinary_text():
    enc = dolma2()
    text = "a <|endoftext|> b <|pad|> c <|im_start|>"
    ids = enc.encode_ordinary(text)
    assert not set(ids) & set(EXPECTED_SPECIAL)
    assert enc.decode(ids) == text


def test_the_jobs_array_encoder_gives_encode_ordinarys_ids():
    from pipelines.dolma2_tokenizer import ordinary_ids

    enc = dolma2()
    encode = ordinary_ids(enc)
    texts = [
        "",
        "plain text",
        "<|endoftext|>",
        "a <|pad|> b <|im_start|>x<|im_end|> <|extra_id_3|>",
        "emoji 🙂 数据 \r\n\t  spaces",
        "<|fim_prefix|><|endofprompt|>" * 3,
    ]
    for text in texts:
        ids = encode(text)
        assert np.frombuffer(ids, dtype=np.uint32).tolist() == enc.encode_ordinary(text), text
        assert len(ids) == len(enc.encode_ordinary(text))


# --- encoder engines (issue 12): same ids as tiktoken, checked at start-up -----------------


def _reference_ids(texts):
    enc = dolma2()
    return [enc.encode_ordinary(t) for t in texts]


def _engine_ids(engine, texts):
    ids, offsets = engine.encode_batch(texts)
    assert ids.dtype == np.uint32 and len(offsets) == len(texts) + 1
    return [ids[offsets[i] : offsets[i + 1]].tolist() for i in range(len(texts))]


def hard_cases(seed: int = 12, count: int = 1500) -> list[str]:
    """Generated texts where BPE engines tend to differ: many scripts and categories mixed,
    combining marks, odd whitespace, contractions, long runs of one kind, special-token text."""
    import random

    rng = random.Random(seed)
    pools = [
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ",
        "0123456789",
        " \t\n\r\u00a0\u3000\u2009\x0b\x0c",
        "αβγδεζηθΑΒΓΔ",
        "абвгдежзАБВГ",
        "数据中文日本語のトークン",
        "한국어토큰",
        "مرحباالعربية",
        "हिन्दीभाषा",
        "ภาษาไทย",
        "🙂🚀🔥👍🏽👩‍👩‍👧🇩🇪",
        "\u0301\u0308\u0327\u200d\u200b",
        ".,;:!?()[]{}<>|/\\\"'`~@#$%^&*-_=+",
        "’‘“”«»—–…",
    ]
    words = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "don't", "I'M", "http://x.y/z?q=1"]
    texts = []
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 40)):
            if rng.random() < 0.15:
                parts.append(rng.choice(words + list(EXPECTED_SPECIAL.values())))
            else:
                pool = rng.choice(pools)
                parts.append("".join(rng.choice(pool) for _ in range(rng.randint(1, 12))))
        texts.append("".join(parts))
    runs = ["a", " ", "1", "\n", "\t", "🙂", "'s", "\u00a0", "数", "x ", " \n", "<|endoftext|>", "ab1 "]
    texts += [unit * (60_000 // len(unit)) for unit in runs]
    texts += [
        "".join(EXPECTED_SPECIAL.values()),
        "<|endoftext|>",
        "<|endoftext|" * 5,
        "<<|pad|>>",
        "|||PHONE_NUMBER||||",
    ]
    return texts


@pytest.mark.parametrize("engine", ["quicktok", "gigatoken", "tiktoken"])
def test_engines_give_tiktokens_ids_on_generated_hard_cases(engine):
    from pipelines.dolma2_tokenizer import get_engine

    texts = hard_cases()
    got, want = _engine_ids(get_engine(engine), texts), _reference_ids(texts)
    for text, g, w in zip(texts, got, want):
        assert g == w, text[:80]
        assert max(g, default=0) < 100256  # special-token text is ordinary text


@pytest.mark.parametrize("engine", ["quicktok", "gigatoken"])
def test_engines_give_tiktokens_ids_on_the_embedded_sample(engine):
    import json
    from pathlib import Path

    from pipelines.dolma2_tokenizer import get_engine
    from pipelines.read import open_lines
    from pipelines.sample import build_sample

    root = Path(build_sample())
    texts = [json.loads(line)["text"] for p in sorted(root.rglob("*.jsonl*")) for line in open_lines(str(p))]
    assert len(texts) > 3000
    ids, offsets = get_engine(engine).encode_batch(texts)
    reference = get_engine("tiktoken")  # tiktoken's buffer path (== encode_ordinary, tested above)
    want_ids, want_offsets = reference.encode_batch(texts)
    assert np.array_equal(offsets, want_offsets) and np.array_equal(ids, want_ids)


def _copy_quicktok_data(tmp_path):
    import shutil
    from pathlib import Path

    import quicktok

    data = tmp_path / "data"
    shutil.copytree(Path(quicktok.__file__).parent / "data", data)
    return data


def test_a_corrupted_vocabulary_is_refused_at_start_up(tmp_path):
    import struct

    from pipelines.dolma2_tokenizer import VocabularyError, _quicktok_engine, check_engine

    data = _copy_quicktok_data(tmp_path)
    check_engine(_quicktok_engine(data_dir=str(data)))  # the untouched copy is accepted
    # quicktok's vocab file: u32 count, then (u16 length, bytes, u32 rank) per token.
    # Corrupt it the quiet way: swap the ranks of two tokens of the same length.
    vocab = bytearray((data / "cl100k.vocab").read_bytes())
    (count,) = struct.unpack_from("<I", vocab, 0)
    pos, rank_at = 4, {}
    for _ in range(count):
        (n,) = struct.unpack_from("<H", vocab, pos)
        token = bytes(vocab[pos + 2 : pos + 2 + n])
        rank_at[token] = pos + 2 + n
        pos += 2 + n + 4
    a, b = rank_at[b" the"], rank_at[b" and"]
    vocab[a : a + 4], vocab[b : b + 4] = vocab[b : b + 4], vocab[a : a + 4]
    corrupt = tmp_path / "corrupt"
    corrupt.mkdir()
    for f in data.iterdir():
        (corrupt / f.name).write_bytes(f.read_bytes())
    (corrupt / "cl100k.vocab").write_bytes(bytes(vocab))
    with pytest.raises(VocabularyError, match=r"rank 279 is b' and', cl100k has b' the'"):
        check_engine(_quicktok_engine(data_dir=str(corrupt)))


def test_a_wrong_special_token_table_is_refused_at_start_up():
    from dataclasses import replace

    from pipelines.dolma2_tokenizer import VocabularyError, check_engine, get_engine

    good = get_engine("quicktok")
    with pytest.raises(VocabularyError, match="special token '<|endoftext|>' has id 100256"):
        check_engine(replace(good, special_tokens={**good.special_tokens, "<|endoftext|>": 100256}))

    def specials_as_ids(texts):  # an engine that turns special-token text into special ids
        ids, offsets = good.encode_batch(texts)
        return np.where(ids == 27, np.uint32(100257), ids), offsets

    with pytest.raises(VocabularyError, match="special-token text"):
        check_engine(replace(good, encode_batch=specials_as_ids))


def test_an_unknown_engine_is_refused():
    from pipelines.dolma2_tokenizer import get_engine

    with pytest.raises(ValueError, match="unknown tokenizer engine 'fasttok'"):
        get_engine("fasttok")


def test_the_crosscheck_sample_is_chosen_by_content_at_its_rate():
    import hashlib

    from pipelines.dolma2_tokenizer import crosscheck_threshold, is_crosschecked

    digests = [hashlib.sha256(str(i).encode()).digest() for i in range(20_000)]
    share = sum(is_crosschecked(d, crosscheck_threshold(0.05)) for d in digests) / len(digests)
    assert 0.04 < share < 0.06
    assert all(is_crosschecked(d, crosscheck_threshold("all")) for d in digests)
    assert not any(is_crosschecked(d, crosscheck_threshold(0)) for d in digests)
    # independent of the held-out split (first 8 bytes): held-out documents are sampled too
    heldout = [d for d in digests if int.from_bytes(d[:8], "big") < 0.1 * 2**64]
    assert 0.02 < sum(is_crosschecked(d, crosscheck_threshold(0.05)) for d in heldout) / len(heldout) < 0.09
    with pytest.raises(ValueError):
        crosscheck_threshold(1.5)


# --- the exactness corpus (issue 60): beyond English, every engine, every document ---------

EXACTNESS_FIXTURE = Path(__file__).resolve().parents[2] / "pipelines" / "data" / "exactness.jsonl.gz"


@pytest.fixture(scope="module")
def exactness_texts():
    """The committed fixture (multilingual, emoji, combining marks, RTL, CJK, white space,
    contractions, symbols; bench/exactness_corpus.py) plus one generated 1M-character document."""
    from bench.exactness_corpus import LONG_CHARS, fixture_docs, read_fixture

    docs = read_fixture(EXACTNESS_FIXTURE)
    long_doc = fixture_docs(per_kind=0, long_chars=LONG_CHARS)[-1]["text"]
    assert len(long_doc) >= 1_000_000 and len(docs) >= 40
    return [d["text"] for d in docs] + [long_doc]


@pytest.mark.parametrize("engine", ["quicktok", "gigatoken", "tiktoken"])
def test_every_engine_gives_tiktokens_ids_on_the_exactness_corpus(engine, exactness_texts):
    from pipelines.dolma2_tokenizer import dolma2, get_engine, ordinary_ids

    reference = ordinary_ids(dolma2())  # tiktoken's buffer path (== encode_ordinary, tested above)
    ids, offsets = get_engine(engine).encode_batch(exactness_texts)
    assert len(offsets) == len(exactness_texts) + 1
    for k, text in enumerate(exactness_texts):
        want = np.frombuffer(reference(text), np.uint32)
        assert np.array_equal(ids[offsets[k] : offsets[k + 1]], want), (k, text[:80])


def test_gigatoken_recycles_its_encoder_after_the_limit_with_the_same_ids(exactness_texts):
    from pipelines.dolma2_tokenizer import _gigatoken_engine, get_engine

    small = _gigatoken_engine(recycle_chars=20_000)  # a new encoder (an empty cache) every ~20k characters
    recycled = small.encode_batch.__self__
    texts = exactness_texts[:-1]
    want = get_engine("tiktoken").encode_batch(texts)
    got = [small.encode_batch(texts[i : i + 4]) for i in range(0, len(texts), 4)]
    assert recycled.builds >= sum(map(len, texts)) // 20_000 // 2 >= 3
    assert np.array_equal(np.concatenate([g[0] for g in got]), want[0])
    lengths = np.concatenate([np.diff(g[1]) for g in got])
    assert np.array_equal(lengths, np.diff(want[1]))


def test_gigatoken_keeps_one_encoder_per_thread():
    import threading

    from pipelines.dolma2_tokenizer import _gigatoken_engine

    engine = _gigatoken_engine()
    recycled = engine.encode_batch.__self__
    seen = []

    def use():
        engine.encode_batch(["a thread's own text"])
        seen.append((recycled.backend, recycled.builds))

    threads = [threading.Thread(target=use) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (a, builds_a), (b, builds_b) = seen
    assert builds_a == builds_b == recycled.builds == 1
    assert len({id(a), id(b), id(recycled.backend)}) == 3  # this thread's is the one built with the engine
