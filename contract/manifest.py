"""manifest.json: the typed manifest, its one validation, its fingerprint, load and dump.

Layout (format_version 1; contract/README.md):
  format_version, record_format ("uint32-le[seq_len]"), seq_len,
  tokenizer {name, vocab_size, eos_id, pad_id, ranks_sha256},
  mixture {name, tokenizer, seq_len, seed, heldout_fraction, dedup, sources: [{name, paths, weight,
           max_repetition, ...}]},
  sources {name: {counts {documents, train, heldout, duplicates, rejected {reason: n}},
                  tokens {train, heldout, padding},
                  splits {train|heldout: {examples, shards: [{path, records, sha256}]}}}},
  fingerprint, and optionally build (provenance: tokenizer engine/version, ...).
Shard paths are relative to the manifest's folder and listed in reading order; each must resolve
inside that folder, or inside a folder the optional top-level `external_shard_roots` declares. `sources` is in
the mixture's source order (the reading order of the sources; checked by `validate`, because the
fingerprint's sorted keys do not see it).

Fingerprint: sha256 of the canonical JSON (sorted keys, no spaces, ASCII) of the manifest
WITHOUT the top-level keys in `FINGERPRINT_EXCLUDED_KEYS` (`fingerprint` itself and `build`,
provenance that does not change the data) and without the mixture's input `paths` (the same
data built from a copy elsewhere has the same fingerprint; shard sha256s pin the content).
`Manifest.load` recomputes it and refuses a manifest whose content does not match.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import os
import posixpath
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from .errors import Refused
from .records import RECORD_FORMAT

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
TRAIN, HELDOUT = "train", "heldout"
SPLITS = (TRAIN, HELDOUT)
FINGERPRINT_EXCLUDED_KEYS = ("fingerprint", "build")  # top-level keys outside the fingerprint
COUNT_KEYS = ("documents", "train", "heldout", "duplicates", "rejected")
# Source names become folder and file names (DIR/<name>/, DIR/rejects/<name>.jsonl) and must not
# collide with the job's own names, also on case-insensitive filesystems; matched in full.
SOURCE_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
RESERVED_NAMES = frozenset({"rejects", "duplicates", "manifest.json", "olmax-output.json"})
# Optional top-level list of folders (absolute, a `gs://` prefix, or relative to the manifest's
# folder) where shards may be besides the manifest's own folder: a manifest that reads shards from
# elsewhere says so here, on purpose (and the fingerprint covers it). Without it every shard path
# must resolve inside the manifest's folder.
EXTERNAL_SHARD_ROOTS = "external_shard_roots"


def valid_source_name(name: Any) -> bool:
    """A full match of the name rule (a trailing newline fails) and not a reserved name in any case."""
    return (
        isinstance(name, str) and SOURCE_NAME_RE.fullmatch(name) is not None and name.casefold() not in RESERVED_NAMES
    )


# Mixture sources. `format`: "jsonl" (Dolma documents, tokenized by the job; the
# default) or "tokens" (OLMo-core / dolma token files, converted one file → one shard, record j =
# the file's fixed-length instance j; no re-tokenization). `dtype` (tokens only): the files' id
# type. `split`: absent = jsonl documents are split by text digest (heldout_fraction), token files
# all go to train; "train" / "heldout" = the whole source goes to that split (held-out sources are
# never trained on). A source's files are listed in the mixture's order (globs expand sorted):
# for a tokens source this order numbers OLMo-core's instances, and a file listed twice is two
# shards (OLMo-core counts every occurrence; a jsonl file listed twice is read once).
JSONL, TOKENS = "jsonl", "tokens"
SOURCE_FORMATS = (JSONL, TOKENS)
TOKEN_FILE_DTYPES = ("uint32", "uint16")
DEFAULT_TOKEN_FILE_DTYPE = "uint32"
SOURCE_SPLITS = (TRAIN, HELDOUT)
# sources.<name>.remainder (tokens sources only): {"tokens": n, "documents": n} — the ids past the
# last whole instance of each file (n mod seq_len; OLMo-core does not train on them either) and the
# documents whose EOS is not in the kept instances (it is among those ids, or the file ends without
# one). Those documents are still counted in their split, so its shards hold documents − remainder
# EOS ids.
REMAINDER_KEY = "remainder"
# The reject reasons of jsonl lines (in the order pipelines.read's checks run; "line_too_long"
# is MAX_LINE_BYTES there).
JSONL_REASONS = (
    "line_too_long",  # longer than MAX_LINE_BYTES: read past, never held (excerpt: its start)
    "invalid_utf8",  # the line's bytes are not UTF-8
    "invalid_json",  # not parseable as JSON
    "not_an_object",  # JSON, but not an object
    "missing_id",
    "id_not_string",
    "id_invalid_unicode",  # id has lone surrogates: it could not be written to rejects/duplicates or shuffled
    "missing_text",
    "text_not_string",
    "empty_text",
    "invalid_unicode",  # text has lone surrogates (\ud800 escapes): not encodable as UTF-8
    "unreadable_file",  # the whole file, as one entry: corrupt/truncated compressed data, or a local
    # path that is no longer a readable regular file when the worker opens it
)
# The reject reasons of token files (one entry per rejected file, in check order). A rejected token
# file counts as ONE document in counts.documents (and one in counts.rejected[reason]), whatever it
# holds: a file that cannot be read, or is not whole ids, has no document count, so the unit of a
# token-file reject is the file.
TOKEN_FILE_REASONS = (
    "bad_token_file_size",  # size is not a multiple of the dtype's item size
    "numpy_header",  # the file starts with a numpy .npy header (np.save): not headerless ids
    "token_id_out_of_range",  # an id ≥ the tokenizer's vocab_size
    "pad_id_in_document",  # the tokenizer's PAD id inside the ids: PAD marks no document (the
    # loader masks it out of the loss and the audit refuses it anywhere but a record's trailing run)
    "unreadable_file",  # the file (or its .csv.gz) cannot be read
    "document_count_mismatch",  # the sibling .csv.gz lists another number of documents
)


def source_format(mixture_source: Mapping[str, Any]) -> str:
    """A mixture source's format ("jsonl" when absent)."""
    return str(mixture_source.get("format") or JSONL)


