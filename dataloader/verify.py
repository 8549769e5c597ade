"""Shard contents checked against the manifest before training on them.

The manifest pins every shard's sha256 (the tokenize job hashes each shard as it writes it);
the loader's open-time checks (record count, writer options, first and last record size) do
not see a shard replaced by another with as many records. `verify` hashes shards and compares
them with the manifest. Shards are hashed at start-up, not lazily in the loader's threads: with
a shuffled order the first batches touch nearly every shard, so a lazy hash would stall the
first steps on reading the whole dataset on every host anyway, and a mismatch found mid-run
would come after steps trained on the replaced shard. At start-up the hosts split the shards
(host h hashes shards h, h + H, ...; on storage every host reads, as the loader requires) and
threads hash several shards at once (hashlib and file reads release the GIL); the cost, against a
raw read of the same bytes, is in bench/RESULTS.md (`python -m bench.shard_hash`).

A byte budget per host bounds the start-up time for datasets too large to hash at each start:
shards past it are only opened and checked for their record count, options and record size,
and `describe` says exactly which shards were hashed and which were not.

Once per run: the shards hashed equal to the manifest are recorded in the run directory
(``data_verified.json``: path → size, mtime, sha256), and a later start of the run hashes only
the shards whose size or mtime changed (or that are not recorded yet: past an earlier start's
budget, a new manifest), plus a random sample of the others (``verify_data_sample``, drawn anew at
each start), split among the hosts as before; a recorded, unchanged shard is not opened at all.
A local or FUSE path gives size and mtime, not a GCS object's generation: a shard rewritten with
its mtime set back is caught only by the sample (or ``verify_data_sample`` set to every shard).

Pure listing, selection and description; `hash_file`, `check_structure` and `verify` are the thin I/O.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import random
from collections.abc import Sequence

from contract import Manifest, record_bytes
from contract.rundir import RunDir

# one shard's outcome (RECORDED: hashed equal at an earlier start of the run, unchanged since)
HASHED, MISMATCH, MISSING, UNREADABLE, CHECKED, BAD, RECORDED = 1, 2, 3, 4, 5, 6, 7
FAILED = (MISMATCH, MISSING, UNREADABLE, BAD)
READ_CHUNK = 1 << 22  # bytes per read while hashing (4 MiB: large reads, GIL released per update)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One shard the run reads: its file, what the manifest says of it, and where it is listed."""

    path: str
    sha256: str
    records: int
    seq_len: int
    manifest: str
    source: str
    split: str
    index: int  # its position among the source's shards of the split

    @property
    def name(self) -> str:
        return f"{self.source}/{self.split} shard {self.index} ({self.path})"


def listing(manifests: Sequence[Manifest], splits: Sequence[str]) -> list[Shard]:
    """Every shard of `splits` in every manifest, in manifest (reading) order."""
    out = []
    for m in manifests:
        for split in splits:
            counters: dict[str, int] = {}
            for ref in m.shards(split):
                i = counters[ref.source] = counters.get(ref.source, -1) + 1
                out.append(Shard(ref.abspath, ref.sha256, ref.records, m.seq_len, m.path or "", ref.source, split, i))
    return out


def assign(sizes: Sequence[int], process_index: int, process_count: int, budget_bytes: int | None) -> list[int]:
    """The shards process h hashes: h, h + H, ... in order while their sizes sum to at most
    `budget_bytes` (None: all of them). The same on every process for the same sizes."""
    mine, used = [], 0
    for i in range(process_index, len(sizes), process_count):
        if budget_bytes is not None and used + sizes[i] > budget_bytes:
            break
        mine.append(i)
        used += sizes[i]
    return mine


Stamp = tuple[int, int]  # (size, mtime_ns) of a shard file
RECORD_VERSION = 1
RECORD_NAME = RunDir.DATA_VERIFIED  # run_dir/data_verified.json: the shards verified at earlier starts


def stamp(path: str) -> Stamp:
    st = os.stat(path)
    return st.st_size, st.st_mtime_ns


def recorded(shard: Shard, now: Stamp, record: dict[str, list]) -> bool:
    """The record vouches for this shard: hashed equal to this sha256 with this size and mtime."""
    entry = record.get(shard.path)
    return entry is not None and tuple(entry[:2]) == tuple(now) and entry[2] == shard.sha256


def to_hash(
    shards: Sequence[Shard], stamps: Sequence[Stamp], record: dict[str, list], sample: int, seed: int
) -> list[int]:
    """The shards this start hashes (pure): every one the record does not vouch for, plus
    ``sample`` of the others drawn with ``seed`` (the same on every process for the same seed)."""
    vouched = [i for i, s in enumerate(shards) if recorded(s, stamps[i], record)]
    changed = sorted(set(range(len(shards))) - set(vouched))
    picked = random.Random(seed).sample(vouched, min(sample, len(vouched)))
    return sorted(changed + picked)


