"""Owns the run directory's side of the start: checked and agreed by every process, then locked; ``AsFound``.

    lock, checked = prepare(cfg, run)   # run: the RunDir trainer.main resolved; StartRefused → exit 2
    try: train(checked, run)
    finally: lock.release()

Checked on every process, agreed among them (one refusal stops all, before anything is
written): the run directory is a directory or can be one; no live process holds it; every
check of ``trainer.startup.check`` (the manifests fit the model and each other, the held-out
sets and trackers, the plan can be built, the mesh fits the devices, the hosts' topology and each
process's devices hold its loader rows, the microbatches, the attention kernel: checked there, not
again here), whose frozen result ``prepare`` returns for the run to use; the loader's batches
and shard readers fit this host's memory; every shard the run reads exists and matches its
manifest (`dataloader.verify`: sha256, split among the processes, up to `verify_data_gib` per
process; the log says exactly what was hashed and what was not). Only then does the primary
create the directory and take its lock (`contract.lock`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from contract import HELDOUT, TRAIN, Manifest
from contract.errors import Refused
from contract.lock import LOCK_NAME, FolderLock, probe
from contract.outputs import TRAINING_RUN, other_output_refusal, output_kinds
from contract.rundir import RunDir
from dataloader import LoaderConfig, source, verify
from dataloader.heldout import choose_sets, heldout_sources, sets_reader_bytes
from dataloader.loader import reader_host_bytes
from dataloader.plan import Plan
from trainer.config.schema import TrainConfig
from trainer.startup import Checked, StartRefused, check

log = logging.getLogger(__name__)
PURPOSE = "python -m trainer.main"


# ----------------------------------------------------------------------------- pure checks

# orbax reads some of a checkpoint's files by glob with the checkpoint's path inside the pattern
# (etils.epath joins them: OCDBT's per-process databases when they are merged, the array
# metadata), so a `[` or `]` there makes a character class that does not match the directory's
# own name: the step saves and seals but never restores. `*` and `?` match themselves (and are
# kept working: tested); a bracket is refused before anything is written.
GLOB_CLASS_CHARS = "[]"


def glob_problem(path: Path, what: str) -> str | None:
    """Why orbax could not restore checkpoints under `path` (a `[` or `]` in it), or None."""
    found = sorted({c for c in str(path) if c in GLOB_CLASS_CHARS})
    if not found:
        return None
    return (
        f"{what} {path}: its path holds {' and '.join(repr(c) for c in found)}, which orbax reads as a "
        "glob pattern when it restores a checkpoint (the checkpoints would be written but never restore); "
        "name a directory without brackets"
    )


def run_dir_problem(run_dir: Path) -> str | None:
    """Why `run_dir` cannot be (or become) a run directory, or None."""
    if problem := glob_problem(run_dir, "--run_dir"):
        return problem
    if run_dir.exists() and not run_dir.is_dir():
        return f"--run_dir {run_dir} exists and is not a directory: name a directory for the run"
    parent = run_dir.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"--run_dir {run_dir}: {parent} is not a directory, so the run directory cannot be created"
    # trainer.main checked this before anything; again here, after the sample data was made (into
    # the run directory itself, when --run_dir names the recipe's data folder)
    return other_output_refusal(str(run_dir), output_kinds(run_dir), TRAINING_RUN, "--run_dir")


def batch_host_bytes(
    global_batch_size: int, process_count: int, seq_len: int, loader: LoaderConfig, evaluates: bool, on_cpu: bool
) -> dict[str, int]:
    """A lower bound of the host memory one process's loader batches take, by part (bytes).

    A host batch is one int32 [4, B, T] block (tokens, segment ids, positions, loss mask) plus
    int64 index and example [B], B = G/H. Grain keeps `prefetch` of them ready while
    `read_threads` more are assembled (each with up to 12 bytes per token of special-token
    indices when a batch is all PAD, as the held-out pass's last one), and the loop holds one;
    evaluation runs a second loader of the same G while the training one keeps its prefetch. On
    the CPU backend the device copy of the process's rows is host memory too. The start-up guard
    all-gathers `guard_steps` steps of positions (int64 [G]) and sorts them (~3 copies)."""
    rows = global_batch_size // process_count
    batch = 16 * rows * seq_len + 16 * rows
    loader_bytes = (loader.prefetch + loader.read_threads + 1) * batch + loader.read_threads * 12 * rows * seq_len
    parts = {
        "training loader batches": loader_bytes,
        "held-out loader batches": loader_bytes if evaluates else 0,
        "device copy of the batch (CPU backend)": 16 * rows * seq_len if on_cpu else 0,
        "start-up guard positions": 3 * 8 * global_batch_size * loader.guard_steps,
    }
    return parts


def reader_parts(
    loader: LoaderConfig,
    manifests: Sequence[Manifest],
    eval_sets: Sequence[str] | None,
    evaluates: bool,
    plan: Plan | None = None,
) -> dict[str, int]:
    """The most host memory the loaders' open shard readers hold (each an index of 8 bytes per record
    of its shard, plus its buffers; dataloader/README.md#shards-at-start-up-and-reader-memory), by part (bytes)."""
    held_out = 0
    if evaluates:
        try:
            labels = choose_sets(manifests, eval_sets)
        except ValueError:  # sets the data does not hold: refused by the evaluation's own check
            labels = heldout_sources(manifests)
        held_out = sets_reader_bytes(manifests, labels)
    return {"training shard readers": reader_host_bytes(loader, manifests, plan), "held-out shard readers": held_out}


def memory_problem(
    parts: dict[str, int], available: int | None, global_batch_size: int, process_count: int, seq_len: int
) -> str | None:
    need = sum(parts.values())
    if available is None or need <= available:
        return None
    detail = ", ".join(f"{k} {v / 2**30:.1f}" for k, v in parts.items() if v)
    return (
        f"global_batch_size={global_batch_size} cannot fit this host's memory: its loader needs at least "
        f"{need / 2**30:.1f} GiB ({detail} GiB; {global_batch_size // process_count} rows of {seq_len} "
        f"tokens per host on {process_count} host(s)), and {available / 2**30:.1f} GiB is available. "
        "Lower global_batch_size or spread it over more hosts"
    )


def available_host_bytes() -> int | None:
    """Memory this process may still take: MemAvailable, capped by a cgroup limit (v2 or v1)
    when one is set; None when neither can be read (not Linux)."""

    def read(path: str) -> str | None:
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return None

    found = []
    meminfo = read("/proc/meminfo")
    if meminfo:
        for line in meminfo.splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    for limit, usage in (
        ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
        ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"),
    ):
        lim, use = read(limit), read(usage)
        if lim and use and lim.strip().isdigit() and int(lim) < 1 << 60:
            found.append(max(0, int(lim) - int(use)))
    return min(found) if found else None


# ----------------------------------------------------------------------------- agreement


def _gather(row: np.ndarray | np.generic) -> np.ndarray:
    """[process_count, *row.shape]: every process's row (no collective for one process)."""
    if jax.process_count() == 1:
        return np.asarray(row)[None]
    return np.asarray(multihost_utils.process_allgather(row))


def _agree(problem: str | None, what: str) -> None:
    """Every process raises when any has a problem (its own text, or which process had it)."""
    flags = _gather(np.uint8(problem is not None))
    if flags.any():
        who = [i for i, f in enumerate(flags.reshape(-1)) if f]
        raise StartRefused(problem or f"{what}: process(es) {who} refused to start (their error says why)")


def _attempt(check: Callable[[], Any]) -> str | None:
    try:
        check()
    except (Refused, ValueError, OSError) as e:  # every refusal (LockHeld, ManifestError, DataContractError ...)
        return str(e)
    return None


# ----------------------------------------------------------------------------- shards


def _from_primary(x: np.ndarray) -> np.ndarray:
    """The primary's non-negative int64 ``x`` on every process (one copy sent, not every process's
    gathered), as two int32 halves: JAX's collectives keep int32 unless jax_enable_x64, and an
    mtime in ns needs 61 bits."""
    if jax.process_count() == 1:
        return np.asarray(x, np.int64)

    x = np.asarray(x, np.int64)
    hi, lo = multihost_utils.broadcast_one_to_all(((x >> 31).astype(np.int32), (x & (2**31 - 1)).astype(np.int32)))
    return (np.asarray(hi, np.int64) << 31) + np.asarray(lo, np.int64)


def check_shards(
    manifests: Sequence[Manifest],
    splits: Sequence[str],
    budget_gib: float | None,
    record: dict[str, list] | None = None,
    sample: int = 0,
) -> dict[str, list]:
    """Every shard of `splits` exists on this process; the processes split among them the shards
    `record` (the run's shards verified at earlier starts) does not vouch for, plus `sample` random
    others (verify.to_hash; with no record: every shard), and hash each one (up to `budget_gib` GiB
    per process; beyond it, the structure is checked). Logs what was verified; StartRefused naming
    the first failing shard on every process. Returns the run's new record (the primary writes it
    once it holds the run directory)."""
    shards = verify.listing(manifests, splits)
    h, H = jax.process_index(), jax.process_count()
    missing = next((s for s in shards if not os.path.isfile(s.path)), None)
    _agree(
        None
        if missing is None
        else f"shard missing: {missing.name}; the data changed after the tokenize job "
        f"wrote {missing.manifest} (re-run the job, or restore the shard)",
        "shards",
    )
    # the primary's view of sizes and mtimes, and its draw of the sample, on every process
    local = np.array([verify.stamp(s.path) for s in shards] if h == 0 else [(0, 0)] * len(shards), np.int64)
    stamps = [(int(a), int(b)) for a, b in _from_primary(local.reshape(-1, 2)).tolist()]
    seed = int(_from_primary(np.array(random.SystemRandom().getrandbits(62), np.int64)))
    sizes = [size for size, _ in stamps]
    todo = verify.to_hash(shards, stamps, record or {}, sample, seed)
    budget = None if budget_gib is None else int(budget_gib * 2**30)
    hashed = {todo[j] for j in verify.assign([sizes[i] for i in todo], h, H, budget)}
    checked = set(todo[h::H]) - hashed
    t0 = time.perf_counter()
    results = verify.verify(shards, hashed, checked)
    codes = np.zeros(len(shards), np.int8)
    for i, (code, _) in results.items():
        codes[i] = code
    codes = _gather(codes).max(axis=0)
    codes[sorted(set(range(len(shards))) - set(todo))] = verify.RECORDED
    bad = [i for i, c in enumerate(codes.tolist()) if c in verify.FAILED]
    if bad:
        i = bad[0]
        mine = results.get(i, (0, ""))[1]
        kind = {
            verify.MISMATCH: "its sha256 differs from the manifest's",
            verify.MISSING: "missing",
            verify.UNREADABLE: "cannot be read",
            verify.BAD: "fails the loader's checks",
        }[int(codes[i])]
        raise StartRefused(
            f"shard {shards[i].name}: {kind}{f' ({mine})' if mine else ''}"
            f"{f' and {len(bad) - 1} more shard(s) fail' if len(bad) > 1 else ''}: it changed after the tokenize "
            f"job wrote {shards[i].manifest}. `python -m audit --data {shards[i].manifest}` names every "
            "damaged shard; restore them or re-run the tokenize job"
        )
    if h == 0:
        for line in verify.describe(shards, codes.tolist(), sizes):
            (log.warning if line.startswith("  ") else log.info)("%s", line)
        log.debug(
            "shard check took %.1f s on process 0 (%d shards to hash, split among %d process(es); "
            "verify_data_gib=%s per process, verify_data_sample=%d)",
            time.perf_counter() - t0,
            len(todo),
            H,
            budget_gib,
            sample,
        )
    source.vouch({s.path: stamps[i] for i, s in enumerate(shards) if codes[i] in (verify.HASHED, verify.RECORDED)})
    return verify.new_record(shards, stamps, codes.tolist(), record or {})


# ----------------------------------------------------------------------------- the whole start-up


@dataclasses.dataclass
class NoLock:
    """What a non-primary process holds: the primary holds the run directory for all."""

    def release(self) -> None:
        pass


def prepare(cfg: TrainConfig, run: RunDir) -> tuple[FolderLock | NoLock, Checked]:
    """Every start-up check (module docstring), then the primary's lock on the run directory, and
    the checks' result. Raises StartRefused (exit 2) on every process alike; nothing is written
    before the lock. run: as the command line resolved it (``contract.cli.run_dir``)."""
    h, H = jax.process_index(), jax.process_count()
    primary = h == 0
    _agree(run_dir_problem(run.path), "run_dir")
    if cfg.checkpoint.init_from:
        _agree(glob_problem(Path(cfg.checkpoint.init_from).resolve(), "checkpoint.init_from"), "init_from")
    _agree(_attempt(lambda: probe(run)) if primary else None, "run_dir lock")

    G = cfg.global_batch_size
    found: list[Checked] = []
    _agree(_attempt(lambda: found.append(check(cfg))), "start-up checks")
    checked = found[0]  # (the hosts' topology among them: startup.check_layout)
    seq_len, loader_cfg = checked.seq_len, checked.loader_cfg
    parts = batch_host_bytes(G, H, seq_len, loader_cfg, cfg.eval.every > 0, jax.default_backend() == "cpu")
    parts.update(
        reader_parts(loader_cfg, checked.manifests, checked.eval_labels or None, cfg.eval.every > 0, checked.plan)
    )
    _agree(memory_problem(parts, available_host_bytes(), G, H, seq_len), "memory")
    splits = [TRAIN, HELDOUT] if cfg.eval.every > 0 else [TRAIN]
    try:
        record = check_shards(
            checked.manifests,
            splits,
            cfg.verify_data_gib,
            verify.read_record(run.data_verified),
            cfg.verify_data_sample,
        )
    except OSError as e:  # a shard that vanished between the checks
        raise StartRefused(f"shards: {e}") from None
    lock = FolderLock(run, PURPOSE)
    try:
        problem = _attempt(lock.acquire) if primary else None
        _agree(problem, "run_dir lock")
        # a cache of what was hashed (at worst lost: the next start hashes again), written only when
        # it changed, so a resume refused later leaves the run directory as it found it unless a shard
        # was first verified or re-verified at this start
        if primary and record != verify.read_record(run.data_verified):
            with contextlib.suppress(OSError):
                verify.write_record(run.data_verified, record)
    except KeyboardInterrupt:  # Ctrl-C while the lock is taken: the caller puts the run dir back with it
        raise StartInterrupted(lock if primary else NoLock()) from None
    return (lock if primary else NoLock()), checked


class StartInterrupted(KeyboardInterrupt):
    """Ctrl-C in `prepare` once it may hold the run directory's lock: ``lock``, for `AsFound.undo`."""

    def __init__(self, lock: FolderLock | NoLock):
        super().__init__()
        self.lock = lock


# ----------------------------------------------------------------------------- a refusal writes nothing


@dataclasses.dataclass(frozen=True)
class AsFound:
    """The run directory as a start found it, so that a start refused after it took the lock (a
    resume or an init_from whose settings differ, a mesh or tracker refusal; exit 2) leaves it as
    it was: `AsFound.of(run)` before `prepare`, `undo(lock)` on the refusal (primary only).

    Everything a start writes before its first step is a new top-level entry of the run directory
    (`checkpoints/`, orbax's folder) or the lock file, and the run holds the lock while it writes,
    so: new entries are removed, the lock file is put back as it was (content and times; removed
    if there was none), and a run directory (and parents) the start created is removed whole."""

    run: RunDir
    created: Path | None  # the first folder of the run directory that did not exist
    entries: frozenset[str]  # the run directory's top-level names
    lock: tuple[bytes, int, int] | None  # the lock file's content, atime_ns, mtime_ns

    @classmethod
    def of(cls, run: RunDir) -> AsFound:
        run_dir, created = run.path, None
        for folder in [run_dir, *run_dir.parents]:
            if folder.exists():
                break
            created = folder
        lock_path = run.lock
        lock = None
        if created is None and lock_path.is_file():
            st = lock_path.stat()
            lock = (lock_path.read_bytes(), st.st_atime_ns, st.st_mtime_ns)
        entries = frozenset(os.listdir(run_dir)) if created is None and run_dir.is_dir() else frozenset()
        return cls(run, created, entries, lock)

    def undo(self, lock: FolderLock | NoLock) -> None:
        """Release ``lock`` and put the run directory back as it was found."""
        try:
            if self.created is None:
                for name in set(os.listdir(self.run.path)) - self.entries - {LOCK_NAME}:
                    path = self.run.path / name
                    shutil.rmtree(path) if path.is_dir() and not path.is_symlink() else path.unlink()
        finally:
            lock.release()
        if self.created is not None:
            shutil.rmtree(self.created, ignore_errors=True)
        elif self.lock is None:
            self.run.lock.unlink(missing_ok=True)
        else:
            content, atime, mtime = self.lock
            self.run.lock.write_bytes(content)
            os.utime(self.run.lock, ns=(atime, mtime))
