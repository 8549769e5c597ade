"""The embedded sample: Dolma-style JSONL built at run time from what every Python has.

Nothing is downloaded and no text is committed: the sample is built into
`$OLMAX_CACHE/sample-py<X.Y.Z>/` (default cache `~/.cache/olmax`) from
  code   the standard library's source files (one document per file)      → .jsonl.zst
  prose  the standard library's docstrings (module/class/function)          → .jsonl.gz
  math   generated worked arithmetic/algebra problems (seeded RNG)          → .jsonl
so the three input formats are exercised. For a given Python version the bytes are identical
on every machine with the same standard library (files are chosen by a hash of their path; gzip
has no timestamp); a distribution that patches stdlib files gives a different, equally valid
sample. The manifest's fingerprint does not include input paths, so the cache location does not
matter.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import inspect
import json
import os
import random
import shutil
import sys
import sysconfig
from collections.abc import Iterator
from fractions import Fraction
from math import gcd
from pathlib import Path

import zstandard

SAMPLE_VERSION = 1  # bump when the builder's output changes
CODE_BYTES = 2_000_000  # target sizes per source (the whole sample is a few MB)
PROSE_BYTES = 1_000_000
MATH_BYTES = 1_000_000
MAX_FILE_BYTES = 100_000  # skip giant generated modules (e.g. pydoc_data/topics.py)
MIN_DOCSTRING_CHARS = 200
FILES_PER_SOURCE = 2
MATH_SEED = 1234
ZSTD_LEVEL = 3
_SKIP_DIRS = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__", "turtledemo"}
_DONE = "DONE"


def cache_dir() -> Path:
    return Path(os.environ.get("OLMAX_CACHE") or Path.home() / ".cache" / "olmax")


def _stdlib_files() -> list[tuple[str, Path]]:
    """(relative path, path) of stdlib .py files in a path-hash order (deterministic, mixed)."""
    root = Path(sysconfig.get_path("stdlib"))
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in _SKIP_DIRS)
        for fn in sorted(filenames):
            if fn.endswith(".py"):
                p = Path(dirpath) / fn
                found.append((p.relative_to(root).as_posix(), p))
    return sorted(found, key=lambda rp: hashlib.sha256(rp[0].encode()).digest())


def _read_text(p: Path) -> str | None:
    try:
        data = p.read_bytes()
        return data.decode("utf-8") if 0 < len(data) <= MAX_FILE_BYTES else None
    except (OSError, UnicodeDecodeError):
        return None


def code_docs(budget: int = CODE_BYTES) -> Iterator[dict]:
    used = 0
    for rel, p in _stdlib_files():
        text = _read_text(p)
        if not text or not text.strip():
            continue
        yield {"id": f"stdlib/{rel}", "text": text, "source": "python-stdlib-code", "metadata": {"path": rel}}
        used += len(text.encode("utf-8"))
        if used >= budget:
            return


def _docstrings(tree: ast.Module, rel: str) -> Iterator[tuple[str, str]]:
    """(where, docstring) for the module and every class/function in it, in source order."""

    def walk(
        node: ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef, qual: tuple[str, ...]
    ) -> Iterator[tuple[str, str]]:
        doc = ast.get_docstring(node, clean=True)
        if doc:
            yield (f"{rel}:{'.'.join(qual)}" if qual else rel), doc
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                yield from walk(child, (*qual, child.name))

    yield from walk(tree, ())


def prose_docs(budget: int = PROSE_BYTES) -> Iterator[dict]:
    used = 0
    for rel, p in reversed(_stdlib_files()):  # the other end of the order than code_docs
        text = _read_text(p)
        if not text:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        for where, doc in _docstrings(tree, rel):
            doc = inspect.cleandoc(doc)
            if len(doc) < MIN_DOCSTRING_CHARS:
                continue
            yield {
                "id": f"docstring/{where}",
                "text": doc,
                "source": "python-stdlib-docstrings",
                "metadata": {"path": rel},
            }
            used += len(doc.encode("utf-8"))
            if used >= budget:
                return


def _problem(rng: random.Random) -> str:
    kind = rng.randrange(5)
    if kind == 0:
        a, x, b = rng.randint(2, 19), rng.randint(-30, 30), rng.randint(-99, 99)
        c = a * x + b
        return (
            f"Solve {a}x + {b} = {c}.\nSubtract {b} from both sides: {a}x = {c - b}.\n"
            f"Divide both sides by {a}: x = {x}.\nCheck: {a}*{x} + {b} = {c}."
        )
    if kind == 1:
        m, n = rng.randint(10, 5000), rng.randint(10, 5000)
        steps, (p, q) = [], (max(m, n), min(m, n))
        while q:
            steps.append(f"{p} = {p // q}*{q} + {p % q}")
            p, q = q, p % q
        return (
            f"Find gcd({m}, {n}) with Euclid's algorithm.\n" + "\n".join(steps) + f"\nSo gcd({m}, {n}) = {gcd(m, n)}."
        )
    if kind == 2:
        f1, f2 = Fraction(rng.randint(1, 20), rng.randint(2, 20)), Fraction(rng.randint(1, 20), rng.randint(2, 20))
        den = f1.denominator * f2.denominator // gcd(f1.denominator, f2.denominator)
        return (
            f"Compute {f1} + {f2}.\nThe least common denominator is {den}: "
            f"{f1.numerator * den // f1.denominator}/{den} + {f2.numerator * den // f2.denominator}/{den} = {f1 + f2}."
        )
    if kind == 3:
        r, s = rng.randint(-12, 12), rng.randint(-12, 12)
        return (
            f"Factor x^2 + {-(r + s)}x + {r * s}.\nWe need two numbers with product {r * s} and sum {-(r + s)}: "
            f"{-r} and {-s}.\nSo x^2 + {-(r + s)}x + {r * s} = (x - {r})(x - {s}), with roots x = {r} and x = {s}."
        )
    first, d, n = rng.randint(-50, 50), rng.randint(1, 15), rng.randint(5, 60)
    last = first + (n - 1) * d
    return (
        f"Sum the arithmetic series {first}, {first + d}, {first + 2 * d}, ..., {last}.\n"
        f"There are n = {n} terms, so the sum is n*(first + last)/2 = {n}*({first} + {last})/2 = {n * (first + last) // 2}."
    )


def math_docs(budget: int = MATH_BYTES) -> Iterator[dict]:
    rng = random.Random(MATH_SEED)
    used, i = 0, 0
    while used < budget:
        text = "\n\n".join(f"Problem {k + 1}. {_problem(rng)}" for k in range(rng.randint(3, 8)))
        yield {
            "id": f"math/{i:06d}",
            "text": text,
            "source": "generated-math",
            "metadata": {"generator": SAMPLE_VERSION},
        }
        used += len(text.encode("utf-8"))
        i += 1


def _lines(docs: list[dict]) -> list[bytes]:
    return [json.dumps(d, ensure_ascii=False, sort_keys=True).encode("utf-8") + b"\n" for d in docs]


def _write_parts(folder: Path, docs: list[dict], suffix: str) -> None:
    folder.mkdir(parents=True)
    lines = _lines(docs)
    per = -(-len(lines) // FILES_PER_SOURCE)
    for k in range(FILES_PER_SOURCE):
        data = b"".join(lines[k * per : (k + 1) * per])
        if suffix == ".jsonl.gz":
            data = gzip.compress(data, mtime=0)
        elif suffix == ".jsonl.zst":
            data = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compress(data)
        (folder / f"part-{k:05d}{suffix}").write_bytes(data)


def build_sample(root: Path | None = None) -> str:
    """Build (once) and return the sample folder; concurrent callers are safe (rename commit)."""
    ver = ".".join(map(str, sys.version_info[:3]))
    final = (root or cache_dir()) / f"sample-v{SAMPLE_VERSION}-py{ver}"
    if (final / _DONE).exists():
        return str(final)
    tmp = final.with_name(f"{final.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    _write_parts(tmp / "code", list(code_docs()), ".jsonl.zst")
    _write_parts(tmp / "prose", list(prose_docs()), ".jsonl.gz")
    _write_parts(tmp / "math", list(math_docs()), ".jsonl")
    (tmp / _DONE).write_text("")
    try:
        os.rename(tmp, final)
    except OSError:  # another process finished first; its copy is identical
        shutil.rmtree(tmp, ignore_errors=True)
        if not (final / _DONE).exists():
            raise
    return str(final)