def read_json_file(path: str, error: type[Exception], hint: str = "") -> Any:
    """The JSON value of the file at `path`: FileNotFoundError when it is absent (with `hint`),
    `error` naming file, line and column when it is not valid JSON."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise FileNotFoundError(f"not found: {path}" + (f" ({hint})" if hint else "")) from None
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"{path}:{e.lineno}: not valid JSON: {e.msg} (column {e.colno})") from None


class ManifestError(Refused, ValueError):
    """A manifest breaks the contract: a missing or malformed field, or a fingerprint mismatch."""


@dataclasses.dataclass(frozen=True)
class TokenizerInfo:
    """The manifest's `tokenizer`: what every record's ids mean."""

    name: str
    vocab_size: int
    eos_id: int
    pad_id: int
    ranks_sha256: str | None = None  # sha256 of the BPE ranks file (None: not a ranks tokenizer)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = "tokenizer") -> TokenizerInfo:
        missing = [k for k in ("name", "vocab_size", "eos_id", "pad_id") if k not in d]
        if missing:
            raise ManifestError("; ".join(f"{where}: missing required field {k!r}" for k in missing))
        return cls(str(d["name"]), int(d["vocab_size"]), int(d["eos_id"]), int(d["pad_id"]), d.get("ranks_sha256"))


@dataclasses.dataclass(frozen=True)
class ShardRef:
    source: str
    split: str
    path: str  # as written in the manifest: relative to the manifest's folder
    abspath: str
    records: int
    sha256: str


def fingerprint(manifest: Mapping[str, Any]) -> str:
    """sha256 of the canonical manifest content (see the module docstring for what is excluded)."""
    body = copy.deepcopy(dict(manifest))
    for key in FINGERPRINT_EXCLUDED_KEYS:
        body.pop(key, None)
    for s in body.get("mixture", {}).get("sources", []):
        s.pop("paths", None)
    canon = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canon.encode("ascii")).hexdigest()


def with_fingerprint(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `manifest` with its `fingerprint` field (re)computed."""
    m = dict(manifest)
    m["fingerprint"] = ""
    m["fingerprint"] = fingerprint(m)
    return m


