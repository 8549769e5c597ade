"""The tokenize job's shared fixtures, loaded for every test package by tests/conftest.py: a
generated corpus with known expectations, and one job run per worker count (Beam start-up is slow,
so runs are session-scoped and shared).

The expectations are written down by construction here (which line is bad and why, which
texts repeat), not computed with the pipeline's own functions.
"""

from __future__ import annotations

import gzip
import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
import zstandard

from tests.shared import build_once

SEQ_LEN = 64
HELDOUT_FRACTION = 0.25
SPECIAL_TEXT = "keep <|endoftext|> as text, also <|pad|>, <|im_start|>, |||EMAIL_ADDRESS||| and <|extra_id_0|>"

# (raw line, reason) for every kind of bad line; all go into the "web" source's plain file.
BAD_LINES = [
    (b"\xff\xfe not utf-8 {}", "invalid_utf8"),
    (b'{"id": "j1", "text": "unterminated', "invalid_json"),
    (b"[1, 2, 3]", "not_an_object"),
    (b'"just a string"', "not_an_object"),
    (b'{"text": "no id here"}', "missing_id"),
    (b'{"id": 17, "text": "numeric id"}', "id_not_string"),
    (b'{"id": null, "text": "null id"}', "id_not_string"),
    (b'{"id": "m1"}', "missing_text"),
    (b'{"id": "n1", "text": ["a", "list"]}', "text_not_string"),
    (b'{"id": "e1", "text": ""}', "empty_text"),
    (b'{"id": "u1", "text": "lone \\ud800 surrogate"}', "invalid_unicode"),
    # a lone surrogate in the id once crashed the dedup pass (valid text) and the reject writer
    (b'{"id": "\\ud800", "text": "a valid text under an id that cannot be written"}', "id_invalid_unicode"),
    (b'{"id": "\\udfff-no-text"}', "id_invalid_unicode"),
]
BOOKS_BAD = [(b"{broken", "invalid_json")]
# a source with no valid document at all: both its splits must come out empty, not crash
JUNK_BAD = [(b"not json at all", "invalid_json"), (b'{"id": "j", "text": ""}', "empty_text")]


@dataclass
class Corpus:
    root: Path
    mixture_path: Path
    good: list[tuple[str, str, str]] = field(default_factory=list)  # (source, id, text) every valid line
    rejects: dict[str, list[tuple[str, int, str]]] = field(default_factory=dict)  # source → (file, line, reason)
    documents: dict[str, int] = field(default_factory=dict)  # source → non-blank lines

    def kept(self) -> dict[str, tuple[str, str]]:
        """text → (source, id) of the copy dedup must keep: smallest (source, id)."""
        best: dict[str, tuple[str, str]] = {}
        for source, doc_id, text in self.good:
            if text not in best or (source, doc_id) < best[text]:
                best[text] = (source, doc_id)
        return best


def _text(rng: random.Random, words: int) -> str:
    vocab = ["alpha", "beta", "γάμμα", "数据", "naïve", "emoji🙂", "x=1+2", "\ttab", "new\nline", "Straße", "ok"]
    return " ".join(rng.choice(vocab) + str(rng.randrange(1000)) for _ in range(words))


def _write(path: Path, lines: list[bytes]) -> None:
    data = b"".join(line + b"\n" for line in lines)
    if path.name.endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    elif path.name.endswith(".zst"):
        data = zstandard.ZstdCompressor().compress(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)