def new_record(
    shards: Sequence[Shard], stamps: Sequence[Stamp], codes: Sequence[int], record: dict[str, list]
) -> dict[str, list]:
    """The record after this start (pure): the shards hashed equal now, with their stamps, and the
    entries that still vouch for an unchanged shard; the other entries are dropped."""
    out = {s.path: list(stamps[i]) + [s.sha256] for i, s in enumerate(shards) if codes[i] == HASHED}
    for i, s in enumerate(shards):
        if codes[i] == RECORDED and recorded(s, stamps[i], record):
            out.setdefault(s.path, record[s.path])
    return out


def read_record(path: str | os.PathLike[str]) -> dict[str, list]:
    """A run's record of verified shards ({} when there is none, or one this olmax cannot read:
    then every shard is hashed again, never trusted)."""
    try:
        with open(path) as f:
            data = json.load(f)
        if data.get("version") == RECORD_VERSION and isinstance(data.get("shards"), dict):
            return data["shards"]
    except (OSError, ValueError, AttributeError):
        pass
    return {}


def write_record(path: str | os.PathLike[str], record: dict[str, list]) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump({"version": RECORD_VERSION, "shards": record}, f, separators=(",", ":"))
    os.replace(tmp, path)


def hash_file(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def check_structure(shard: Shard) -> None:
    """The loader's open-time checks (record count, writer options, first and last record size):
    ValueError naming the shard. A truncated file fails here; a replaced one may not."""
    from dataloader.source import check_shard  # Grain and ArrayRecord: only for the structure check

    check_shard(shard.path, shard.records, record_bytes(shard.seq_len))


def outcome(shard: Shard, hashed: bool) -> tuple[int, str]:
    """(code, detail) of one shard: hashed and compared when `hashed`, else its structure checked."""
    try:
        if not os.path.isfile(shard.path):
            return MISSING, "missing"
        if not hashed:
            check_structure(shard)
            return CHECKED, ""
        got = hash_file(shard.path)
    except OSError as e:
        return UNREADABLE, f"cannot be read ({type(e).__name__}: {e})"
    except (ValueError, RuntimeError) as e:  # the structure check (array_record raises RuntimeError)
        return BAD, str(e)
    if got != shard.sha256:
        return MISMATCH, f"sha256 {got[:16]}…, the manifest says {shard.sha256[:16]}…"
    return HASHED, ""


def verify(
    shards: Sequence[Shard], hash_these: set[int], check_these: set[int], threads: int | None = None
) -> dict[int, tuple[int, str]]:
    """{shard index: (code, detail)} for the shards to hash and the shards to check, `threads` at a time."""
    todo = sorted(hash_these | check_these)
    threads = threads or min(8, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(max(1, threads)) as pool:
        results = pool.map(lambda i: outcome(shards[i], i in hash_these), todo)
        return dict(zip(todo, results))


def size_text(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.2f} MiB"


def ranges(indices: Sequence[int]) -> str:
    """[0, 1, 2, 5, 7, 8] → "0-2, 5, 7-8"."""
    out: list[str] = []
    run: list[int] = []
    for i in sorted(indices):
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
        run = [i]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}")
    return ", ".join(out)


def describe(shards: Sequence[Shard], codes: Sequence[int], sizes: Sequence[int]) -> list[str]:
    """What was verified, exactly: a first line with the totals, then one line per manifest,
    source and split that was not verified whole, naming the shards hashed and those only checked
    (those lines start with two spaces)."""
    hashed = [i for i, c in enumerate(codes) if c == HASHED]
    earlier = [i for i, c in enumerate(codes) if c == RECORDED]
    lines = [
        f"shard contents: {len(hashed)} of {len(shards)} shards hashed and equal to their manifest's "
        f"sha256 ({size_text(sum(sizes[i] for i in hashed))} of {size_text(sum(sizes))})"
        + (
            f"; {len(earlier)} more hashed at an earlier start of this run and unchanged since "
            "(size and mtime; not read now)"
            if earlier
            else ""
        )
    ]
    groups: dict[tuple[str, str, str], list[int]] = {}
    for i, s in enumerate(shards):
        groups.setdefault((s.manifest, s.source, s.split), []).append(i)
    for (manifest, source, split), members in groups.items():
        done = [shards[i].index for i in members if codes[i] in (HASHED, RECORDED)]
        if len(done) == len(members):
            continue
        rest = [shards[i].index for i in members if codes[i] not in (HASHED, RECORDED)]
        lines.append(
            f"  {manifest} {source}/{split}: shards {ranges(done) or 'none'} of {len(members)} hashed; "
            f"NOT hashed: shards {ranges(rest)} (their record count, writer options and record size "
            "checked only: a replaced shard with as many records would pass)"
        )
    return lines