def dumps(manifest: Mapping[str, Any]) -> bytes:
    """The manifest's bytes on disk (UTF-8 JSON, one-space indent, trailing newline)."""
    raw = manifest.raw if isinstance(manifest, Manifest) else manifest
    return (json.dumps(raw, indent=1, ensure_ascii=False) + "\n").encode("utf-8")


def _is_url(path: str) -> bool:
    return re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", path) is not None


def _resolve(root: str, path: str) -> str:
    """`path` joined to `root` and normalised lexically ('..' folded; symlinks are not looked at:
    the rule is about what the manifest says). URLs (`gs://…`) keep their scheme."""
    if _is_url(path):
        scheme, rest = path.split("://", 1)
        return f"{scheme}://{posixpath.normpath('/' + rest).lstrip('/')}"
    if root and _is_url(root):
        if path.startswith("/"):
            return path  # a local absolute path under a gs:// manifest: never inside it
        return _resolve("", root.rstrip("/") + "/" + path)
    return os.path.normpath(os.path.join(root, path)) if root else os.path.normpath(path)


def _inside(path: str, folder: str) -> bool:
    if folder in ("", "."):  # an in-memory manifest's folder: any path that does not climb out
        return not (os.path.isabs(path) or _is_url(path) or path == ".." or path.startswith(".." + os.sep))
    if path == folder:
        return False  # the folder itself is not a shard inside it
    return path.startswith(folder.rstrip("/" + os.sep) + ("/" if _is_url(folder) else os.sep))


def shard_path_problem(path: Any, root: str, external_roots: Sequence[str] = ()) -> str | None:
    """None when shard `path` (as written in a manifest whose folder is `root`; "" for one built in
    memory) resolves inside `root` or inside one of the manifest's declared `external_roots`
    (EXTERNAL_SHARD_ROOTS); otherwise why not, in a few words."""
    if not isinstance(path, str) or not path:
        return f"shard path {path!r} is not a non-empty string"
    full = _resolve(root, path)
    folders = [_resolve(root, ".") if root else ""] + [_resolve(root, r) for r in external_roots]
    if any(_inside(full, f) for f in folders):
        return None
    where = f"the manifest's folder {root}" if root else "the manifest's folder"
    return (
        f"shard path {path!r} resolves outside {where} (to {full}); a manifest that reads shards "
        f"from elsewhere lists those folders in {EXTERNAL_SHARD_ROOTS!r}"
    )


def _shard_paths_problems(raw: Mapping[str, Any], where: str, root: str, p: list[str]) -> None:
    """Every shard path must resolve inside the manifest's folder or a declared external root; one
    problem line for the first path that does not (in reading order) and how many others do not."""
    roots = raw.get(EXTERNAL_SHARD_ROOTS, [])
    if not (isinstance(roots, list) and all(isinstance(r, str) and r for r in roots)):
        p.append(f"{where}: {EXTERNAL_SHARD_ROOTS} must be a list of folder paths, got {roots!r}")
        return
    bad = []
    for entry in raw["sources"].values():
        for split in SPLITS:
            for sh in entry["splits"][split]["shards"]:
                problem = shard_path_problem(sh.get("path"), root, roots)
                if problem:
                    bad.append(problem)
    if bad:
        more = f" (and {len(bad) - 1} more shard paths)" if len(bad) > 1 else ""
        p.append(f"{where}: {bad[0]}{more}")


def _require(d: Any, key: str, where: str, problems: list[str]) -> Any:
    if not isinstance(d, Mapping) or key not in d:
        problems.append(f"{where}: missing required field {key!r}")
        return None
    return d[key]


