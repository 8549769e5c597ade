"""dolma2 as issue 2 specifies it: genuine cl100k_base ranks, dolma2's added tokens at fixed ids,
vocabulary 100278, no BOS; document text is ordinary text (no special ids from it)."""
from __future__ import annotations

import numpy as np
import pytest

from pipelines.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE, dolma2, get_tokenizer

# The table of the issue, written out independently of pipelines.tokenizer.
EXPECTED_SPECIAL = {
    100256: "<|extra_id_0|>", 100257: "<|endoftext|>", 100258: "<|fim_prefix|>",
    100259: "<|fim_middle|>", 100260: "<|fim_suffix|>", 100261: "|||PHONE_NUMBER|||",
    100262: "|||EMAIL_ADDRESS|||", 100263: "|||IP_ADDRESS|||", 100264: "<|im_start|>",
    100265: "<|im_end|>", **{100265 + i: f"<|extra_id_{i}|>" for i in range(1, 11)},
    100276: "<|endofprompt|>", 100277: "<|pad|>",
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
    from pipelines.tokenizer import ordinary_ids

    enc = dolma2()
    encode = ordinary_ids(enc)
    texts = ["", "plain text", "<|endoftext|>", "a <|pad|> b <|im_start|>x<|im_end|> <|extra_id_3|>",
             "emoji 🙂 数据 \r\n\t  spaces", "<|fim_prefix|><|endofprompt|>" * 3]
    for text in texts:
        ids = encode(text)
        assert np.frombuffer(ids, dtype=np.uint32).tolist() == enc.encode_ordinary(text), text
        assert len(ids) == len(enc.encode_ordinary(text))
