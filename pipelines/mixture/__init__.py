"""Mixture files (data_manifests/mixtures/*.yaml) → typed, validated config; glob expansion.

A mixture names the tokenizer, example length, seed, held-out fraction, dedup switch and a
list of sources `{name, paths: [globs], weight, max_repetition, format, dtype, split}`
(`format: tokens` + `dtype` for OLMo-core token files, `split: heldout` for a held-out-only
source: see contract.manifest). `weight` is the target share of training tokens (the
loader's plan uses it; this job records it). Paths are globs on any Beam filesystem;
`sample://REL` points into the embedded sample built at run time. A source's files keep the
mixture's order: its patterns as listed, each glob expanded sorted (for token files that order
numbers OLMo-core's instances, and a token file listed twice is read twice, as OLMo-core does).
Optionally the encoder engine (`tokenizer_engine`: quicktok, gigatoken or tiktoken) and the share of
documents cross-checked against tiktoken (`tokenizer_crosscheck`: a number in [0, 1] or "all").
Those two say how the ids are computed, not what they are, so they stay out of `to_dict` (and
the manifest's fingerprint); the manifest records them under `build`. `packing: {method:
best_fit, window: 256}` packs by best-fit decreasing (pipelines.bestfit) instead of
concat-and-chunk (the default, `method: concat`); it changes the data, so `to_dict` (and the
manifest's fingerprint) records it, and only it: a concat-and-chunk manifest is unchanged.
`shard_compression: zstd:1|snappy|uncompressed` (pipelines.shards.SHARD_COMPRESSIONS; default
zstd:1) is how the shards' chunks are compressed: the same records, other bytes, so `to_dict` (and
the fingerprint) records it when it is not the default (a default manifest is unchanged).

`python -m pipelines.mixture from-olmo-mix` (`__main__.py`) writes a mixture of token files from an
OLMo-core mix file.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar

import numpy as np
import yaml
from apache_beam.io.filesystem import BeamIOError
from apache_beam.io.filesystems import FileSystems
from pydantic import BeforeValidator, Field, model_validator

from contract import config_model
from contract.config_model import Int, Number, OptNumber, check, one_of, refuse, yaml12_floats
from contract.errors import Refused, yaml_error_line
from contract.manifest import (
    DEFAULT_TOKEN_FILE_DTYPE,
    HELDOUT,
    JSONL,
    RESERVED_NAMES,
    SOURCE_FORMATS,
    SOURCE_NAME_RE,
    SOURCE_SPLITS,
    TOKEN_FILE_DTYPES,
    TOKENS,
    valid_source_name,
)
from pipelines.bestfit import BEST_FIT, CONCAT, DEFAULT_WINDOW
from pipelines.dolma2_tokenizer import ENGINES, TOKENIZERS, check_engine_fits, vocabulary
from pipelines.shards import DEFAULT_SHARD_COMPRESSION, SHARD_COMPRESSIONS
from pipelines.token_bestfit import TIES as PACKING_TIES
from pipelines.token_bestfit import TRUNCATE

SAMPLE_SCHEME = "sample://"
DEFAULT_MIXTURE = Path(__file__).resolve().parents[2] / "data_manifests" / "mixtures" / "sample.yaml"
# Longest example the job accepts, in tokens: 16x the longest context OLMo 3 trains on (65,536 in
# its long-context stage). An example is seq_len·4 bytes (4 MiB here) and a worker holds about two
# of them per shard it writes (the packer's carry plus the example being cut), so a typo such as
# an extra zero fails here, before the job runs, instead of as a MemoryError inside it.
MAX_SEQ_LEN = 1 << 20
MAX_WINDOW_TOKENS = 1 << 28  # best-fit packing buffers window·seq_len tokens per split: 1 GiB at most


class MixtureError(Refused, ValueError):
    """A mixture file is malformed."""


@dataclass(frozen=True)
class SourceSpec:
    name: str
    paths: tuple[str, ...]
    weight: float
    max_repetition: float | None = None
    format: str = JSONL
    dtype: str | None = None  # tokens sources: the files' id type (None: jsonl)
    split: str | None = None  # None: jsonl split by digest, tokens all train; else the whole source

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
class Decontaminate:
    """`decontaminate: {tasks: DIR, threshold: 0.8, mode: decon}`: training documents that contain
    an instance of a task in DIR (a `pipelines.downstream_tasks` folder) are rejected with reason
    `contaminated:<task>` (pipelines/leakage/detect.py; threshold and mode as the audit's
    --eval-leakage-threshold / --eval-leakage-mode, decon's defaults)."""

    tasks: str
    threshold: float = 0.8
    mode: str = "decon"


@dataclass(frozen=True)
class Packing:
    """`packing: {method: best_fit, window: 256}`: pack the jsonl sources' documents by best-fit
    decreasing over windows of `window` sequences (`pipelines.bestfit`, OLMo 3's long-context
    stage) instead of concat-and-chunk (the default, absent from the manifest: stages 1-2)."""

    method: str = BEST_FIT
    window: int = DEFAULT_WINDOW
    # token-file sources: files packed together (OLMo-core's source_group_size); None when the
    # mixture has no token files (then absent from the manifest, as before)
    group: int | None = None
    # token files: equal lengths in stream order ("stable") or as OLMo-core's argsort ("numpy")
    ties: str | None = None


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
    tokenizer_engine: str | None = None  # None: the job's default (pipelines.dolma2_tokenizer.DEFAULT_ENGINE)
    tokenizer_crosscheck: float | str | None = None  # None: the default share; "all": every document
    decontaminate: Decontaminate | None = None  # None: no eval-leakage removal
    packing: Packing | None = None  # None: concat-and-chunk
    shard_compression: str | None = None  # None: DEFAULT_SHARD_COMPRESSION (zstd:1)

    def to_dict(self) -> dict[str, Any]:
        """The mixture as resolved (globs expanded when `files` is set), JSON-able."""
        sources = []
        for i, s in enumerate(self.sources):
            paths = list(self.files[i]) if self.files else list(s.paths)
            sources.append(
                {"name": s.name, "paths": paths, "weight": s.weight, "max_repetition": s.max_repetition, **s.extras()}
            )
        out = {
            "name": self.name,
            "tokenizer": self.tokenizer,
            "seq_len": self.seq_len,
            "seed": self.seed,
            "heldout_fraction": self.heldout_fraction,
            "dedup": self.dedup,
            "sources": sources,
        }
        if self.packing is not None:  # the manifest states it (concat-and-chunk manifests are unchanged)
            packing: dict[str, Any] = {"method": self.packing.method, "window": self.packing.window}
            if self.packing.group is not None:  # token files: groups of files, long documents truncated
                packing.update(group=self.packing.group, long_docs=TRUNCATE, ties=self.packing.ties)
                if self.packing.ties == "numpy":  # its order among equal lengths is the machine's
                    packing.update(numpy=np.__version__)
            out["packing"] = packing
        if self.shard_compression is not None:  # other shard bytes: stated (default manifests are unchanged)
            out["shard_compression"] = self.shard_compression
        return out


def _bad_strings(x: Any, at: str = "", seen: set[int] | None = None) -> list[str]:
    """Where `x` holds a string (key or value) that is not encodable as UTF-8 (lone surrogates,
    which YAML's "\\ud800" escapes produce): it would crash the manifest writer at the job's end.
    Each container is visited once (YAML aliases share them: no exponential walk)."""
    seen = set() if seen is None else seen
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return [at or "<top>"]
        return []
    if isinstance(x, (dict, list)):
        if id(x) in seen:
            return []
        seen.add(id(x))
    if isinstance(x, dict):
        return [
            b for k, v in x.items() for b in _bad_strings(k, f"{at}.<key>", seen) + _bad_strings(v, f"{at}.{k!r}", seen)
        ]
    if isinstance(x, list):
        return [b for i, v in enumerate(x) for b in _bad_strings(v, f"{at}[{i}]", seen)]
    return []


class _DecontaminateModel(config_model.Model):
    error_class: ClassVar[type[Refused]] = MixtureError
    tasks: str = Field(min_length=1, description="a task folder's path")
    threshold: Number = 0.8
    mode: str = "decon"

    @model_validator(mode="after")
    def _detector(self) -> _DecontaminateModel:
        from pipelines.leakage import DetectorConfig  # the detector's module, only when removal is asked

        try:
            DetectorConfig(mode=self.mode, threshold=self.threshold)
        except (ValueError, TypeError) as e:
            raise refuse(f"decontaminate: {e}") from None
        return self


class _PackingModel(config_model.Model):
    error_class: ClassVar[type[Refused]] = MixtureError
    method: Annotated[str, one_of([BEST_FIT, CONCAT])]
    window: Int = Field(default=DEFAULT_WINDOW, gt=0, le=1 << 16, description="an int in [1, 65536] (sequences)")
    group: Int | None = Field(
        default=None, gt=0, le=1 << 10, description="an int in [1, 1024] (token files packed together)"
    )
    long_docs: Annotated[str | None, one_of([TRUNCATE])] = None
    ties: Annotated[str | None, one_of(list(PACKING_TIES))] = None


class _SourceModel(config_model.Model):
    error_class: ClassVar[type[Refused]] = MixtureError
    name: Annotated[str, check(valid_source_name)] = Field(
        description=f"a name matching {SOURCE_NAME_RE.pattern} in full, not one of {sorted(RESERVED_NAMES)} (in any case)"
    )
    paths: list[Annotated[str, Field(min_length=1)]] = Field(min_length=1)
    weight: Number = Field(gt=0, description="a positive number")
    max_repetition: OptNumber = Field(
        None, gt=0, description="a positive finite number when given (omit it for no limit)"
    )
    format: Annotated[str, one_of(SOURCE_FORMATS)] = JSONL
    dtype: Annotated[str | None, one_of(TOKEN_FILE_DTYPES)] = None
    split: Annotated[str | None, one_of(SOURCE_SPLITS)] = None

    @model_validator(mode="after")
    def _dtype_for_tokens(self) -> _SourceModel:
        if self.dtype is not None and self.format != TOKENS:
            raise refuse(f"source {self.name}: dtype is for format: tokens (this source is {self.format})")
        return self


def _crosscheck(value: Any) -> Any:
    if isinstance(value, str) and value != "all":  # a number in the file is no string (the flag's is)
        raise refuse(f"tokenizer_crosscheck={value!r} is a string: a share in [0, 1] is written unquoted, or 'all'")
    try:
        return parse_crosscheck(value)
    except ValueError as e:
        raise refuse(str(e)) from None


class _MixtureModel(config_model.Model):
    """A mixture file as validated (the strict types and one-line errors of the project's configs);
    `parse_mixture` turns it into the `Mixture` the job uses."""

    error_class: ClassVar[type[Refused]] = MixtureError
    name: str = Field(min_length=1, description="a non-empty string")
    tokenizer: Annotated[str, one_of(sorted(TOKENIZERS))]
    seq_len: Int = Field(
        gt=0,
        le=MAX_SEQ_LEN,
        description=f"an int in [1, {MAX_SEQ_LEN}] (an example is seq_len·4 bytes; OLMo 3's longest context is 65536)",
    )
    seed: Int = Field(ge=0, description="a non-negative int")
    heldout_fraction: Number = Field(ge=0, lt=1, description="in [0, 1)")
    dedup: bool
    sources: list[_SourceModel] = Field(min_length=1)
    tokenizer_engine: Annotated[str | None, one_of(sorted(ENGINES))] = None
    tokenizer_crosscheck: Annotated[Any, BeforeValidator(_crosscheck)] = None
    decontaminate: _DecontaminateModel | None = None
    packing: _PackingModel | None = None
    shard_compression: Annotated[str | None, one_of(SHARD_COMPRESSIONS)] = None

    @model_validator(mode="after")
    def _across_fields(self) -> _MixtureModel:
        self._check_token_packing()
        if self.packing is not None and self.packing.window * self.seq_len > MAX_WINDOW_TOKENS:
            raise refuse(
                f"packing: window {self.packing.window} × seq_len {self.seq_len} tokens is more than "
                f"{MAX_WINDOW_TOKENS} (a worker holds one window per split it writes, 4 bytes a token)"
            )
        if self.tokenizer_engine is not None:
            try:
                check_engine_fits(self.tokenizer_engine, vocabulary(self.tokenizer))
            except ValueError as e:
                raise refuse(str(e)) from None
        top_id = vocabulary(self.tokenizer).vocab_size - 1
        for i, s in enumerate(self.sources):
            if s.format == TOKENS:  # a narrower dtype would read each id as garbage ids, never an error
                dtype = s.dtype or DEFAULT_TOKEN_FILE_DTYPE
                top = int(np.iinfo(np.dtype(dtype)).max)
                if top < top_id:
                    raise refuse(
                        f"sources[{i}] ({s.name}): dtype {dtype} cannot hold {self.tokenizer}'s ids (up to "
                        f"{top_id}, e.g. its EOS; {dtype} stops at {top}): its token files are uint32"
                    )
        names = [s.name for s in self.sources]
        if len({n.casefold() for n in names}) != len(names):
            raise refuse(f"duplicate source names (ignoring case: they are folder names) in {names}")
        # Copies of a held-out jsonl source's documents in other jsonl sources must be removed (dedup
        # keeps the held-out copy), or they would reach training.
        jsonl = [s for s in self.sources if s.format == JSONL]
        if not self.dedup and any(s.split == HELDOUT for s in jsonl) and len(jsonl) > 1:
            raise refuse(
                "a jsonl source with split: heldout needs dedup: true (so that copies of its "
                "documents in other sources never reach training)"
            )
        return self

    def _check_token_packing(self) -> None:
        """Best-fit with token files: train sources only (a held-out file is read whole, one
        document per padded instance), in groups of `group` files, long documents truncated."""
        tokens = [s for s in self.sources if s.format == TOKENS]
        pk = self.packing
        if pk is None or pk.method != BEST_FIT:
            if pk is not None and (pk.group is not None or pk.long_docs is not None or pk.ties is not None):
                raise refuse("packing: group, long_docs and ties are for method best_fit")
            return
        if not tokens and (pk.group is not None or pk.long_docs is not None or pk.ties is not None):
            raise refuse(
                "packing: group, long_docs and ties are for token files (format: tokens); this mixture has none"
            )
        held = [s.name for s in tokens if s.split == HELDOUT]
        if held:
            raise refuse(f"packing: best_fit packs training token files; {held} are held out (converted whole)")


def parse_mixture(raw: Any, where: str = "<mixture>") -> Mixture:
    """Validate a parsed YAML document and build a `Mixture`; bad input is one MixtureError line
    that starts with `where` and names the key."""
    bad = _bad_strings(raw)
    if bad:
        raise MixtureError(f"{where}: strings that are not valid Unicode (lone surrogates) at {bad}")
    try:
        m = config_model.build(_MixtureModel, raw)
    except MixtureError as e:
        raise MixtureError(f"{where}: {e}") from None
    sources = tuple(
        SourceSpec(
            s.name,
            tuple(s.paths),
            s.weight,
            s.max_repetition,
            s.format,
            (s.dtype or DEFAULT_TOKEN_FILE_DTYPE) if s.format == TOKENS else None,
            s.split,
        )
        for s in m.sources
    )
    decon = m.decontaminate
    return Mixture(
        name=m.name,
        tokenizer=m.tokenizer,
        seq_len=m.seq_len,
        seed=m.seed,
        heldout_fraction=m.heldout_fraction,
        dedup=m.dedup,
        sources=sources,
        tokenizer_engine=m.tokenizer_engine,
        tokenizer_crosscheck=m.tokenizer_crosscheck,
        decontaminate=None if decon is None else Decontaminate(decon.tasks, decon.threshold, decon.mode),
        packing=_packing(m),
        # the default written out is the default: the same shards, the same manifest
        shard_compression=None if m.shard_compression == DEFAULT_SHARD_COMPRESSION else m.shard_compression,
    )


def _packing(m: _MixtureModel) -> Packing | None:
    if m.packing is None or m.packing.method != BEST_FIT:
        return None
    tokens = any(s.format == TOKENS for s in m.sources)
    if not tokens:
        return Packing(BEST_FIT, m.packing.window)
    return Packing(BEST_FIT, m.packing.window, m.packing.group or 1, m.packing.ties or PACKING_TIES[0])


def parse_crosscheck(value: Any) -> float | str | None:
    """A cross-check rate: None (default), "all", or a share in [0, 1] (number or numeric string)."""
    if value is None or value == "all":
        return value
    if isinstance(value, bool):
        raise ValueError(f"tokenizer_crosscheck must be a share in [0, 1] or 'all', got {value!r}")
    try:
        rate = float(value)
    except (TypeError, ValueError):
        rate = math.nan
    if not 0 <= rate <= 1:  # also refuses NaN
        raise ValueError(f"tokenizer_crosscheck must be a share in [0, 1] or 'all', got {value!r}")
    return rate


@yaml12_floats  # `3e-4` is a float (the mixture's numbers are strict: no string is one)
class _UniqueKeyLoader(config_model.UniqueKeyLoader):
    error_class = MixtureError


def parse_yaml(text: str, where: str) -> Any:
    """YAML text → Python objects (safe types only); duplicate keys are an error with their line."""
    loader = _UniqueKeyLoader(text)
    loader.name = where
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def load_mixture(path: str | Path) -> Mixture:
    """Read a mixture YAML from any Beam filesystem."""
    try:
        with FileSystems.open(str(path)) as f:
            data = f.read()
    except (OSError, BeamIOError) as e:
        raise MixtureError(f"cannot read the mixture file {path}: {e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MixtureError(f"{path}: not UTF-8 text ({e})") from None
    try:
        raw = parse_yaml(text, str(path))
    except yaml.YAMLError as e:
        raise MixtureError(f"{path}: not valid YAML: {yaml_error_line(e)}") from None
    return parse_mixture(raw, where=str(path))


def expand_pattern(pattern: str) -> list[str]:
    """All files a glob matches (sorted); a pattern matching nothing is an error."""
    [result] = FileSystems.match([pattern])
    files = sorted(m.path for m in result.metadata_list)
    if not files:
        raise MixtureError(f"pattern {pattern!r} matched no files")
    return files


def check_input_file(path: str) -> tuple:
    """Refuse, before the job runs, a matched path the job could not read as a file; return the
    file's identity (what two spellings of one file share).

    The name must be valid UTF-8 (it is written into the manifest, rejects and duplicates). A local
    path must be a regular file (a directory, FIFO, socket or device is refused: a FIFO would block
    the reader forever, so its type is checked without opening it) and readable; its identity is
    (device, inode), the same through `./`, `..`, symlinks and hard links. Remote paths are
    compared as written (object stores have no aliases).
    """
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        raise MixtureError(f"file name {path!r} is not valid UTF-8: rename the file") from None
    if "://" in path:
        return ("remote", path)
    try:
        st = os.stat(path)
    except OSError as e:
        raise MixtureError(f"file {path}: cannot stat it ({e.strerror})") from None
    if stat.S_ISDIR(st.st_mode):
        raise MixtureError(f"{path} is a directory, not an input file: match the files in it (e.g. {path}/*.jsonl)")
    if not stat.S_ISREG(st.st_mode):
        raise MixtureError(f"{path} is not a regular file (a FIFO, socket or device): the job reads only files")
    if not os.access(path, os.R_OK):
        raise MixtureError(f"file {path} is not readable (permission denied)")
    return ("local", st.st_dev, st.st_ino)


def resolve(mixture: Mixture, sample_dir: str | None = None) -> Mixture:
    """Expand every source's globs and check every matched file (`check_input_file`); each file
    must belong to exactly one source, whichever spelling reaches it. A file reached twice within
    one jsonl source is read once, under its first spelling (its documents would only be
    duplicates); within a tokens source every occurrence is kept, one shard each, because
    OLMo-core's instance numbering counts every occurrence.

    `sample://REL` patterns are rewritten under `sample_dir` (required when they occur).
    """
    owner: dict[tuple, tuple[str, str]] = {}  # file identity → (source, path as first matched)
    files = []
    for s in mixture.sources:
        found: list[str] = []
        for pattern in s.paths:
            if pattern.startswith(SAMPLE_SCHEME):
                if sample_dir is None:
                    raise MixtureError(f"source {s.name}: {pattern} needs the embedded sample directory")
                pattern = FileSystems.join(sample_dir, pattern[len(SAMPLE_SCHEME) :])
            for path in expand_pattern(pattern):
                prev, first = owner.setdefault(check_input_file(path), (s.name, path))
                if prev != s.name:
                    same = "" if first == path else f" (as {first!r})"
                    raise MixtureError(f"file {path}{same} is matched by sources {prev!r} and {s.name!r}")
                if s.format == TOKENS:
                    # every occurrence, as listed: OLMo-core numbers each line of a mix file, and
                    # its mixes repeat files to upsample them (dolma17.txt, OLMoE-mix-0824.txt)
                    found.append(path)
                elif first == path and path not in found:
                    found.append(path)
        files.append(tuple(found))  # listed order: patterns as listed, each glob sorted
    return Mixture(**{**mixture.__dict__, "files": tuple(files)})


def uses_sample(mixture: Mixture) -> bool:
    return any(p.startswith(SAMPLE_SCHEME) for s in mixture.sources for p in s.paths)
