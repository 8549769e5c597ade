"""The tokenizer-exactness corpus (issue 60): documents that stress a cl100k encoder where English
prose does not, built here from Unicode ranges and the repository's own texts (nothing downloaded),
deterministically (one seed → the same bytes).

    .venv/bin/python -m bench.exactness_corpus --fixture tests/pipelines/data/exactness.jsonl.gz
    .venv/bin/python -m bench.exactness_corpus --bench_mb 256 --out DIR [--files 8]
    .venv/bin/python -m bench.exactness_corpus --check 25 [--engines quicktok gigatoken]

Kinds (`KINDS`): multilingual (30 scripts' letters, marks and digits), emoji (ZWJ sequences, skin
tones, flags, keycaps, variation selectors), combining marks (stacked, NFD), RTL (Arabic, Hebrew,
bidi controls), CJK (ideographs, kana, Hangul, full-width forms), whitespace-heavy (every \\s
character cl100k's pattern treats alike or not, in runs, at the end of a text), contractions (the
pattern's case-insensitive `'s|'t|…` against curly quotes and upper case), numbers and symbols, and
long documents (≥ 1M characters) concatenating all of them.
`--fixture`: the small test fixture (each kind 6 times; the tests add one long document of
`LONG_CHARS` from the same generator, `fixture_docs(long_chars=LONG_CHARS)[-1]`).
`--check N`: every engine's ids against tiktoken's on N seeds' fixtures (20 documents per kind) and
very long single pre-tokens (`LONG_RUNS`).
`--bench_mb`: distinct documents of natural-looking text (a Zipf-sampled vocabulary whose tail keeps
growing, as Heaps' law says real text's does: the words of the repository's code and docs and of the
embedded sample first, then generated words in every script) with the kinds above mixed in, as
Dolma-style .jsonl.zst files.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import random
import unicodedata
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEED = 60
LONG_CHARS = 1_000_000

# (first, last) code points of each script's letters: Latin-1 and Extended-A, Greek, Cyrillic,
# Armenian, Hebrew, Arabic, Devanagari, Bengali, Tamil, Thai, Georgian, Ethiopic, Cherokee,
# Hangul, hiragana, katakana, CJK, Mongolian, Tibetan, Sinhala, Khmer, math letters (astral)…
SCRIPTS = {
    "latin": (0x00C0, 0x017F),
    "greek": (0x0391, 0x03C9),
    "cyrillic": (0x0410, 0x044F),
    "armenian": (0x0531, 0x0587),
    "hebrew": (0x05D0, 0x05EA),
    "arabic": (0x0621, 0x064A),
    "devanagari": (0x0905, 0x0939),
    "bengali": (0x0985, 0x09B9),
    "tamil": (0x0B85, 0x0BB9),
    "thai": (0x0E01, 0x0E30),
    "tibetan": (0x0F40, 0x0F6C),
    "georgian": (0x10D0, 0x10FA),
    "ethiopic": (0x1200, 0x1350),
    "cherokee": (0x13A0, 0x13F4),
    "khmer": (0x1780, 0x17B3),
    "mongolian": (0x1820, 0x1877),
    "hangul": (0xAC00, 0xD7A3),
    "hiragana": (0x3041, 0x3096),
    "katakana": (0x30A1, 0x30FA),
    "cjk": (0x4E00, 0x9FFF),
    "cjk_ext_b": (0x20000, 0x2A6DF),
    "math_bold": (0x1D400, 0x1D6A5),
    "sinhala": (0x0D85, 0x0D96),
    "syriac": (0x0710, 0x072F),
    "thaana": (0x0780, 0x07A5),
    "nko": (0x07CA, 0x07EA),
    "canadian": (0x1401, 0x166C),
    "runic": (0x16A0, 0x16EA),
    "gothic": (0x10330, 0x1034A),
    "deseret": (0x10400, 0x1044F),
}
DIGITS = ["0123456789", "٠١٢٣٤٥٦٧٨٩", "۰۱۲۳۴۵۶۷۸۹", "०१२३४५६७८९", "০১২৩৪৫৬৭৮৯", "０１２３４５６７８９", "๐๑๒๓๔๕๖๗๘๙"]
# every character \s matches (Python's and Rust regex's Unicode White_Space), plus look-alikes that
# are not white space (ZWSP, word joiner, BOM, Mongolian vowel separator)
SPACES = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x1f", "\x85", "\xa0", "\u1680"]
SPACES += [chr(c) for c in range(0x2000, 0x200B)] + ["\u2028", "\u2029", "\u202f", "\u205f", "\u3000"]
NOT_SPACES = ["\u200b", "\u2060", "\ufeff", "\u180e", "\u200c", "\u200d"]
BIDI = ["\u200e", "\u200f", "\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]
PUNCT = list(".,;:!?-—–()[]{}\"'`~@#$%^&*_+=<>/\\|…«»“”‘’„‚‹›¿¡·•°±§¶†‡※、。，．！？「」『』【】《》〈〉")
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'lL", "'D", "’s", "’LL", "''s"]
EMOJI_BASE = [0x1F600, 0x1F64F, 0x1F300, 0x1F5FF, 0x1F680, 0x1F6FF, 0x1F900, 0x1F9FF]
SKIN = [chr(c) for c in range(0x1F3FB, 0x1F400)]
ZWJ_PEOPLE = ["👨", "👩", "👧", "👦", "🧑", "❤️", "💋", "🔬", "🚀", "🏳️", "🌈", "⚧️"]


@functools.cache
def _alphabet(script: str) -> str:
    """The script's assigned code points in its range, in order."""
    lo, hi = SCRIPTS[script]
    return "".join(c for c in map(chr, range(lo, hi + 1)) if unicodedata.category(c) != "Cn")


