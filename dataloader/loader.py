"""LoaderConfig, make_loader and the host iterator (batch assembly + prefetching).

Each host batch is a pure function of (plan, seed, step, h, H): positions from
`hosts`, slots from `order`, (source, record) from `plan`, tokens from `source`.
Prefetching runs that function for the next steps in Grain threads
(`MapDataset.range(...).map(...).to_iter_dataset(ReadOptions)`, which keeps order), so
the output is identical whatever the prefetch settings, and resuming is just starting
the range at another step: O(1), no replay.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Mapping, Sequence
from typing import Protocol

import grain
import numpy as np

from contract import Manifest
from contract.run import order_named
from dataloader import golden, guard, hosts, olmo_order, order
from dataloader.double_sharding import DoubleShardingReplay
from dataloader.plan import Plan, plan_from_manifests
from dataloader.source import DEFAULT_MAX_OPEN_SHARDS, SplitSource, open_sources, read_manifest, reader_bytes

log = logging.getLogger(__name__)
_STEP_LIMIT = 2**62  # "forever" for the training stream's step range


@dataclasses.dataclass(frozen=True)
class LoaderConfig:
    """What the data stream is. Only data/split/weights/seed/global_batch_size shape it;
    prefetch/read_threads/guard_steps change speed and checks, never the output.

    data: manifest.json paths (sources are numbered over them in this order).
    weights: {source name: weight} overriding the manifests' mixture weights.
    prefetch: batches read ahead (0 = read on demand, in the caller's thread).
    read_threads: Grain threads reading batches ahead (used when prefetch > 0).
    guard_steps: steps the start-up guard compares across hosts (≥ 1).
    order: "grain" (Grain's index_shuffle over the weighted plan) or "olmo-core" (AI2's
      NumpyFSLDataLoader batches: every instance once per epoch in listed order, shuffled as
      OLMo-core does; weights and max_repetition do not apply; see dataloader.olmo_order).
    order_cache: folder of the olmo-core order's permutation files (default
      $OLMAX_ORDER_CACHE or ~/.cache/olmax/order); unused by the grain order.
    max_open_shards: shard readers each source keeps open at once, least recently read closed
      first (None: every shard read so far stays open). Each open reader holds its shard's index
      in memory (dataloader/README.md#shards-at-start-up-and-reader-memory); a closed one is reopened when read again.
    """

    data: Sequence[str]
    global_batch_size: int
    seed: int = 0
    split: str = "train"
    weights: Mapping[str, float] | None = None
    prefetch: int = 2
    read_threads: int = 2
    guard_steps: int = 4
    order: str = "grain"
    order_cache: str | None = None
    max_open_shards: int | None = DEFAULT_MAX_OPEN_SHARDS

    def __post_init__(self) -> None:
        data = (self.data,) if isinstance(self.data, str) else tuple(str(p) for p in self.data)
        object.__setattr__(self, "data", data)
        order.check_seed(self.seed)
        order_named(self.order)  # raises on an unknown order, naming the choices
        if self.prefetch < 0 or self.read_threads < 0 or self.guard_steps < 1:
            raise ValueError("prefetch and read_threads must be ≥ 0 and guard_steps ≥ 1")
        if self.max_open_shards is not None and (
            isinstance(self.max_open_shards, bool)
            or not isinstance(self.max_open_shards, int)
            or self.max_open_shards < 1
        ):
            raise ValueError(f"max_open_shards must be an int ≥ 1 or None, got {self.max_open_shards!r}")


class Sampler(Protocol):
    """Which global positions this process reads, and the data logs they are recorded under (the
    trainer's step logger asks the sampler, so an experiment's sampler brings its own logs)."""

    def positions(self, step: int) -> np.ndarray:
        """Global positions int64 [G/H] this host reads at `step`."""

    def logged_hosts(self) -> tuple[list[int], int]:
        """(the hosts whose data logs this process writes, the host count they are numbered of)."""

    def host_parts(self, values: np.ndarray) -> list[np.ndarray]:
        """A batch field → each logged host's part, in ``logged_hosts`` order."""


@dataclasses.dataclass(frozen=True)
class HostSliceSampler:
    """The only sampler production uses: host h's contiguous slice of global batch `step`."""

    global_batch_size: int
    process_index: int
    process_count: int

    def positions(self, step: int) -> np.ndarray:
        return hosts.host_positions(step, self.global_batch_size, self.process_index, self.process_count)

    def logged_hosts(self) -> tuple[list[int], int]:
        return [self.process_index], self.process_count

    def host_parts(self, values: np.ndarray) -> list[np.ndarray]:
        return [values]


def special_tokens(tokens: np.ndarray, below: int) -> tuple[np.ndarray, np.ndarray]:
    """Where tokens [B, T] (C-contiguous) hold ids ≥ `below`: (flat indices int64 [k], ids [k]).

    One compare + one nonzero pass finds every EOS, PAD and out-of-vocabulary id at once when
    `below` = min(eos, pad) (both < vocab_size): ordinary text ids are below them. Pass the
    uint32 view of raw records, so that ids ≥ 2**31 are found too.
    """
    flat = tokens.reshape(-1)
    at = np.flatnonzero(flat >= below)
    return at, flat[at]


def batch_fields(
    tokens: np.ndarray,
    eos_id: int,
    pad_id: int,
    *,
    out: np.ndarray | None = None,
    specials: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """tokens int32 [B, T] → segment_ids, positions, loss_mask (all int32 [B, T]).

    segment_ids: 1 for the example's first (possibly continued) document, +1 after each
      EOS, 0 on PAD. positions: 0 at each segment start, counting up; 0 on PAD.
    loss_mask: 1 where the token is not PAD.
    out: optional int32 [3, B, T] (each out[i] C-contiguous) that receives the three fields in this order.
    specials: `special_tokens(tokens, ≤ min(eos_id, pad_id))` when the caller already has it.

    EOS and PAD are sparse, so the work is on the k segment starts, not per token: each
    segment is a run of one segment id, and of one start column that positions subtract
    from the column index; `np.repeat` writes both runs in one pass each. Every output
    element is written exactly once (no zero-fill), then PAD tokens are zeroed by index.
    """
    n_rows, length = tokens.shape
    if out is None:
        out = np.empty((3, n_rows, length), dtype=np.int32)
    if out.shape != (3, n_rows, length) or out.dtype != np.int32:
        raise ValueError(f"out must be int32 [3, {n_rows}, {length}]")
    segment_ids, positions, loss_mask = out
    if not all(f.flags.c_contiguous for f in out):  # written through flat views below
        raise ValueError("each out[i] must be C-contiguous")
    fields = {"segment_ids": segment_ids, "positions": positions, "loss_mask": loss_mask}
    size = n_rows * length
    if size == 0:
        return fields
    at, ids = specials if specials is not None else special_tokens(tokens, min(eos_id, pad_id))
    # Segments start at each row's first column and right after each EOS (one in a row's
    # last column starts nothing in that row: the next row starts anyway).
    after_eos = at[ids == eos_id] + 1
    starts = np.union1d(np.arange(0, size, length), after_eos[after_eos % length != 0])
    runs = np.diff(starts, append=size)
    column = (starts % length).astype(np.int32)
    first_in_row = np.searchsorted(starts, starts - column)  # index of the row's first start
    number = (np.arange(1, len(starts) + 1) - first_in_row).astype(np.int32)
    np.copyto(segment_ids.reshape(-1), np.repeat(number, runs))
    np.subtract(np.arange(length, dtype=np.int32), np.repeat(column, runs).reshape(n_rows, length), out=positions)
    loss_mask.fill(1)
    pad = at[ids == pad_id]
    if len(pad):
        for field in (segment_ids, positions, loss_mask):
            field.reshape(-1)[pad] = 0
    return fields


class DataIterator:
    """Host iterator: `next(it)` → host batch dict; `it.state()` → checkpointable state."""

    def __init__(
        self,
        cfg: LoaderConfig,
        plan: Plan,
        sources: list[SplitSource],
        tokenizer: Mapping,
        seq_len: int,
        sampler: Sampler,
        per_host: int,
        start_step: int,
    ):
        self.cfg, self.plan, self.seq_len, self.per_host = cfg, plan, seq_len, per_host
        self._sources, self._sampler = sources, sampler
        self._eos, self._pad = int(tokenizer["eos_id"]), int(tokenizer["pad_id"])
        self._vocab = int(tokenizer["vocab_size"])
        if not 0 < self._vocab <= 2**31:
            raise ValueError(f"vocab_size {self._vocab} does not fit int32 token ids")
        if not (0 <= self._eos < self._vocab and 0 <= self._pad < self._vocab):
            raise ValueError(f"eos_id {self._eos} and pad_id {self._pad} must be < vocab_size {self._vocab}")
        self._step = start_step
        if cfg.split == "heldout":
            self.num_steps: int | None = order.num_heldout_steps(plan.size, cfg.global_batch_size)
        else:
            self.num_steps = None
        stop = _STEP_LIMIT if self.num_steps is None else max(self.num_steps, start_step)
        self._olmo = None
        if cfg.order == olmo_order.NAME and cfg.split == "train":
            self._olmo = olmo_order.PermutationCache(cfg.order_cache)
            olmo_order.batches_per_epoch(plan.size, cfg.global_batch_size)  # ≥ 1 batch or raise
        self._iter = None
        if cfg.prefetch > 0:
            ds = grain.MapDataset.range(start_step, stop).map(self.batch_at)
            self._iter = iter(
                ds.to_iter_dataset(grain.ReadOptions(num_threads=cfg.read_threads, prefetch_buffer_size=cfg.prefetch))
            )

    @property
    def fingerprint(self) -> str:
        return self.plan.fingerprint

    @property
    def step(self) -> int:
        """The step the next `next()` returns."""
        return self._step

    def state(self) -> dict:
        """Small JSON-able state: resume with make_loader(cfg, ..., start_step=state['step'])."""
        return {
            "fingerprint": self.plan.fingerprint,
            "seed": self.cfg.seed,
            "global_batch_size": self.cfg.global_batch_size,
            "step": self._step,
        }

    def slots_at(self, positions: np.ndarray) -> np.ndarray:
        """Global positions → plan slots (-1: past the end of the held-out pass), by the plan's order."""
        if self._olmo is not None:  # needs G and the permutation cache besides (N, seed)
            return olmo_order.train_slots(
                positions, self.plan.size, self.cfg.global_batch_size, self.cfg.seed, self._olmo
            )
        return order.slots(self.plan.order, positions, self.plan.size, self.cfg.seed)

    def batch_at(self, step: int) -> dict[str, np.ndarray]:
        """The host batch of `step` (pure function of plan, seed, step, sampler).

        The four int32 [B, T] fields are views of one new int32 [4, B, T] block: one
        allocation per batch, never reused (a batch handed out never changes). Blocks of
        ≥ 4 MiB get transparent huge pages from numpy, which on small VMs saves ~2k page
        faults per batch of 64 × 8192 (about as long as reading the batch).
        """
        positions = np.asarray(self._sampler.positions(step), dtype=np.int64)
        slots = self.slots_at(positions)
        valid = slots >= 0
        block = np.empty((4, len(positions), self.seq_len), dtype=np.int32)
        raw = block[0].view(np.uint32)  # records are uint32-le; ids are checked < vocab below
        if not valid.all():
            raw[~valid] = self._pad
        example = np.full(len(positions), -1, dtype=np.int64)
        src, rec = self.plan.locate(slots[valid])
        rows = np.flatnonzero(valid)
        for s in np.unique(src).tolist():
            pick = src == s
            self._sources[s].read_into(rec[pick], raw, rows[pick])
        example[rows] = self.plan.example_ids(src, rec)
        # EOS, PAD and every id ≥ vocab_size (> both) in one pass over the uint32 records.
        specials = special_tokens(raw, min(self._eos, self._pad))
        bad = specials[0][specials[1] >= self._vocab]
        if len(bad):
            bad_rows = np.unique(bad // self.seq_len)
            raise ValueError(
                f"step {step}: token ids ≥ vocab_size {self._vocab} in examples "
                f"{example[bad_rows].tolist()} (source<<40|record)"
            )
        tokens = block[0]  # every id < vocab_size ≤ 2**31: the same values as int32
        batch = {"tokens": tokens, **batch_fields(tokens, self._eos, self._pad, out=block[1:], specials=specials)}
        batch["index"] = np.where(valid, positions, -1)
        batch["example"] = example
        return batch

    def __iter__(self) -> DataIterator:
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self.num_steps is not None and self._step >= self.num_steps:
            raise StopIteration
        batch = next(self._iter) if self._iter is not None else self.batch_at(self._step)
        self._step += 1
        return batch

    def close(self) -> None:
        self._iter = None
        for s in self._sources:
            s.close()

    def __enter__(self) -> DataIterator:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def load_plan(cfg: LoaderConfig, manifests: Sequence[Manifest] | None = None) -> tuple[list[Manifest], Plan]:
    """Reads the manifests (not the shards; `manifests`: cfg.data's, already read) and builds the
    plan: cheap, no shard I/O."""
    manifests = [read_manifest(p) for p in cfg.data] if manifests is None else list(manifests)
    if cfg.order == olmo_order.NAME and cfg.split == "train":
        return manifests, olmo_order.plan_from_manifests(manifests, [str(m.get("fingerprint", "")) for m in manifests])
    return manifests, plan_from_manifests(manifests, cfg.split, cfg.weights)


def reader_host_bytes(cfg: LoaderConfig, manifests: Sequence[Manifest] | None = None, plan: Plan | None = None) -> int:
    """The most host memory the loader's shard readers can hold over the run (bytes): for each of
    the plan's sources, its `cfg.max_open_shards` largest shards' readers (`source.reader_bytes`).
    No shard I/O. manifests and plan: as `load_plan` returned them (read and built here when not given)."""
    if manifests is None or plan is None:
        manifests, plan = load_plan(cfg, manifests)
    by_name = {name: m for m in manifests for name in m["sources"]}
    return sum(reader_bytes(by_name[s.name], s.name, cfg.split, cfg.max_open_shards) for s in plan.sources)


def make_loader(
    cfg: LoaderConfig,
    process_index: int | None = None,
    process_count: int | None = None,
    start_step: int = 0,
    *,
    sampler: Sampler | None = None,
    unsafe_double_sharding_experiment: bool = False,
    loaded: tuple[Sequence[Manifest], Plan] | None = None,
) -> DataIterator:
    """The host iterator for host `process_index` of `process_count`, from `start_step`.

    Defaults: jax.process_index(), jax.process_count(). Runs the start-up checks before
    returning: golden.check_stream (raises golden.StreamChangedError when the order, plan rule or
    host slices no longer compute the stream the fingerprint names, e.g. after a Grain upgrade)
    and the guard (raises guard.GuardError when hosts would overlap or not cover a batch).
    `sampler` replaces the host-slice sampler — for tests of the guard and for the
    double-sharding experiment (`dataloader.double_sharding`), which is the one case where
    `unsafe_double_sharding_experiment=True` turns the guard's refusal into a loud error log:
    the bug is replayed on purpose so that `make lessons` can measure it. Never set it to train.
    `loaded`: (manifests, plan) as `load_plan(cfg)` returned them (the trainer's start-up read and
    built them once: ``trainer.startup.Checked``); read and built here when not given.
    """
    if process_index is None or process_count is None:
        import jax  # only for the defaults: a loader given its host never touches JAX

        process_index = jax.process_index() if process_index is None else process_index
        process_count = jax.process_count() if process_count is None else process_count
    if start_step < 0:
        raise ValueError(f"start_step must be ≥ 0, got {start_step}")
    per_host = hosts.check_topology(cfg.global_batch_size, process_index, process_count)
    manifests, plan = load_plan(cfg) if loaded is None else (list(loaded[0]), loaded[1])
    golden.check_stream(plan.order)  # refuse a stream that is not the one the fingerprint names
    if unsafe_double_sharding_experiment and not isinstance(sampler, DoubleShardingReplay):
        raise ValueError(
            "unsafe_double_sharding_experiment only accepts the sampler dataloader.double_sharding.DoubleShardingReplay"
        )
    sampler = sampler or HostSliceSampler(cfg.global_batch_size, process_index, process_count)
    try:
        guard.check_hosts(
            sampler.positions, start_step, cfg.guard_steps, cfg.global_batch_size, process_index, process_count
        )
    except guard.GuardError as e:
        if not unsafe_double_sharding_experiment:
            raise
        log.error(
            "UNSAFE DOUBLE-SHARDING EXPERIMENT: the start-up guard's refusal is overridden; this "
            "run's data is WRONG on purpose.\n%s",
            e,
        )
    if cfg.order == olmo_order.NAME and cfg.split == "train":
        olmo_order.log.warning(olmo_order.ignored_settings(manifests, cfg.weights))
    sources = open_sources(manifests, plan.sources, cfg.split, cfg.max_open_shards)
    return DataIterator(
        cfg, plan, sources, manifests[0]["tokenizer"], int(manifests[0]["seq_len"]), sampler, per_host, start_step
    )
