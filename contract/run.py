"""run.json: what the trainer tells the audit (and run comparison) about a run, in one record.

Written by the trainer into its run_dir at start-up, and rewritten on every (elastic) restart.
Schema version 1 (`RUN_SCHEMA_VERSION`):
  schema_version: 1
  global_batch_size: G (examples per step, over all hosts)
  seed: the data-order seed
  split: the training split ("train")
  data: [manifest paths, in LoaderConfig.data order]
  manifest_fingerprints: [each manifest's fingerprint, same order]
  weights: {source: weight} overrides of the manifests' mixture weights, or null (as tokenized)
  loader_fingerprint: the plan's fingerprint (manifests + split + per-source epoch counts)
  order: {name, version}: the algorithm mapping position → plan slot (see `Order`)
  seq_len, tokenizer {name, vocab_size, eos_id, pad_id, ranks_sha256}
  hosts: [{first_step, host_count}, ...]: host count from first_step until the next entry
  model: {free-form: name, vocab_size, ...} (informative)
Readers must refuse a schema_version they do not know (`RunRecord.load` does).

summary.json (`SUMMARY_NAME`, written by the trainer when a run ends; `RunSummary`): step (updates
applied), data_sha256 (`chain_data_sha256` over the consumed global batches, "" before step 1),
and informative fields (params_sha256, tokens, last_losses, heldout_loss, ...). A summary that is
not a JSON object with an integer step and a string data_sha256 is refused (`RunSummaryError`,
naming the file and, for bad JSON, the line): a damaged summary is an error, never "no summary".
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .errors import Refused
from .manifest import TokenizerInfo, read_json_file

RUN_RECORD_NAME = "run.json"
RUN_SCHEMA_VERSION = 1
SUMMARY_NAME = "summary.json"


class RunRecordError(Refused, ValueError):
    """run.json is missing, malformed or of an unknown schema version (the message names the file)."""


@dataclasses.dataclass(frozen=True)
class Order:
    """A data order: `name` says which algorithm maps global position → plan slot, `version`
    which revision of it (a change of the mapping is a new version)."""

    name: str
    version: int

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "version": self.version}


# Grain's index_shuffle per epoch, seeded (seed + epoch) mod 2**32, 4 rounds (dataloader.order).
INDEX_SHUFFLE = Order("grain.index_shuffle", 1)
# OLMo-core's NumpyFSLDataLoader: PCG64(seed + epoch).shuffle(arange(N)) per epoch, epochs from 1,
# the last N mod G instances dropped (dataloader.olmo_order; checked against ai2-olmo-core).
OLMO_CORE = Order("olmo-core.numpy_fsl", 1)
# LoaderConfig.order / trainer `data_order` value → the order it names.
ORDERS = {"grain": INDEX_SHUFFLE, "olmo-core": OLMO_CORE}


def order_named(name: str) -> Order:
    """The Order a config's `order` / `data_order` value names (ValueError listing the choices)."""
    try:
        return ORDERS[name]
    except KeyError:
        raise ValueError(f"unknown data order {name!r}; choose one of {sorted(ORDERS)}") from None


@dataclasses.dataclass(frozen=True)
class HostRange:
    """From step `first_step` on (until the next range), the run had `host_count` hosts."""

    first_step: int
    host_count: int