def _letter(rng: random.Random, script: str) -> str:
    return rng.choice(_alphabet(script))


def _word(rng: random.Random, script: str, n: int | None = None) -> str:
    return "".join(_letter(rng, script) for _ in range(n or rng.randint(1, 9)))


def _join(rng: random.Random, parts: list[str]) -> str:
    out = []
    for p in parts:
        out.append(p)
        out.append(rng.choice([" ", " ", " ", "\n", ", ", ". ", "  ", "\t", ""]))
    return "".join(out)


def multilingual(rng: random.Random, n: int) -> str:
    parts = []
    for _ in range(n):
        script = rng.choice(list(SCRIPTS))
        w = _word(rng, script)
        r = rng.random()
        if r < 0.1:
            w += "".join(rng.choice(rng.choice(DIGITS)) for _ in range(rng.randint(1, 8)))
        elif r < 0.2:
            w = rng.choice(PUNCT) + w
        elif r < 0.25:
            w = w.upper() + _word(rng, "latin").title()
        parts.append(w)
    return _join(rng, parts)


def emoji(rng: random.Random, n: int) -> str:
    parts = []
    for _ in range(n):
        r = rng.random()
        if r < 0.3:
            a = rng.randrange(0, len(EMOJI_BASE), 2)
            e = chr(rng.randint(EMOJI_BASE[a], EMOJI_BASE[a + 1]))
        elif r < 0.5:
            e = "\u200d".join(rng.choice(ZWJ_PEOPLE) for _ in range(rng.randint(2, 4)))
        elif r < 0.65:
            e = rng.choice("👍👋🤝🧒🏃💪") + rng.choice(SKIN)
        elif r < 0.8:
            e = "".join(chr(0x1F1E6 + rng.randrange(26)) for _ in range(2))  # a flag's regional indicators
        elif r < 0.9:
            e = rng.choice("0123456789#*") + "\ufe0f\u20e3"  # keycap
        else:
            e = rng.choice("☀☁☂☃★☆♠♣♥♦✂✈✉✏") + rng.choice(["\ufe0e", "\ufe0f", ""])
        parts.append(e * rng.choice([1, 1, 1, 2, 5]) + (_word(rng, "latin") if rng.random() < 0.3 else ""))
    return _join(rng, parts)


