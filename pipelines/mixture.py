"""Mixture files (data_manifests/mixtures/*.yaml) → typed, validated config; glob expansion.

A mixture names the tokenizer, example length, seed, held-out fraction, dedup switch and a
list of sources `{name, paths: [globs], weight, max_repetition, format, dtype, split}`
(`format: tokens` + `dtype` for OLMo-core token files, `split: heldout` for a held-out-only
source: see pipelines.contract.manifest). `weight` is the target share of training tokens (the
loader's plan uses it; this job records it). Paths are globs on any Beam filesystem;
`sample://REL` points into the embedded sample built at run time. A source's files keep the
mixture's order: its patterns as listed, each glob expanded sorted (for token files that order
numbers OLMo-core's instances).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from apache_beam.io.filesystems import FileSystems

from pipelines.contract.manifest import (DEFAULT_TOKEN_FILE_DTYPE, HELDOUT, JSONL, SOURCE_FORMATS, SOURCE_SPLITS,
                                         TOKEN_FILE_DTYPES, TOKENS)

SAMPLE_SCHEME = "sample://"
DEFAULT_MIXTURE = Path(__file__).resolve().parents[1] / "data_manifests" / "mixtures" / "sample.yaml"
# Source names become folder names and must not collide with the job's own folders.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
RESERVED_NAMES = frozenset({"rejects", "duplicates", "manifest.json"})
_TOP_KEYS = {"name", "tokenizer", "seq_len", "seed", "heldout_fraction", "dedup", "sources"}
_SOURCE_KEYS = {"name", "paths", "weight", "max_repetition", "format", "dtype", "split"}


class MixtureError(ValueError):
    """A mixture file is malformed."""


@dataclass(frozen=True)
class SourceSpec:
    name: str
    paths: tuple[str, ...]
    weight: float
    max_repetition: float | None = None
    format: str = JSONL
    dtype: str | None = None   # tokens sources: the files' id type (None: jsonl)
    split: str | None = None   # None: jsonl split by digest, tokens all train; else the whole source

    def extras(self) -> dict[str, Any]:
        """The non-default format/dtype/split keys (absent for a plain jsonl source, so that its
        manifest is unchanged)."""
        out: dict[str, Any] = {}
        if self.format != JSONL:
            out.update(format=self.format, dtype=self.dtype)
        if self.split is not None:
            out["split"] = self.split
        return out


@dataclass(frozen=True)
class Mixture:
    name: str
    tokenizer: str
    seq_len: int
    seed: int
    heldout_fraction: float
    dedup: bool
    sources: tuple[SourceSpec, ...]
    # file lists per source after glob expansion (source order, sorted paths); empty until resolved
    files: tuple[tuple[str, ...], ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """The mixture as resolved (globs expanded when `files` is set), JSON-able."""
        sources = []
        for i, s in enumerate(self.sources):
            paths = list(self.files[i]) if self.files else list(s.paths)
            sources.append(
                {"name": s.name, "paths": paths, "weight": s.weight, "max_repetition": s.max_repetition,
                 **s.extras()}
            )
        return {
            "name": self.name,
            "tokenizer": self.tokenizer,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "heldout_fraction": self.heldout_fraction,
            "dedup": self.dedup,
            "sources": sources,
        }


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise MixtureError(msg)


def parse_mixture(raw: Any, where: str = "<mixture>") -> Mixture:
    """Validate a parsed YAML document and build a `Mixture` (clear errors on bad input)."""
    _need(isinstance(raw, dict), f"{where}: expected a mapping at the top level")
    unknown = set(raw) - _TOP_KEYS
    _need(not unknown, f"{where}: unknown keys {sorted(unknown)}")
    missing = {"name", "tokenizer", "seq_len", "seed", "heldout_fraction", "dedup", "sources"} - set(raw)
    _need(not missing, f"{where}: missing keys {sorted(missing)}")
    seq_len, seed, frac = raw["seq_len"], raw["seed"], raw["heldout_fraction"]
    _need(isinstance(seq_len, int) and not isinstance(seq_len, bool) and seq_len > 0, f"{where}: seq_len must be a positive int")
    _need(isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0, f"{where}: seed must be a non-negative int")
    _need(isinstance(frac, (int, float)) and not isinstance(frac, bool) and 0 <= frac < 1, f"{where}: heldout_fraction must be in [0, 1)")
    _need(isinstance(raw["dedup"], bool), f"{where}: dedup must be true or false")
    _need(isinstance(raw["name"], str) and raw["name"], f"{where}: name must be a non-empty string")
    _need(isinstance(raw["tokenizer"], str), f"{where}: tokenizer must be a string")
    srcs = raw["sources"]
    _need(isinstance(srcs, list) and srcs, f"{where}: sources must be a non-empty list")
    sources = []
    for i, s in enumerate(srcs):
        at = f"{where}: sources[{i}]"
        _need(isinstance(s, dict), f"{at}: expected a mapping")
        unknown = set(s) - _SOURCE_KEYS
        _need(not unknown, f"{at}: unknown keys {sorted(unknown)}")
        name = s.get("name")
        _need(isinstance(name, str) and bool(_NAME_RE.match(name)) and name not in RESERVED_NAMES,
              f"{at}: name must match {_NAME_RE.pattern} and not be one of {sorted(RESERVED_NAMES)}")
        paths = s.get("paths")
        _need(isinstance(paths, list) and paths and all(isinstance(p, str) and p for p in paths),
              f"{at} ({name}): paths must be a non-empty list of strings")
        weight = s.get("weight")
        _need(isinstance(weight, (int, float)) and not isinstance(weight, bool) and math.isfinite(weight) and weight > 0,
              f"{at} ({name}): weight must be a positive number")
        rep = s.get("max_repetition")
        _need(rep is None or (isinstance(rep, (int, float)) and not isinstance(rep, bool) and rep > 0),
              f"{at} ({name}): max_repetition must be a positive number when given")
        fmt = s.get("format", JSONL)
        _need(fmt in SOURCE_FORMATS, f"{at} ({name}): format must be one of {SOURCE_FORMATS}, got {fmt!r}")
        dtype = s.get("dtype")
        _need(dtype is None or (fmt == TOKENS and dtype in TOKEN_FILE_DTYPES),
              f"{at} ({name}): dtype is for format: tokens and must be one of {TOKEN_FILE_DTYPES}, got {dtype!r}")
        split = s.get("split")
        _need(split is None or split in SOURCE_SPLITS, f"{at} ({name}): split must be one of {SOURCE_SPLITS}")
        sources.append(SourceSpec(name, tuple(paths), float(weight), None if rep is None else float(rep),
                                  fmt, (dtype or DEFAULT_TOKEN_FILE_DTYPE) if fmt == TOKENS else None, split))
    names = [s.name for s in sources]
    _need(len(set(names)) == len(names), f"{where}: duplicate source names in {names}")
    # Copies of a held-out jsonl source's documents in other jsonl sources must be removed (dedup
    # keeps the held-out copy), or they would reach training.
    jsonl = [s for s in sources if s.format == JSONL]
    _need(raw["dedup"] or not any(s.split == HELDOUT for s in jsonl) or len(jsonl) == 1,
          f"{where}: a jsonl source with split: heldout needs dedup: true (so that copies of its "
          "documents in other sources never reach training)")
    return Mixture(
        name=raw["name"], tokenizer=raw["tokenizer"], seq_len=seq_len, seed=seed,
        heldout_fraction=float(frac), dedup=raw["dedup"], sources=tuple(sources),
    )


def load_mixture(path: str | Path) -> Mixture:
    """Read a mixture YAML from any Beam filesystem."""
    with FileSystems.open(str(path)) as f:
        raw = yaml.safe_load(f.read().decode("utf-8"))
    return parse_mixture(raw, where=str(path))


def expand_pattern(pattern: str) -> list[str]:
    """All files a glob matches (sorted); a pattern matching nothing is an error."""
    [result] = FileSystems.match([pattern])
    files = sorted(m.path for m in result.metadata_list)
    if not files:
        raise MixtureError(f"pattern {pattern!r} matched no files")
    return files


def resolve(mixture: Mixture, sample_dir: str | None = None) -> Mixture:
    """Expand every source's globs; each file must belong to exactly one source.

    `sample://REL` patterns are rewritten under `sample_dir` (required when they occur).
    """
    owner: dict[str, str] = {}
    files = []
    for s in mixture.sources:
        found: list[str] = []
        for pattern in s.paths:
            if pattern.startswith(SAMPLE_SCHEME):
                if sample_dir is None:
                    raise MixtureError(f"source {s.name}: {pattern} needs the embedded sample directory")
                pattern = FileSystems.join(sample_dir, pattern[len(SAMPLE_SCHEME):])
            for path in expand_pattern(pattern):
                prev = owner.setdefault(path, s.name)
                if prev != s.name:
                    raise MixtureError(f"file {path} is matched by sources {prev!r} and {s.name!r}")
                if path not in found:
                    found.append(path)
        files.append(tuple(found))  # listed order: patterns as listed, each glob sorted
    return Mixture(**{**mixture.__dict__, "files": tuple(files)})


def uses_sample(mixture: Mixture) -> bool:
    return any(p.startswith(SAMPLE_SCHEME) for s in mixture.sources for p in s.paths)


def _from_olmo_mix_cli(argv: list[str]) -> int:
    """`python -m pipelines.mixture from-olmo-mix MIX.txt --root URI [...] > mixture.yaml`."""
    import argparse
    import os
    import sys

    from pipelines import olmo_mix

    ap = argparse.ArgumentParser(prog="python -m pipelines.mixture from-olmo-mix",
                                 description="OLMo-core mix file → mixture YAML of format: tokens sources "
                                             "(labels become sources, in order)")
    ap.add_argument("mix", help="an OLMo-core mix file (olmo_core/data/mixes/*.txt)")
    ap.add_argument("--root", required=True, help="where the mix's relative paths live (e.g. gs://BUCKET/ai2-llm)")
    ap.add_argument("--tokenizer", default=olmo_mix.DEFAULT_TOKENIZER_ID, help="replaces {TOKENIZER} (default: %(default)s)")
    ap.add_argument("--name", help="mixture name (default: the mix file's name)")
    ap.add_argument("--seq-len", type=int, default=olmo_mix.DEFAULT_SEQ_LEN)
    args = ap.parse_args(argv)
    with open(args.mix, encoding="utf-8") as f:
        text = f.read()
    base = os.path.basename(args.mix)
    mixture = olmo_mix.mixture_from_olmo_mix(text, args.root, tokenizer_id=args.tokenizer,
                                             name=args.name or base.removesuffix(".txt"),
                                             seq_len=args.seq_len, where=args.mix)
    parse_mixture(mixture, where="generated mixture")  # what we print, the job accepts
    n_files = sum(len(s["paths"]) for s in mixture["sources"])
    header = (f"Generated by `python -m pipelines.mixture from-olmo-mix {base} --root {args.root} "
              f"--tokenizer {args.tokenizer}`\nfrom OLMo-core's {base}: {len(mixture['sources'])} sources, "
              f"{n_files} token files, in the mix file's line order\n(which numbers OLMo-core's instances: "
              "train with data_order: olmo-core; weights do not apply then).")
    sys.stdout.write(olmo_mix.to_yaml(mixture, header))
    return 0


if __name__ == "__main__":
    import sys

    if len(sys.argv) < 2 or sys.argv[1] != "from-olmo-mix":
        sys.exit("usage: python -m pipelines.mixture from-olmo-mix MIX.txt --root URI [--tokenizer ID] > mixture.yaml")
    sys.exit(_from_olmo_mix_cli(sys.argv[2:]))
