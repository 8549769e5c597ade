"""Property: whatever the input lines, the job finishes and every line is accounted for exactly
once — in a shard (decoded back to its text), in rejects/ with the reason it must have, or in
duplicates/ next to the copy that was kept.

Thousands of generated lines go through ONE job (a Beam start costs seconds, so one big input
instead of many tiny jobs): valid documents with random code points (NUL, controls, astral,
noncharacters, U+2028, special-token text) and odd ids; lone surrogates escaped and raw; odd
types in every field; truncated, garbled and non-UTF-8 JSON; duplicates within and across
sources; lines over the length limit. A seeded generator that writes down each line's expected fate as it builds the line,
so the expectations are by construction, not computed with the pipeline's own functions.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import random

import yaml

from pipelines.dolma2_tokenizer import dolma2

from .test_job import docs_of, read_split

SEED, LINES, SEQ_LEN, HELDOUT = 14, 4000, 64, 0.2
MAX_LINE = 4096  # the job's line limit for this test (its own is 256 MiB): longer lines are rejected
FILES = {"web/a.jsonl": "web", "web/b.jsonl.gz": "web", "books/c.jsonl": "books", "code/d.jsonl": "code"}
ODD_VALUES = [0, -1, 1.5, 10**30, True, False, None, [], ["x"], {}, {"text": "nested"}]
POOLS = [
    (0x20, 0x7E),
    (0x00, 0x1F),
    (0x7F, 0x9F),
    (0xA0, 0x24F),
    (0x370, 0x3FF),
    (0x4E00, 0x9FFF),
    (0x1F300, 0x1FAFF),
    (0xFFF0, 0xFFFF),
    (0x2028, 0x2029),
    (0x0300, 0x036F),
    (0x10000, 0x10FFFF),
]


def _char(rng: random.Random) -> str:
    lo, hi = rng.choice(POOLS)
    return chr(rng.randint(lo, hi))  # no pool reaches the surrogates (0xD800–0xDFFF)


def _text(rng: random.Random) -> str:
    if rng.random() < 0.05:
        return rng.choice([" ", "\n", "\x00", "<|endoftext|>", "\ufeff", "a" * 3000])
    return "".join(_char(rng) for _ in range(rng.randint(1, 40)))


def _id(rng: random.Random, n: int) -> str:
    return rng.choice([f"id{n}", "", " ", "\x00", "\n", "same-id", "x" * 1000, "🙂", "001", _text(rng)])


def _surrogate(rng: random.Random, s: str) -> str:
    k = rng.randint(0, len(s))
    return s[:k] + chr(rng.randint(0xD800, 0xDFFF)) + s[k:]


def _dumps(obj, rng: random.Random, ascii_only: bool | None = None) -> bytes:
    ascii_only = rng.random() < 0.5 if ascii_only is None else ascii_only
    return json.dumps(obj, ensure_ascii=ascii_only).encode("utf-8")


def generate(rng: random.Random):
    """→ (lines per file, [(file, line, expected)]) with expected = ("doc", id, text) or
    ("reject", reason, id written with it) or ("blank",)."""
    lines: dict[str, list[bytes]] = {f: [] for f in FILES}
    fates: list[tuple[str, int, tuple]] = []
    valid: list[tuple[str, str]] = []  # (id, text) of valid documents so far: duplicates reuse them
    for n in range(LINES):
        doc_id, text = _id(rng, n), _text(rng)
        extra = {rng.choice(["meta", "source", "added", "id2"]): rng.choice(ODD_VALUES + [_text(rng)])}
        kind = rng.randrange(19)
        if kind == 18:  # over the length limit: a valid document or a broken line
            raw = rng.choice(
                [
                    _dumps({"id": doc_id, "text": "long " * rng.randint(820, 3000)}, rng),
                    b"{" * rng.randint(MAX_LINE + 1, 3 * MAX_LINE),
                ]
            )
        elif kind <= 4:  # valid, sometimes an exact or a same-text copy of an earlier one
            if valid and kind == 4:
                doc_id, text = rng.choice(valid) if rng.random() < 0.5 else (_id(rng, n), rng.choice(valid)[1])
            raw = _dumps({"id": doc_id, "text": text, **extra}, rng)
            if rng.random() < 0.1:
                raw = raw[:-1] + b', "text": ' + _dumps(text, rng) + b"}"  # a repeated key: the last one counts
            if rng.random() < 0.1:
                raw += b"\r"
            fate = ("doc", doc_id, text)
        elif kind == 5:
            raw, fate = (
                _dumps({"id": doc_id, "text": _surrogate(rng, text)}, rng, True),
                ("reject", "invalid_unicode", doc_id),
            )
        elif kind == 6:
            body = {"id": _surrogate(rng, doc_id)} | ({"text": text} if rng.random() < 0.7 else {})
            raw, fate = _dumps(body, rng, True), ("reject", "id_invalid_unicode", None)
        elif kind == 7:  # a surrogate written raw (CESU-8 bytes): not UTF-8 at all
            body = {"id": doc_id, "text": _surrogate(rng, text)}
            raw, fate = (
                json.dumps(body, ensure_ascii=False).encode("utf-8", "surrogatepass"),
                ("reject", "invalid_utf8", None),
            )
        elif kind == 8:
            raw, fate = _dumps({"id": rng.choice(ODD_VALUES), "text": text}, rng), ("reject", "id_not_string", None)
        elif kind == 9:
            raw, fate = _dumps({"text": rng.choice([text, *ODD_VALUES])}, rng), ("reject", "missing_id", None)
        elif kind == 10:
            raw, fate = (
                _dumps({"id": doc_id, "text": rng.choice(ODD_VALUES)}, rng),
                ("reject", "text_not_string", doc_id),
            )
        elif kind == 11:
            raw, fate = (
                _dumps({"id": doc_id, **extra} if "text" not in extra else {"id": doc_id}, rng),
                ("reject", "missing_text", doc_id),
            )
        elif kind == 12:
            raw, fate = _dumps({"id": doc_id, "text": ""}, rng), ("reject", "empty_text", doc_id)
        elif kind == 13:
            raw, fate = (
                _dumps(rng.choice([1, "s", None, [doc_id, text], 2.5, True]), rng),
                ("reject", "not_an_object", None),
            )
        elif kind == 14:  # a proper prefix of an object (cut between characters) is never JSON
            full = json.dumps({"id": doc_id, "text": text}, ensure_ascii=rng.random() < 0.5)
            raw, fate = full[: rng.randint(1, len(full) - 1)].encode("utf-8"), ("reject", "invalid_json", None)
        elif kind == 15:  # a raw control character inside a string, or trailing garbage
            bad = rng.choice(
                [
                    '{"id": "a\x00b", "text": "t"}',
                    '{"id": "a", "text": "t\x01"}',
                    json.dumps({"id": doc_id, "text": text}) + " x",
                    "{'id': 'a', 'text': 't'}",
                    "nul\x00",
                ]
            )
            raw, fate = bad.encode("utf-8"), ("reject", "invalid_json", None)
        elif kind == 16:  # a byte that is never UTF-8, anywhere in an otherwise valid line
            ok = _dumps({"id": doc_id, "text": text}, rng)
            k = rng.randint(0, len(ok))
            raw, fate = ok[:k] + b"\xff" + ok[k:], ("reject", "invalid_utf8", None)
        else:
            raw, fate = rng.choice([b"", b" ", b"\t \t", b"\r"]), ("blank",)
        assert b"\n" not in raw
        if len(raw) > MAX_LINE:
            fate = ("reject", "line_too_long", None)
        elif fate[0] == "doc":
            valid.append(fate[1:])
        f = rng.choice(list(FILES))
        lines[f].append(raw)
        fates.append((f, len(lines[f]), fate))
    return lines, fates


def expected_split(text: str) -> str:
    h = int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")
    return "heldout" if h < HELDOUT * 2**64 else "train"


def test_every_generated_line_is_accounted_for_exactly_once(tmp_path, monkeypatch):
    from pipelines import read
    from pipelines.tokenize import run

    monkeypatch.setattr(read, "MAX_LINE_BYTES", MAX_LINE)  # the in-process runner reads it at run time
    lines, fates = generate(random.Random(SEED))
    for rel, ls in lines.items():
        data = b"".join(x + b"\n" for x in ls)
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(gzip.compress(data, mtime=0) if rel.endswith(".gz") else data)
    mixture = tmp_path / "mix.yaml"
    mixture.write_text(
        yaml.safe_dump(
            {
                "name": "fuzz",
                "tokenizer": "dolma2",
                "seq_len": SEQ_LEN,
                "seed": 0,
                "heldout_fraction": HELDOUT,
                "dedup": True,
                "sources": [
                    {"name": s, "paths": [str(tmp_path / s / "*")], "weight": 1} for s in dict.fromkeys(FILES.values())
                ],
            }
        )
    )
    out = tmp_path / "out"
    run(["--mixture", str(mixture), "--output", str(out)])  # never fails
    m = json.loads((out / "manifest.json").read_text())

    want_rejects: dict[str, list] = collections.defaultdict(list)
    docs = []  # (source, id, file, line, text)
    for rel, line, fate in fates:
        source, path = FILES[rel], str(tmp_path / rel)
        if fate[0] == "reject":
            want_rejects[source].append((path, line, fate[1], fate[2]))
        elif fate[0] == "doc":
            docs.append((source, fate[1], path, line, fate[2]))
    copies = collections.defaultdict(list)
    for d in docs:
        copies[d[4]].append(d)
    kept = {text: min(cs) for text, cs in copies.items()}  # smallest (source, id, file, line)
    want_dups = collections.defaultdict(set)
    for text, cs in copies.items():
        for d in cs:
            if d is not kept[text]:
                want_dups[d[0]].add((d[1], d[2], d[3], kept[text][0], kept[text][1]))
    assert sum(map(len, want_dups.values())) > 50 and len(kept) > 500, "generator too weak"

    enc = dolma2()
    for source, entry in m["sources"].items():
        c = entry["counts"]
        assert c["documents"] == sum(1 for rel, _, f in fates if FILES[rel] == source and f[0] != "blank")
        rows = [json.loads(x) for x in (out / "rejects" / f"{source}.jsonl").read_text(encoding="utf-8").splitlines()]
        assert [(r["file"], r["line"], r["reason"], r["id"]) for r in rows] == sorted(want_rejects[source])
        assert {r: n for r, n in c["rejected"].items() if n} == dict(
            collections.Counter(r[2] for r in want_rejects[source])
        )
        dups = [
            json.loads(x) for x in (out / "duplicates" / f"{source}.jsonl").read_text(encoding="utf-8").splitlines()
        ]
        assert len(dups) == c["duplicates"] == len(want_dups[source])
        assert {(d["id"], d["file"], d["line"], d["kept"]["source"], d["kept"]["id"]) for d in dups} == want_dups[
            source
        ]
        for split in ("train", "heldout"):
            got = collections.Counter(enc.decode(d) for d in docs_of(read_split(out, m, source, split)))
            want = collections.Counter(t for t, k in kept.items() if k[0] == source and expected_split(t) == split)
            assert got == want and c[split] == sum(want.values()), (source, split)
