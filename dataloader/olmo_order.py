"""AI2's data order (`order="olmo-core"`): OLMo-core's `NumpyFSLDataLoader` batches, exactly.

OLMo-core (ai2-olmo-core, `olmo_core/data/data_loader.py`) numbers the fixed-length instances
of its token files in listed order (file f owns the instances [offset_f, offset_f + n_f // L))
and, for epoch e (its trainer starts at epoch 1), shuffles them once:

    idx = np.arange(N, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed + e)).shuffle(idx)
    idx = idx[: ipb * (N // ipb)]             # ipb = instances per global batch
    batch b of epoch e = idx[b * ipb : (b + 1) * ipb]

Here a plan of "every training record of every source once, in listed order" makes plan
slot i the same instance as OLMo-core's instance i (one shard per token file, record j of a
shard = instance j of its file: `pipelines.token_files`), and

    position p = step * G + row  →  epoch e = 1 + p div (ipb · B),  slot = perm_e[p mod (ipb · B)]

with B = N // ipb batches per epoch, ipb = G. Mixture weights and max_repetition do not apply:
OLMo-core's FSL mix has none (the loader says so at start-up). tests/dataloader/test_olmo_order.py
checks all of this against OLMo-core itself, installed from PyPI.

Why hand-written: unlike Grain's `index_shuffle` (a per-index bijection, nothing to store), this
permutation is a Fisher–Yates shuffle of the whole array, so it must be materialised (4·N bytes).
`PermutationCache` builds it once per (N, seed, epoch) into a file with a sha256 sidecar,
checks it when opened and memory-maps it, so seeking to any step is O(1) after that.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from contract.errors import Stopped
from contract.outputs import open_temp
from contract.run import INDEX_SHUFFLE, OLMO_CORE, Order
from dataloader.plan import Plan, sources_from_manifests

NAME = "olmo-core"
FIRST_EPOCH = 1  # OLMo-core's trainer calls reshuffle(epoch=1) first
INDEX_DTYPE = np.dtype("<u4")  # OLMo-core stores global indices as uint32
MAX_INSTANCES = np.iinfo(np.uint32).max  # OLMo-core asserts len(dataset) < 2**32 - 1
DEFAULT_CACHE_ENV = "OLMAX_ORDER_CACHE"

log = logging.getLogger(__name__)


def default_cache_dir() -> str:
    """$OLMAX_ORDER_CACHE, else ~/.cache/olmax/order (local disk: each host builds its own)."""
    return os.environ.get(DEFAULT_CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "olmax", "order")


# -- pure functions ----------------------------------------------------------------------------


def permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """OLMo-core's global instance order of `epoch` (≥ 1): uint32 [n] (its `_build_global_indices`
    with shuffle=True and chunk_size 1)."""
    check_size(n)
    if epoch < FIRST_EPOCH:
        raise ValueError(f"OLMo-core epochs start at {FIRST_EPOCH}, got {epoch}")
    idx = np.arange(n, dtype=np.uint32)
    np.random.Generator(np.random.PCG64(seed + epoch)).shuffle(idx)
    return idx


def check_size(n: int) -> int:
    if not 0 < n < MAX_INSTANCES:
        raise ValueError(f"the olmo-core order needs 0 < instances < 2**32 - 1, got {n}")
    return int(n)


def batches_per_epoch(n: int, instances_per_batch: int) -> int:
    """B = N // ipb: OLMo-core drops the last N mod ipb instances of each epoch's order."""
    if instances_per_batch <= 0:
        raise ValueError(f"instances per batch must be positive, got {instances_per_batch}")
    b = n // instances_per_batch
    if b == 0:
        raise ValueError(f"{n} instances do not fill one global batch of {instances_per_batch}")
    return b