def combining(rng: random.Random, n: int) -> str:
    parts = []
    for _ in range(n):
        base = _word(rng, rng.choice(["latin", "greek", "cyrillic", "devanagari", "hebrew", "arabic"]))
        marked = "".join(
            c + "".join(chr(rng.randint(0x0300, 0x036F)) for _ in range(rng.choice([0, 1, 1, 2, 5, 12]))) for c in base
        )
        parts.append(rng.choice([marked, unicodedata.normalize("NFD", marked), "\u0301" + marked]))
    return _join(rng, parts)


def rtl(rng: random.Random, n: int) -> str:
    parts = []
    for _ in range(n):
        w = _word(rng, rng.choice(["arabic", "hebrew", "syriac", "thaana", "nko"]))
        if rng.random() < 0.3:
            w = rng.choice(BIDI) + w + rng.choice(BIDI)
        if rng.random() < 0.2:
            w += " " + "".join(rng.choice(rng.choice(DIGITS[:3])) for _ in range(rng.randint(1, 6)))
        if rng.random() < 0.1:
            w += " " + _word(rng, "latin")
        parts.append(w)
    return _join(rng, parts)


def cjk(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        out.append(
            _word(rng, rng.choice(["cjk", "cjk", "hiragana", "katakana", "hangul", "cjk_ext_b"]), rng.randint(1, 30))
        )
        out.append(
            rng.choice(["、", "。", "，", "！", "？", "「", "」", " ", "", "\n", "ー", "・", "１２３", "ＡＢＣ"])
        )
    return "".join(out)


def whitespace(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        run = "".join(rng.choice(SPACES) for _ in range(rng.choice([1, 2, 3, 8, 40, 300])))
        if rng.random() < 0.3:
            run = rng.choice([" ", "\n", "\t", "\r\n", "\u3000"]) * rng.choice([2, 17, 1000])
        out.append(run)
        out.append(rng.choice([_word(rng, "latin"), rng.choice(PUNCT), rng.choice(NOT_SPACES), "x", "'s", "1234"]))
    if rng.random() < 0.5:  # trailing white space: the pattern's `\s++$`
        out.append(rng.choice(SPACES) * rng.randint(1, 20))
    return "".join(out)


def contractions(rng: random.Random, n: int) -> str:
    parts = []
    for _ in range(n):
        w = (
            _word(rng, rng.choice(["latin", "greek", "cyrillic"]))
            if rng.random() < 0.3
            else rng.choice(["it", "DON", "we", "They", "I"])
        )
        parts.append(w + rng.choice(CONTRACTIONS) + rng.choice(["", "s", "x", "'", " "]))
    return _join(rng, parts)


def symbols(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        r = rng.random()
        if r < 0.3:
            out.append("".join(rng.choice(DIGITS[0]) for _ in range(rng.randint(1, 40))))
        elif r < 0.6:
            out.append("".join(rng.choice(PUNCT) for _ in range(rng.randint(1, 12))))
        elif r < 0.8:
            out.append(
                chr(rng.choice([rng.randint(0x2190, 0x22FF), rng.randint(0xE000, 0xE0FF), rng.randint(1, 31), 0xFFFD]))
            )
        else:
            out.append(f"{rng.random():.{rng.randint(1, 17)}f}" + rng.choice(["e-9", "%", "px", "", "¹²³"]))
        out.append(rng.choice(["", " ", "\n", rng.choice(PUNCT)]))
    return "".join(out)


def repo_texts() -> list[str]:
    """The repository's own Python and Markdown files, in path order (code, prose, tables)."""
    paths = sorted(p for ext in ("*.py", "*.md") for p in REPO.glob(f"[a-z]*/{ext}") if ".venv" not in p.parts)
    return [p.read_text(encoding="utf-8") for p in paths]


KINDS = {
    "multilingual": multilingual,
    "emoji": emoji,
    "combining": combining,
    "rtl": rtl,
    "cjk": cjk,
    "whitespace": whitespace,
    "contractions": contractions,
    "symbols": symbols,
}


def fixture_docs(seed: int = SEED, per_kind: int = 6, long_chars: int = 0) -> list[dict]:
    """The test fixture: `per_kind` documents of each kind (id: the kind's name and its number),
    of 3, 20 or 200 pieces each; with `long_chars`, one more document ("long-0") of at least that
    many characters, made of all the kinds."""
    rng = random.Random(seed)
    docs = [
        {"id": f"{kind}-{k}", "text": make(rng, rng.choice([3, 20, 200]))}
        for kind, make in KINDS.items()
        for k in range(per_kind)
    ]
    if long_chars:
        docs.append({"id": "long-0", "text": long_text(rng, long_chars)})
    return docs


def long_text(rng: random.Random, chars: int) -> str:
    parts, n = [], 0
    kinds = list(KINDS.values())
    while n < chars:
        p = rng.choice(kinds)(rng, 400)
        parts.append(p)
        n += len(p)
    return "".join(parts)


def write_fixture(path: Path, docs: list[dict]) -> None:
    data = "".join(json.dumps(d, ensure_ascii=False) + "\n" for d in docs).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data, mtime=0))  # mtime 0: the same bytes on every run


def read_fixture(path: Path) -> list[dict]:
    # split on "\n" only: str.splitlines would also split inside texts (U+2028, U+0085, \x1c…)
    return [json.loads(line) for line in gzip.decompress(path.read_bytes()).decode().split("\n") if line]


# --- The bench corpus: distinct documents of natural-looking text -----------------------------
ZIPF_A = 1.4  # rank-frequency exponent of the word stream: ~2% of words rarer than the base vocabulary
GENERATED_WORDS = 1 << 17  # the generated vocabulary's table; rarer ranks compound two of its words
KIND_SHARE = 0.02  # share of bench documents that are one of KINDS (stress text) instead of prose


def sample_texts() -> list[str]:
    """The embedded sample's texts (pipelines/sample.py: code, docstrings, math), built if needed."""
    from pipelines.read import open_lines  # lazy: --help imports nothing heavy
    from pipelines.sample import build_sample  # lazy: as above

    root = Path(build_sample())
    return [json.loads(line)["text"] for p in sorted(root.rglob("*.jsonl*")) for line in open_lines(str(p))]


def base_vocabulary(texts: list[str]) -> list[str]:
    """The words of `texts` (runs of letters; punctuation and digits come from the separators and
    the kinds), most frequent first (ties by the word itself)."""
    import re  # lazy: only the bench corpus needs it

    counts = Counter(w for t in texts for w in re.findall(r"[^\W\d_]+", t))
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def generated_words(rng: random.Random, n: int) -> list[str]:
    scripts = list(SCRIPTS)
    weights = [40 if s == "latin" else 2 for s in scripts]
    return [_word(rng, rng.choices(scripts, weights)[0], rng.randint(2, 10)) for _ in range(n)]


def bench_docs(seed: int, base: list[str]):
    """Distinct documents forever (the caller stops): Zipf-sampled words (rank < len(base): the
    base vocabulary; beyond: generated words, and past those two generated words run together, so
    the vocabulary keeps growing) with punctuation and paragraphs; every `1/KIND_SHARE`-th one on
    average a stress document of KINDS. Document k starts with its number: no two are equal."""
    import numpy as np  # lazy: --help imports nothing heavy

    rng = random.Random(seed)
    gen = np.random.default_rng(seed)
    table = np.array(base + generated_words(rng, GENERATED_WORDS), dtype=object)
    t = len(table)
    seps = np.array([" "] * 14 + [", ", ". ", ".\n\n", "\n", " (", ") ", ": ", "; ", " - "], dtype=object)
    k = 0
    while True:
        if rng.random() < KIND_SHARE:
            kind = rng.choice(list(KINDS))
            yield {"id": f"{k:09d}", "text": f"{k} {kind}\n" + KINDS[kind](rng, rng.randint(20, 2000))}
        else:
            n = int(min(gen.lognormal(6.0, 1.2), 60_000)) + 5  # words: median ~400, a long tail
            ranks = gen.zipf(ZIPF_A, n) - 1
            words = table[np.minimum(ranks, t - 1)]
            tail = np.flatnonzero(ranks >= t)
            for i in tail:  # rarer than the table: two generated words, one new word per rank
                r = int(ranks[i])
                words[i] = table[len(base) + r % GENERATED_WORDS] + table[len(base) + (r // t) % GENERATED_WORDS]
            parts = np.empty(2 * n, dtype=object)  # word, separator, word, …: one join, no pair strings
            parts[0::2], parts[1::2] = words, seps[gen.integers(0, len(seps), n)]
            text = "".join(parts)
            yield {"id": f"{k:09d}", "text": f"{k}\n{text}"}
        k += 1


def write_bench(out: Path, size_mb: int, files: int = 8, seed: int = SEED) -> list[str]:
    """Dolma-style .jsonl.zst files (`files` of them) totalling about `size_mb` MiB of JSON lines."""
    import zstandard  # lazy: only the bench corpus is compressed

    base = base_vocabulary(repo_texts() + sample_texts())
    out.mkdir(parents=True, exist_ok=True)
    per = size_mb * (1 << 20) // files
    docs = bench_docs(seed, base)
    paths = []
    for i in range(files):
        lines, total = [], 0
        while total < per:
            line = json.dumps(next(docs), ensure_ascii=False).encode() + b"\n"
            lines.append(line)
            total += len(line)
        p = out / f"part-{i:05d}.jsonl.zst"
        p.write_bytes(zstandard.ZstdCompressor(level=3).compress(b"".join(lines)))
        paths.append(str(p))
    return paths


# single pre-tokens (or runs of them) far longer than any natural one: BPE's slow paths
LONG_RUNS = ["a" * 100_000, " " * 100_000, "\n" * 50_000 + "x", "ab" * 50_000, "1" * 100_000, "é" * 50_000]
LONG_RUNS += ["😀" * 20_000, "\u0301" * 30_000, "x" + " " * 1000, " " * 1000 + "\n", "\r\n" * 1000]
LONG_RUNS += ["it'S DON'T we'LL", "中" * 100_000, "word " * 100_000]


def check(seeds: int, engines: list[str]) -> None:
    """Every engine's ids against tiktoken's on `seeds` fixtures of 20 documents per kind, plus
    LONG_RUNS: prints the documents that differ and a count per engine."""
    import numpy as np  # lazy: --help imports nothing heavy

    from pipelines import dolma2_tokenizer as tk  # lazy: as above

    reference = tk.ordinary_ids(tk.dolma2())
    bad, total = dict.fromkeys(engines, 0), 0
    for seed in range(seeds):
        texts = [d["text"] for d in fixture_docs(seed=seed, per_kind=20)] + (LONG_RUNS if seed == 0 else [])
        want = [np.frombuffer(reference(t), np.uint32) for t in texts]
        total += len(texts)
        for name in engines:
            ids, off = tk.get_engine(name).encode_batch(texts)
            for i, w in enumerate(want):
                if not np.array_equal(ids[off[i] : off[i + 1]], w):
                    bad[name] += 1
                    print(f"{name} differs: seed {seed} document {i}: {texts[i][:60]!r}")
    print(f"{total} documents ({seeds} seeds × 20 per kind + {len(LONG_RUNS)} long runs); differing: {bad}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fixture", type=Path, help="write the test fixture here (.jsonl.gz)")
    ap.add_argument("--bench_mb", type=int, help="write this many MiB of bench documents into --out")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--check", type=int, metavar="SEEDS", help="compare --engines with tiktoken on SEEDS fixtures")
    ap.add_argument("--engines", nargs="+", default=["quicktok", "gigatoken"])
    args = ap.parse_args()
    if args.check:
        check(args.check, args.engines)
    if args.fixture:
        write_fixture(args.fixture, fixture_docs())
        print(f"wrote {args.fixture}")
    if args.bench_mb:
        if args.out is None:
            ap.error("--bench_mb needs --out")
        print("\n".join(write_bench(args.out, args.bench_mb, args.files)))


if __name__ == "__main__":
    main()