def validate(raw: Any, where: str = MANIFEST_NAME, check_fingerprint: bool = True, root: str = "") -> None:
    """Raises ManifestError listing every contract violation of parsed manifest JSON `raw`; `root`:
    the manifest's folder ("": built in memory), inside which its shard paths must resolve."""
    if not isinstance(raw, Mapping):
        raise ManifestError(f"{where}: a manifest is a JSON object, got {type(raw).__name__}")
    p: list[str] = []
    version = _require(raw, "format_version", where, p)
    if version is not None and version != FORMAT_VERSION:
        p.append(f"{where}: format_version {version!r} unsupported (this code reads {FORMAT_VERSION})")
    fmt = _require(raw, "record_format", where, p)
    if fmt is not None and fmt != RECORD_FORMAT:
        p.append(f"{where}: record_format {fmt!r}, expected {RECORD_FORMAT!r}")
    seq_len = _require(raw, "seq_len", where, p)
    if seq_len is not None and (not isinstance(seq_len, int) or isinstance(seq_len, bool) or seq_len <= 0):
        p.append(f"{where}: seq_len must be a positive int, got {seq_len!r}")
    tok = _require(raw, "tokenizer", where, p)
    if tok is not None:
        for k in ("name", "vocab_size", "eos_id", "pad_id"):
            _require(tok, k, f"{where}: tokenizer", p)
    fp = _require(raw, "fingerprint", where, p)
    mixture = raw.get("mixture", {})
    mix_names = {s.get("name") for s in mixture.get("sources", []) if isinstance(s, Mapping)}
    sources = _require(raw, "sources", where, p)
    if sources is not None and not isinstance(sources, Mapping):
        p.append(f"{where}: sources must be an object {{name: entry}}")
        sources = None
    for name, entry in (sources or {}).items():
        w = f"{where}: sources.{name}"
        counts = _require(entry, "counts", w, p)
        if counts is not None:
            for key in COUNT_KEYS:
                _require(counts, key, f"{w}.counts", p)
        splits = _require(entry, "splits", w, p)
        for split in SPLITS if isinstance(splits, Mapping) else ():
            info = _require(splits, split, f"{w}.splits", p)
            if info is None:
                continue
            _require(info, "examples", f"{w}.splits.{split}", p)
            for i, sh in enumerate(_require(info, "shards", f"{w}.splits.{split}", p) or []):
                for k in ("path", "records", "sha256"):
                    _require(sh, k, f"{w}.splits.{split}.shards[{i}]", p)
        if "mixture" in raw and name not in mix_names:
            p.append(f"{w}: not in the mixture's sources")
        rem = entry.get(REMAINDER_KEY) if isinstance(entry, Mapping) else None
        if rem is not None and not (isinstance(rem, Mapping) and {"tokens", "documents"} <= set(rem)):
            p.append(f"{w}.{REMAINDER_KEY}: must be {{tokens, documents}}, got {rem!r}")
    # The plan (and so OLMo-core's instance numbering) reads sources in the order of `sources`, a
    # JSON object whose key order the fingerprint does not see (sorted keys): it must be the order
    # of the mixture's source list, which the fingerprint does cover.
    listed = [s.get("name") for s in mixture.get("sources", []) if isinstance(s, Mapping)]
    listed = [n for n in listed if n in (sources or {})]
    if "mixture" in raw and sources and set(listed) == set(sources) and list(sources) != listed:
        p.append(
            f"{where}: sources are in the order {list(sources)} but the mixture lists {listed}: the "
            "data order follows the sources' order, which the fingerprint (sorted keys) does not cover, "
            "so it must be the mixture's; the manifest was reordered after it was written"
        )
    for i, s in enumerate(mixture.get("sources", []) if isinstance(mixture, Mapping) else []):
        if not isinstance(s, Mapping):
            continue
        if source_format(s) not in SOURCE_FORMATS:
            p.append(f"{where}: mixture.sources[{i}].format {s.get('format')!r} not in {SOURCE_FORMATS}")
        if s.get("dtype") is not None and s["dtype"] not in TOKEN_FILE_DTYPES:
            p.append(f"{where}: mixture.sources[{i}].dtype {s['dtype']!r} not in {TOKEN_FILE_DTYPES}")
        if s.get("split") is not None and s["split"] not in SOURCE_SPLITS:
            p.append(f"{where}: mixture.sources[{i}].split {s['split']!r} not in {SOURCE_SPLITS}")
    if not p:
        _shard_paths_problems(raw, where, root, p)
    if not p and check_fingerprint and fp != fingerprint(raw):
        p.append(
            f"{where}: fingerprint {str(fp)[:16]}… does not match the manifest's content "
            f"({fingerprint(raw)[:16]}…): the manifest was edited after it was written, or "
            "written by something that does not follow the contract"
        )
    if p:
        raise ManifestError("; ".join(p))