def make_corpus(root: Path) -> Corpus:
    rng = random.Random(7)
    c = Corpus(root, root / "mixture.yaml")
    files: dict[str, list[bytes]] = {}
    owner = {"web/a.jsonl": "web", "web/b.jsonl.gz": "web", "books/c.jsonl.zst": "books", "junk/d.jsonl": "junk"}

    def add_doc(rel: str, doc_id: str, text: str, extra: dict | None = None):
        obj = {"id": doc_id, "text": text, "source": owner[rel], **(extra or {})}
        files.setdefault(rel, []).append(json.dumps(obj, ensure_ascii=bool(rng.randrange(2))).encode())
        c.good.append((owner[rel], doc_id, text))

    for i in range(40):
        add_doc("web/a.jsonl", f"a{i:03d}", _text(rng, rng.randint(1, 60)), {"metadata": {"i": i}})
        add_doc("web/b.jsonl.gz", f"b{i:03d}", _text(rng, rng.randint(1, 60)), {"added": "2025-01-01"})
        add_doc("books/c.jsonl.zst", f"c{i:03d}", _text(rng, rng.randint(1, 60)))
    add_doc("books/c.jsonl.zst", "long", _text(rng, 900))  # spans many examples
    add_doc("web/a.jsonl", "special", SPECIAL_TEXT)
    # duplicates: within a source (smaller id wins), across sources (smaller source name wins),
    # and the very same line twice
    dup1, dup2 = "the same text twice in web", "the same text in books and web"
    add_doc("web/b.jsonl.gz", "zz-dup", dup1)
    add_doc("web/a.jsonl", "aa-dup", dup1)
    add_doc("web/a.jsonl", "aaa-first", dup2)
    add_doc("books/c.jsonl.zst", "zzz-last", dup2)
    add_doc("web/b.jsonl.gz", "rep", "an exact repeated line")
    add_doc("web/b.jsonl.gz", "rep", "an exact repeated line")

    for raw, _reason in BAD_LINES:
        files["web/a.jsonl"].append(raw)
    files["web/a.jsonl"][5:5] = [b"", b"   \t "]  # blank lines are not documents
    files["books/c.jsonl.zst"].insert(3, BOOKS_BAD[0][0])
    files["junk/d.jsonl"] = [JUNK_BAD[0][0], b"", JUNK_BAD[1][0]]
    for rel, lines in files.items():
        _write(root / rel, lines)
        for n, raw in enumerate(lines, start=1):
            for bad, reason in BAD_LINES + BOOKS_BAD + JUNK_BAD:
                if raw == bad:
                    c.rejects.setdefault(owner[rel], []).append((str(root / rel), n, reason))
            if raw.strip():
                c.documents[owner[rel]] = c.documents.get(owner[rel], 0) + 1

    mixture = {
        "name": "test",
        "tokenizer": "dolma2",
        "seq_len": SEQ_LEN,
        "seed": 3,
        "heldout_fraction": HELDOUT_FRACTION,
        "dedup": True,
        "sources": [
            {"name": "web", "paths": [str(root / "web" / "*.jsonl"), str(root / "web" / "*.jsonl.gz")], "weight": 0.75},
            {"name": "books", "paths": [str(root / "books" / "*")], "weight": 0.25, "max_repetition": 2},
            {"name": "junk", "paths": [str(root / "junk" / "*.jsonl")], "weight": 0.01},
        ],
    }
    c.mixture_path.write_text(yaml.safe_dump(mixture, sort_keys=False))
    return c


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Corpus:
    return build_once(tmp_path_factory, "corpus", make_corpus)


def _run_job(corpus: Corpus, out: Path, *beam_args: str) -> Path:
    _run_job_with_counters(corpus, out, *beam_args)
    return out


def _run_job_with_counters(corpus: Corpus, out: Path, *beam_args: str) -> tuple[Path, dict[str, int]]:
    from pipelines import beam_metrics as metrics
    from pipelines.tokenize import run

    result, _, _ = run(["--mixture", str(corpus.mixture_path), "--output", str(out), *beam_args])
    return out, metrics.collect(result)


@pytest.fixture(scope="session")
def job_run(corpus, tmp_path_factory) -> tuple[Path, dict[str, int]]:
    """The job on the test corpus (one worker, in process): its output folder and Beam counters."""
    return build_once(
        tmp_path_factory, "out1", lambda out: _run_job_with_counters(corpus, out, "--direct_num_workers=1")
    )


@pytest.fixture(scope="session")
def job_out(job_run) -> Path:
    """The job on the test corpus: one worker, in process."""
    return job_run[0]


@pytest.fixture(scope="session")
def job_out_2workers(corpus, tmp_path_factory) -> Path:
    """The same job with two worker processes."""
    return build_once(
        tmp_path_factory,
        "out2",
        lambda out: _run_job(corpus, out, "--direct_num_workers=2", "--direct_running_mode=multi_processing"),
    )


@pytest.fixture(scope="session")
def job_out_2threads(corpus, tmp_path_factory) -> Path:
    """The same job with two worker threads (tiktoken releases the GIL while it encodes)."""
    return build_once(
        tmp_path_factory,
        "out2t",
        lambda out: _run_job(corpus, out, "--direct_num_workers=2", "--direct_running_mode=multi_threading"),
    )


@pytest.fixture(scope="session")
def job_out_no_dedup(corpus, tmp_path_factory) -> Path:
    """The job on the same corpus with `dedup: false` (every copy kept)."""

    def build(out: Path) -> Path:
        from pipelines.tokenize import run

        raw = yaml.safe_load(corpus.mixture_path.read_text())
        mixture = corpus.root / "mixture-no-dedup.yaml"
        mixture.write_text(yaml.safe_dump({**raw, "dedup": False}, sort_keys=False))
        run(["--mixture", str(mixture), "--output", str(out)])
        return out

    return build_once(tmp_path_factory, "out-no-dedup", build)


@pytest.fixture(scope="session")
def manifest(job_out) -> dict:
    return json.loads((job_out / "manifest.json").read_text())
