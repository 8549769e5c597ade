"""Packing is lossless and pads only the last example of a unit."""

from __future__ import annotations

import random

import numpy as np
import pytest

from contract import decode_record, unpack
from pipelines.pack import pack_examples, pack_stats

EOS, PAD = 100257, 100277


@pytest.mark.parametrize("seq_len", [1, 2, 7, 64])
def test_packing_then_unpacking_gives_back_every_document(seq_len):
    rng = random.Random(seq_len)
    docs = [[rng.randrange(100256) for _ in range(rng.choice([1, 2, 5, seq_len, 3 * seq_len + 1]))] for _ in range(50)]
    examples = list(pack_examples(docs, seq_len, EOS, PAD))
    assert all(ex.shape == (seq_len,) and ex.dtype == np.dtype("<u4") for ex in examples)
    assert unpack(examples, EOS, PAD) == docs
    st = pack_stats(map(len, docs), seq_len)
    assert st.examples == len(examples) and st.documents == len(docs)
    flat = np.concatenate(examples)
    assert int((flat == PAD).sum()) == st.padding < seq_len
    assert all(not (ex == PAD).any() for ex in examples[:-1])


def test_a_unit_that_fills_examples_exactly_has_no_padding():
    examples = list(pack_examples([[1, 2, 3], [4, 5, 6]], 4, EOS, PAD))
    assert [ex.tolist() for ex in examples] == [[1, 2, 3, EOS], [4, 5, 6, EOS]]


def test_last_example_is_pad_filled_after_the_final_eos():
    [ex] = list(pack_examples([[9]], 5, EOS, PAD))
    assert ex.tolist() == [9, EOS, PAD, PAD, PAD]


def test_empty_unit_has_no_examples_and_bad_inputs_are_refused():
    assert list(pack_examples([], 8, EOS, PAD)) == []
    with pytest.raises(ValueError):
        list(pack_examples([[1]], 0, EOS, PAD))
    with pytest.raises(ValueError, match="ends inside a document"):
        unpack([np.array([1, 2, 3], "<u4")], EOS, PAD)
    with pytest.raises(ValueError, match="expected 16"):
        decode_record(b"\0" * 12, 4)
    assert decode_record(np.arange(4, dtype="<u4").tobytes(), 4).tolist() == [0, 1, 2, 3]


def test_token_bytes_are_uint32_little_endian():
    from pipelines.pack import tokens_to_bytes

    ids = [0, 1, 255, 256, 100257, 2**32 - 1]
    assert tokens_to_bytes(ids) == np.array(ids, dtype="<u4").tobytes()
    assert tokens_to_bytes([1]) == b"\x01\x00\x00\x00"
    with pytest.raises(OverflowError):
        tokens_to_bytes([2**32])


def test_the_streaming_packer_counts_what_it_packed_and_accepts_arrays():
    from pipelines.pack import Packer

    p = Packer(4, EOS, PAD)
    out = p.add([1, 2]) + p.add(np.array([3, 4, 5], dtype=np.int64)) + p.add([])
    assert [np.frombuffer(b, "<u4").tolist() for b in out] == [[1, 2, EOS, 3], [4, 5, EOS, EOS]]
    assert (p.documents, p.tokens) == (3, 8) and p.finish() is None
    p.add([7])
    assert np.frombuffer(p.finish(), "<u4").tolist() == [7, EOS, PAD, PAD] and p.finish() is None


def test_the_packer_takes_uint32_arrays_as_bytes_and_refuses_ids_that_do_not_fit():
    from pipelines.pack import Packer

    p = Packer(3, EOS, PAD)
    assert np.frombuffer(p.add(np.array([5, 2**32 - 1], dtype=np.uint32))[0], "<u4").tolist() == [5, 2**32 - 1, EOS]
    for bad in (np.array([-1]), np.array([2**32]), [1, 2, 2**32]):
        with pytest.raises(OverflowError):
            p.add(bad)
    assert (p.documents, p.tokens) == (1, 3) and p.finish() is None  # the refused ones left no trace


def test_the_packer_takes_the_tokenizers_buffers():
    from pipelines.dolma2_tokenizer import dolma2, ordinary_ids
    from pipelines.pack import Packer

    enc = dolma2()
    p = Packer(1000, EOS, PAD)
    p.add(ordinary_ids(enc)("hello <|endoftext|> world"))
    assert np.frombuffer(p.finish(), "<u4")[: p.tokens].tolist() == enc.encode_ordinary("hello <|endoftext|> world") + [
        EOS
    ]
    with pytest.raises(TypeError):
        p.add(memoryview(b"abcd"))


def test_adding_a_batch_packs_exactly_as_adding_its_documents_one_by_one():
    import random

    from pipelines.pack import Packer

    rng = random.Random(5)
    docs = [[rng.randrange(100256) for _ in range(rng.randint(1, 40))] for _ in range(60)]
    one = Packer(16, 100257, 100277)
    expected = [ex for d in docs for ex in one.add(d)]
    expected.append(one.finish())
    batched, got, k = Packer(16, 100257, 100277), [], 0
    for size in (1, 7, 20, 32):  # batches of different sizes, in order
        part = docs[k : k + size]
        k += size
        ids = np.array([t for d in part for t in d], dtype=np.uint32)
        offsets = np.cumsum([0] + [len(d) for d in part])
        got += batched.add_batch(ids, offsets)
    got.append(batched.finish())
    assert k == len(docs) and got == expected
    assert (batched.documents, batched.tokens) == (one.documents, one.tokens)
    with pytest.raises(TypeError):
        batched.add_batch(np.zeros(3, np.int64), np.array([0, 3]))