def _manifest_root(path: str) -> str:
    """The folder of the manifest at `path` ("" when built in memory; a gs:// prefix stays one)."""
    if not path:
        return ""
    if _is_url(path):
        return path.rsplit("/", 1)[0]
    return os.path.dirname(os.path.abspath(path))


@dataclasses.dataclass(frozen=True, eq=False)
class Manifest(Mapping):
    """A validated manifest. Typed fields for what code relies on; `raw` is the parsed JSON and
    the object is also a read-only Mapping over it (`m["sources"]`, `m.get("mixture")`).

    path: where it was read from ("" when built in memory); root: its folder (shard paths are
    relative to it)."""

    raw: dict[str, Any]
    path: str = ""
    root: str = ""

    # -- construction
    @classmethod
    def from_json(cls, raw: Mapping[str, Any], path: str = "", check_fingerprint: bool = True) -> Manifest:
        root = _manifest_root(path)
        validate(raw, path or MANIFEST_NAME, check_fingerprint, root)
        return cls(dict(raw), path, root)

    @classmethod
    def load(cls, path: str, check_fingerprint: bool = True) -> Manifest:
        """Reads and validates `path`; raises FileNotFoundError or ManifestError (naming the file)."""
        raw = read_json_file(path, ManifestError, "run `python -m pipelines.tokenize`?")
        return cls.from_json(raw, path, check_fingerprint)

    def dump(self) -> bytes:
        return dumps(self.raw)

    # -- Mapping over the raw JSON
    def __getitem__(self, key: str) -> Any:
        return self.raw[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.raw)

    def __len__(self) -> int:
        return len(self.raw)

    # -- typed view
    @property
    def seq_len(self) -> int:
        return int(self.raw["seq_len"])

    @property
    def tokenizer(self) -> TokenizerInfo:
        return TokenizerInfo.from_json(self.raw["tokenizer"])

    @property
    def vocab_size(self) -> int:
        return int(self.raw["tokenizer"]["vocab_size"])

    @property
    def eos_id(self) -> int:
        return int(self.raw["tokenizer"]["eos_id"])

    @property
    def pad_id(self) -> int:
        return int(self.raw["tokenizer"]["pad_id"])

    @property
    def tokenizer_name(self) -> str:
        return str(self.raw["tokenizer"]["name"])

    @property
    def fingerprint(self) -> str:
        return str(self.raw["fingerprint"])

    @property
    def source_names(self) -> tuple[str, ...]:
        return tuple(self.raw["sources"])

    @property
    def build(self) -> dict[str, Any] | None:
        return self.raw.get("build")

    def source(self, name: str) -> dict[str, Any]:
        return self.raw["sources"][name]

    def mixture_sources(self) -> list[dict[str, Any]]:
        return list(self.raw.get("mixture", {}).get("sources", []))

    def shards(self, split: str, source: str | None = None) -> list[ShardRef]:
        """The split's shards in reading order (one source, or every source in manifest order)."""
        names = self.source_names if source is None else (source,)
        out = []
        for name in names:
            entry = self.source(name)["splits"].get(split, {})
            for shard in entry.get("shards", []):
                out.append(
                    ShardRef(
                        name,
                        split,
                        shard["path"],
                        os.path.join(self.root, shard["path"]),
                        int(shard["records"]),
                        shard["sha256"],
                    )
                )
        return out