@dataclasses.dataclass(frozen=True)
class RunRecord:
    global_batch_size: int
    seed: int
    data: tuple[str, ...]
    manifest_fingerprints: tuple[str, ...]
    loader_fingerprint: str
    order: Order
    seq_len: int
    tokenizer: TokenizerInfo
    hosts: tuple[HostRange, ...]
    weights: dict[str, float] | None = None
    split: str = "train"
    model: dict[str, Any] = dataclasses.field(default_factory=dict)
    schema_version: int = RUN_SCHEMA_VERSION

    def __post_init__(self) -> None:
        if self.global_batch_size <= 0:
            raise RunRecordError(f"global_batch_size must be positive, got {self.global_batch_size}")
        if not self.hosts:
            raise RunRecordError("hosts needs at least one {first_step, host_count} range")
        firsts = [r.first_step for r in self.hosts]
        if firsts[0] != 0 or firsts != sorted(set(firsts)) or any(r.host_count <= 0 for r in self.hosts):
            raise RunRecordError(f"hosts must start at step 0, increase strictly and count ≥ 1 host: {self.hosts}")

    # -- topology
    def host_count_at(self, step: int) -> int:
        """The host count that ran `step`."""
        count = self.hosts[0].host_count
        for r in self.hosts:
            if r.first_step <= step:
                count = r.host_count
        return count

    def restarted(self, step: int, host_count: int) -> RunRecord:
        """This record after a (re)start at `step` (the checkpoint restored) with `host_count` hosts:
        ranges from `step` on are dropped (those steps will be run again), then the new range added
        unless the host count is unchanged."""
        kept = [r for r in self.hosts if r.first_step < step]
        if not kept or kept[-1].host_count != host_count:
            kept.append(HostRange(step, host_count))
        return dataclasses.replace(self, hosts=tuple(kept))

    # -- JSON
    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "global_batch_size": self.global_batch_size,
            "seed": self.seed,
            "split": self.split,
            "data": list(self.data),
            "manifest_fingerprints": list(self.manifest_fingerprints),
            "weights": self.weights,
            "loader_fingerprint": self.loader_fingerprint,
            "order": self.order.to_json(),
            "seq_len": self.seq_len,
            "tokenizer": self.tokenizer.to_json(),
            "hosts": [dataclasses.asdict(r) for r in self.hosts],
            "model": dict(self.model),
        }

    def dump(self) -> bytes:
        return (json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n").encode("utf-8")

    def write(self, run_dir: str | os.PathLike[str]) -> str:
        """Atomically (re)writes `run_dir/run.json`; returns its path."""
        path = os.path.join(os.fspath(run_dir), RUN_RECORD_NAME)
        tmp = path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(self.dump())
        os.replace(tmp, path)
        return path

    @classmethod
    def from_json(cls, d: Mapping[str, Any], where: str = RUN_RECORD_NAME) -> RunRecord:
        if not isinstance(d, Mapping):
            raise RunRecordError(f"{where}: a run record is a JSON object")
        version = d.get("schema_version")
        if version != RUN_SCHEMA_VERSION:
            raise RunRecordError(f"{where}: schema_version {version!r} unknown (this code reads {RUN_SCHEMA_VERSION})")
        required = (
            "global_batch_size",
            "seed",
            "data",
            "manifest_fingerprints",
            "loader_fingerprint",
            "order",
            "seq_len",
            "tokenizer",
            "hosts",
        )
        missing = [k for k in required if k not in d]
        if missing:
            raise RunRecordError(f"{where}: missing required field(s) {missing}")
        try:
            return cls(
                global_batch_size=int(d["global_batch_size"]),
                seed=int(d["seed"]),
                data=tuple(str(p) for p in d["data"]),
                manifest_fingerprints=tuple(str(f) for f in d["manifest_fingerprints"]),
                loader_fingerprint=str(d["loader_fingerprint"]),
                order=Order(str(d["order"]["name"]), int(d["order"]["version"])),
                seq_len=int(d["seq_len"]),
                tokenizer=TokenizerInfo.from_json(d["tokenizer"], f"{where}: tokenizer"),
                hosts=tuple(HostRange(int(r["first_step"]), int(r["host_count"])) for r in d["hosts"]),
                weights=None if d.get("weights") is None else {str(k): float(v) for k, v in d["weights"].items()},
                split=str(d.get("split", "train")),
                model=dict(d.get("model") or {}),
                schema_version=version,
            )
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            if isinstance(e, RunRecordError):
                raise RunRecordError(f"{where}: {e}") from None
            raise RunRecordError(f"{where}: malformed field: {type(e).__name__}: {e}") from None

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> RunRecord:
        """Reads `path` (a run.json, or a run_dir holding one)."""
        path = os.fspath(path)
        if os.path.isdir(path):
            path = os.path.join(path, RUN_RECORD_NAME)
        return cls.from_json(read_json_file(path, RunRecordError, "the run record the trainer writes at start"), path)


class RunSummaryError(Refused, ValueError):
    """summary.json is not valid JSON or lacks/mistypes step or data_sha256 (the message names the file)."""


@dataclasses.dataclass(frozen=True)
class RunSummary:
    """What summary.json says of a finished run: `step` updates applied, `data_sha256` the chain
    hash of the global batches of steps 0..step-1; `raw` the whole object (informative fields)."""

    step: int
    data_sha256: str
    path: str = SUMMARY_NAME
    raw: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)

    @classmethod
    def from_json(cls, d: Any, where: str = SUMMARY_NAME) -> RunSummary:
        if not isinstance(d, Mapping):
            raise RunSummaryError(f"{where}: a run summary is a JSON object, not {type(d).__name__}")
        step, sha = d.get("step"), d.get("data_sha256")
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise RunSummaryError(f"{where}: step must be a non-negative integer, got {step!r}")
        if not isinstance(sha, str):
            raise RunSummaryError(f"{where}: data_sha256 must be a string, got {sha!r}")
        return cls(step, sha, where, dict(d))

    @classmethod
    def load(cls, path: str) -> RunSummary:
        """Reads `path` (a summary.json, or a run_dir holding one); FileNotFoundError when absent
        (the run has not finished), RunSummaryError when it is damaged."""
        if os.path.isdir(path):
            path = os.path.join(path, SUMMARY_NAME)
        d = read_json_file(path, RunSummaryError, "the run has not finished")
        return cls.from_json(d, path)


def summary_path(run_dir: str) -> str:
    return os.path.join(run_dir, SUMMARY_NAME)


def run_record_path(run_dir: str) -> str:
    return os.path.join(run_dir, RUN_RECORD_NAME)


def hosts_from_json(rows: Sequence[Mapping[str, int]]) -> tuple[HostRange, ...]:
    return tuple(HostRange(int(r["first_step"]), int(r["host_count"])) for r in rows)