def epoch_and_offset(positions: np.ndarray, n: int, instances_per_batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Global positions int64 [k] → (OLMo-core epoch int64 [k] (≥ 1), index into that epoch's
    permutation int64 [k] (< ipb · B))."""
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size and positions.min() < 0:
        raise ValueError("positions must be non-negative")
    per_epoch = instances_per_batch * batches_per_epoch(n, instances_per_batch)
    e, within = np.divmod(positions, per_epoch)
    return e + FIRST_EPOCH, within


def step_epoch(step: int, n: int, instances_per_batch: int) -> tuple[int, int]:
    """Training step → (OLMo-core epoch, batch index within it): a step past the epoch's last
    batch is batch 0 of the next epoch (OLMo-core's trainer loop)."""
    e, b = divmod(int(step), batches_per_epoch(n, instances_per_batch))
    return e + FIRST_EPOCH, b


def plan_from_manifests(manifests: Sequence[Mapping], data_fingerprints: Sequence[str]) -> Plan:
    """Every training record of every source once, in listed order (source order over the
    manifests, shard order within a source): plan slot i = OLMo-core instance i."""
    specs = sources_from_manifests(manifests, "train")
    for m in manifests:
        for src in m.get("mixture", {}).get("sources", []):
            rejected = sum(m["sources"][src["name"]]["counts"]["rejected"].values())
            # a held-out source's files are not numbered (its train shards are empty either way)
            if src.get("format") == "tokens" and src.get("split") != "heldout" and rejected:
                raise ValueError(
                    f"source {src['name']!r}: {rejected} token file(s) were rejected (see the job's "
                    "rejects/): their instances are missing, so OLMo-core's instance numbering of every "
                    "later file would differ; the olmo-core order refuses this data"
                )
    counts = tuple(s.records for s in specs)
    check_size(sum(counts))
    # What this order reads: each source's own tokens (its instances once); the plan's weights say
    # so, for whoever compares shares with weights (the audit's mixture check).
    specs = tuple(dataclasses.replace(s, weight=float(s.tokens)) for s in specs)
    blob = json.dumps(
        {
            "data": list(data_fingerprints),
            "split": "train",
            "order": OLMO_CORE.to_json(),
            "counts": [[s.name, int(n)] for s, n in zip(specs, counts)],
        },
        sort_keys=True,
    )
    return Plan(
        sources=specs,
        counts=counts,
        split="train",
        order=OLMO_CORE,
        fingerprint=hashlib.sha256(blob.encode()).hexdigest(),
    )


def ignored_settings(manifests: Sequence[Mapping], weights: Mapping[str, float] | None) -> str:
    """The start-up note: what the mixture says that this order does not apply."""
    mixed = [s for m in manifests for s in m.get("mixture", {}).get("sources", [])]
    shown = {s["name"]: s["weight"] for s in mixed}
    reps = {s["name"]: s["max_repetition"] for s in mixed if s.get("max_repetition") is not None}
    return (
        f"data order olmo-core: every training instance of every source once per epoch, in "
        f"listed order (as OLMo-core's FSL dataset); mixture weights {shown}"
        f"{' (overrides ' + str(dict(weights)) + ')' if weights else ''} and max_repetition "
        f"{reps or '(none)'} do not apply"
    )


# -- the cache ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class CacheKey:
    n: int
    seed: int
    epoch: int

    @property
    def stem(self) -> str:
        return f"{OLMO_CORE.name}-v{OLMO_CORE.version}_n{self.n}_seed{self.seed}_epoch{self.epoch}"


class CacheError(Stopped, RuntimeError):
    """A permutation cache file does not match its checksum or its key."""


def _sha256_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


class PermutationCache:
    """Memory-mapped, checksummed permutations in `directory`:
    `<stem>.u32` (uint32-le [n]) and `<stem>.json` ({algorithm, version, n, seed, epoch, sha256}).

    `get(n, seed, epoch)` builds the file when absent (atomically: written to a temporary file,
    renamed last, so concurrent builders on one host agree), checks size, key and sha256 when it
    opens a file, and keeps the last `keep` epochs mapped.
    """

    def __init__(self, directory: str | None = None, keep: int = 2, verify: bool = True):
        self.directory = directory or default_cache_dir()
        self.keep, self.verify = max(1, keep), verify
        self._open: OrderedDict[CacheKey, np.ndarray] = OrderedDict()
        self._lock = threading.Lock()  # the loader's prefetch threads share one cache

    def paths(self, key: CacheKey) -> tuple[str, str]:
        base = os.path.join(self.directory, key.stem)
        return base + ".u32", base + ".json"

    def build(self, key: CacheKey) -> None:
        data_path, meta_path = self.paths(key)
        os.makedirs(self.directory, exist_ok=True)
        log.info(
            "building the olmo-core order for N=%d seed=%d epoch=%d into %s", key.n, key.seed, key.epoch, data_path
        )
        perm = permutation(key.n, key.seed, key.epoch).astype(INDEX_DTYPE, copy=False)
        digest = hashlib.sha256(perm.data).hexdigest()
        meta = {
            "algorithm": OLMO_CORE.name,
            "version": OLMO_CORE.version,
            "n": key.n,
            "seed": key.seed,
            "epoch": key.epoch,
            "dtype": "uint32-le",
            "sha256": digest,
        }
        for path, write in (
            (data_path, lambda f: perm.tofile(f)),
            (meta_path, lambda f: f.write(json.dumps(meta, sort_keys=True).encode())),
        ):
            # a plain open()'s mode (0666 less the umask): mkstemp's 0600 would hide it from the
            # other users of a shared cache
            fd, tmp = open_temp(self.directory, os.path.basename(path))
            try:
                with os.fdopen(fd, "wb") as f:
                    write(f)
                os.replace(tmp, path)  # data first, then its sidecar: a sidecar means a whole file
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise

    def open(self, key: CacheKey) -> np.ndarray:
        """The permutation of `key` as a read-only uint32 memmap [n] (checked)."""
        data_path, meta_path = self.paths(key)
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        want = {
            "algorithm": OLMO_CORE.name,
            "version": OLMO_CORE.version,
            "n": key.n,
            "seed": key.seed,
            "epoch": key.epoch,
        }
        if {k: meta.get(k) for k in want} != want:
            raise CacheError(f"{meta_path}: describes {meta}, expected {want}")
        size = os.path.getsize(data_path)
        if size != key.n * INDEX_DTYPE.itemsize:
            raise CacheError(f"{data_path}: {size} bytes, expected {key.n} × 4")
        if self.verify and _sha256_file(data_path) != meta["sha256"]:
            raise CacheError(f"{data_path}: sha256 does not match {meta_path}; delete both files to rebuild the order")
        return np.memmap(data_path, dtype=INDEX_DTYPE, mode="r", shape=(key.n,))

    def get(self, n: int, seed: int, epoch: int) -> np.ndarray:
        key = CacheKey(check_size(n), int(seed), int(epoch))
        with self._lock:
            if key in self._open:
                self._open.move_to_end(key)
                return self._open[key]
            data_path, meta_path = self.paths(key)
            if not (os.path.exists(meta_path) and os.path.exists(data_path)):
                self.build(key)
            perm = self.open(key)
            self._open[key] = perm
            while len(self._open) > self.keep:
                self._open.popitem(last=False)
            return perm


def train_slots(
    positions: np.ndarray, n: int, instances_per_batch: int, seed: int, cache: PermutationCache
) -> np.ndarray:
    """Global positions int64 [k] → plan slots int64 [k] in [0, n) (OLMo-core's instance ids)."""
    epochs, within = epoch_and_offset(positions, n, instances_per_batch)
    out = np.empty(len(within), dtype=np.int64)
    for e in np.unique(epochs).tolist():
        pick = epochs == e
        out[pick] = cache.get(n, seed, e)[within[pick]]
    return out


@dataclasses.dataclass(frozen=True)
class OrderFunctions:
    """What a checker (the audit) needs of a data order, whichever it is.

    slots(positions int64 [k], N, seed) → plan slots int64 [k]; epoch_positions(N) → positions per
    epoch (N for Grain's index_shuffle; ipb · (N // ipb) for OLMo-core, which drops the rest). Both
    orders are a permutation of the plan's slots per epoch (OLMo-core's: an injective prefix of one),
    which is what the audit's sharding proof needs."""

    slots: Callable[[np.ndarray, int, int], np.ndarray]
    epoch_positions: Callable[[int], int]


def order_functions(which: Order, global_batch_size: int, cache_dir: str | None = None) -> OrderFunctions | None:
    """The functions of a run's recorded order (None: an order this code does not know)."""
    from dataloader import order as grain_order  # Grain: only for the index-shuffle order

    if which == INDEX_SHUFFLE:
        return OrderFunctions(grain_order.train_slots, lambda n: n)
    if which == OLMO_CORE:
        cache = PermutationCache(cache_dir)
        return OrderFunctions(
            lambda positions, n, seed: train_slots(positions, n, global_batch_size, seed, cache),
            lambda n: global_batch_size * batches_per_epoch(n, global_batch_size),
        )
    return None
