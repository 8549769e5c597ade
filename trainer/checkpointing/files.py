"""One step directory of trainer.checkpointing.checkpoints, on disk: the sha256 of its files (sealing and
verifying them) and the restore of its items through their own orbax handlers, every verdict
agreed among the processes (gather, agreed: the collectives; the rules are trainer.checkpointing.rules).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from trainer.checkpointing.rules import (
    CHECKSUMS,
    COMMIT_RECORD,
    FAILED,
    ITEMS,
    LIGHT,
    REFUSED,
    RESTORED,
    UNSEALED,
    CheckpointError,
    RefusedConfigError,
    agreed_outcome,
    agreed_reason,
    array_shapes,
    listing_reason,
    shape_differences,
    verdict_code,
)


def gather(row: np.ndarray | np.generic) -> np.ndarray:
    """``[process_count, *row.shape]``: every process's ``row`` (no collective for one process)."""
    if jax.process_count() == 1:
        return np.asarray(row)[None]
    return np.asarray(multihost_utils.process_allgather(row))


def agreed(where: str, attempt: Callable[[], Any], refused: Callable[[Exception], bool]) -> Any:
    """``attempt()`` on every process, then one outcome for all (agreed_outcome): its value where
    it succeeded everywhere, else every process raises (``refused(e)``: a config refusal, exit 2).
    A local error that is no CheckpointError is raised as one (RefusedConfigError if refused),
    naming ``where`` and chained to it, so the trainer reports it instead of a traceback."""
    try:
        value, code, error = attempt(), RESTORED, None
    except Exception as e:  # noqa: BLE001 — classified, then raised on every process
        value, code, error = None, REFUSED if refused(e) else FAILED, e
        if not isinstance(e, CheckpointError):  # an OSError, a ValueError: a clear error, no traceback
            kind = RefusedConfigError if code == REFUSED else CheckpointError
            error = kind(f"checkpoint {where}: {type(e).__name__}: {e}")
            error.__cause__ = e
    stop = agreed_outcome(where, [int(c) for c in gather(np.int32(code))], error)
    if stop is not None:
        raise stop
    return value


# ----------------------------------------------------------------------------- checksums


def step_files(step_dir: Path, commit_record: bool = False) -> list[str]:
    """Every file under ``step_dir`` as a sorted relative POSIX path, the checksum file (and its
    temporary) excluded, and orbax's COMMIT_RECORD unless ``commit_record``: what a seal covers."""
    out = []
    for root, _dirs, files in os.walk(step_dir):
        for name in files:
            rel = (Path(root) / name).relative_to(step_dir).as_posix()
            if not rel.startswith(CHECKSUMS) and (commit_record or rel not in COMMIT_RECORD):
                out.append(rel)
    return sorted(out)


def _sha256(path: Path) -> bytes:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").digest()


def file_digests(step_dir: Path, files: list[str]) -> list[str]:
    """sha256 (hex) of each file. With H processes, process h hashes files h, h+H, ... and all
    gather the rows, so every process gets every digest. A file that cannot be read is an agreed
    error, never a digest: every process raises CheckpointError (the one that failed naming the
    file), since a made-up digest would seal an intact step as damaged, or skip an intact step
    for a passing read error."""
    h, n_proc = jax.process_index(), jax.process_count()
    rows = np.zeros((len(files), hashlib.sha256().digest_size), np.uint8)
    failed = None
    for i in range(h, len(files), n_proc):
        try:
            rows[i] = np.frombuffer(_sha256(step_dir / files[i]), np.uint8)
        except OSError as e:
            failed = f"cannot read {files[i]} ({type(e).__name__}: {e})"
            break
    if n_proc > 1:
        rows = np.bitwise_or.reduce(np.asarray(multihost_utils.process_allgather(rows)), axis=0)
    flags = gather(np.uint8(failed is not None))
    if flags.any():
        who = [i for i, f in enumerate(flags) if f]
        raise CheckpointError(
            f"checkpoint {step_dir}: "
            + (failed or f"process(es) {who} could not read its files")
            + "; nothing is decided on a step whose files cannot be read (not sealed, not "
            "skipped, nothing moved): make the files readable, then resume"
        )
    return [row.tobytes().hex() for row in rows]


def write_checksums(step_dir: Path) -> None:
    """Record the sha256 of every file of a committed step (process 0 writes, atomically). Never
    over an existing checksum file (CheckpointError on every process if any process sees one):
    re-sealing a step would declare whatever is on disk now intact, damage included."""
    path = step_dir / CHECKSUMS
    if gather(np.uint8(path.exists())).any():
        raise CheckpointError(
            f"checkpoint {step_dir}: refusing to overwrite its {CHECKSUMS} (a step's "
            "checksums are recorded once, when it is saved)"
        )
    files = step_files(step_dir)
    digests = file_digests(step_dir, files)
    # every process learns whether process 0 could write it
    agreed(
        str(step_dir),
        (lambda: _write_checksum_file(step_dir, dict(zip(files, digests))))
        if jax.process_index() == 0
        else (lambda: None),
        lambda e: False,
    )


TMP_DIR_SUFFIX = ocp.path.atomicity_types.TMP_DIR_SUFFIX  # orbax's temporary step and item directories
SEAL_THREADS = 8  # hashlib releases the GIL while it hashes, so threads read and hash files in parallel
# run_dir/checkpoints/<step>.tmp/olmax_checksums.json.process_<h>: the digests of the files process h
# wrote, merged by the seal (named under CHECKSUMS, so no listing or seal ever counts it as a step file)
SHARE = f"{CHECKSUMS}.process_"
# orbax's per-process names: ocdbt.process_<h>/..., array_metadatas/process_<h> (written by process h only)
_WRITER = re.compile(r"(?:^|/)(?:[^/]*\.)?process_(\d+)(?:/|$)")


def writer(rel: str) -> int | None:
    """The process that wrote a step's file, by orbax's per-process naming; None for the files the
    primary writes when orbax finalizes the step (metadata, the merged OCDBT manifest)."""
    m = _WRITER.search(rel)
    return int(m.group(1)) if m else None


def _final(rel: str) -> str:
    """A file's path once orbax has finalized the step: until then each item is written into
    ``<item><TMP_DIR_SUFFIX>/``, renamed to ``<item>/`` at finalization (the bytes unchanged)."""
    item, sep, rest = rel.partition("/")
    return item.removesuffix(TMP_DIR_SUFFIX) + sep + rest


def _hash_files(step_dir: Path, files: list[str]) -> list[str]:
    with ThreadPoolExecutor(min(SEAL_THREADS, len(files) or 1)) as pool:
        return [d.hex() for d in pool.map(lambda rel: _sha256(step_dir / rel), files)]


def hash_share(step_dir: Path, h: int) -> int:
    """Process ``h``'s part of a seal: the sha256 of the files it wrote (``writer``), once they are
    all written and before the step is finalized, recorded in ``SHARE<h>`` (durable, atomic).
    Each process hashes only its own files, all at once, so no host reads the step back alone.
    Returns the bytes hashed."""
    files = [rel for rel in step_files(step_dir) if writer(rel) == h]
    digests = _hash_files(step_dir, files)
    path, tmp = step_dir / f"{SHARE}{h}", step_dir / f"{SHARE}{h}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps({"process": h, "files": {_final(rel): d for rel, d in zip(files, digests)}}))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return sum((step_dir / rel).stat().st_size for rel in files)


def _shares(step_dir: Path, present: set[str]) -> dict[str, str]:
    """The digests every process recorded for its own files (``hash_share``), checked: each share
    names only files its process wrote and that are there, else the step is not sealed."""
    out: dict[str, str] = {}
    for path in sorted(step_dir.glob(f"{SHARE}*")):
        if path.name.endswith(".tmp"):
            continue
        share = json.loads(path.read_text())
        h, digests = share["process"], share["files"]
        wrong = [rel for rel in digests if writer(rel) != h or rel not in present]
        if path.name != f"{SHARE}{h}" or wrong:
            raise CheckpointError(
                f"checkpoint {step_dir}: {path.name} names files process {h} did not write "
                f"(e.g. {wrong[:1]}); not sealing this step"
            )
        out.update(digests)
    return out


def seal(step_dir: Path) -> int:
    """Record the sha256 of every file of a step that every process has finished writing and
    that is not committed yet, from one process and without collectives: trainer.checkpointing.checkpoints runs
    it in orbax's commit path (a background thread, on the primary process, after orbax's
    barrier and before the rename that commits the step), where no collective may run. The
    digests each process recorded for its own files (``hash_share``, run by every process
    before that barrier) are taken as they are; only the rest (the files the primary wrote when
    orbax finalized the step, and those of any process that recorded none) is hashed here, by
    SEAL_THREADS threads. The checksum file is durable (fsync) before this returns, so the commit
    publishes a sealed step. A file that cannot be read raises (the step is then never
    committed). Returns the bytes hashed here."""
    files = step_files(step_dir)
    known = _shares(step_dir, set(files))
    rest = [rel for rel in files if rel not in known]
    digests = dict(known) | dict(zip(rest, _hash_files(step_dir, rest)))
    _write_checksum_file(step_dir, {rel: digests[rel] for rel in files})
    for path in step_dir.glob(f"{SHARE}*"):  # merged: the committed step holds one checksum file
        with contextlib.suppress(OSError):
            path.unlink()
    return sum((step_dir / rel).stat().st_size for rel in rest)


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make the entries of a directory durable (a rename, a new file); a file system that cannot
    fsync a directory (some FUSE mounts) is left as it is."""
    with contextlib.suppress(OSError):
        _fsync(path)


def _write_checksum_file(step_dir: Path, digests: dict[str, str]) -> None:
    """The checksum file, written once: durable (the file and its directory entry fsynced),
    atomic and exclusive (never over one that appeared meanwhile)."""
    path, tmp = step_dir / CHECKSUMS, step_dir / f"{CHECKSUMS}.tmp"
    with open(tmp, "w") as f:
        f.write(json.dumps({"algorithm": "sha256", "files": digests}, indent=1))
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)  # atomic and exclusive: fails if a checksum file appeared meanwhile
    except FileExistsError:
        raise CheckpointError(
            f"checkpoint {step_dir}: {CHECKSUMS} appeared while it was being sealed; refusing to overwrite it"
        ) from None
    except OSError:  # no hard links here (some FUSE mounts): the caller's check must do
        os.replace(tmp, path)
    else:
        tmp.unlink()
    fsync_dir(step_dir)


def _local_check(step_dir: Path) -> tuple[str | None, dict[str, str] | None, bytes]:
    """(reason, recorded digests, sha256 of the checksum file) from this process's view of the
    step's listing and checksum file; no file's content is hashed yet."""
    path = step_dir / CHECKSUMS
    if not path.is_file():
        return UNSEALED, None, b""
    try:
        raw = path.read_bytes()
        recorded = json.loads(raw)["files"]
        if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
            raise ValueError("'files' is not a {path: sha256} mapping")
    except (OSError, ValueError, KeyError, TypeError) as e:
        return f"{CHECKSUMS} is unreadable ({type(e).__name__}: {e})", None, b""
    reason = listing_reason(ITEMS, recorded, step_files(step_dir, commit_record=True))
    if reason is not None:
        return reason, None, b""
    return None, recorded, hashlib.sha256(raw).digest()


def verify_step(step_dir: Path, items: tuple[str, ...] | None = None) -> str | None:
    """None if every file of the step matches its recorded sha256, else why not (one line). With
    several processes the verdict is agreed (agreed_reason): every process lists the step and reads
    its checksum file, a step they see differently stops the run (CheckpointError), and only a step
    all of them see whole has its files hashed (a collective, so all must reach it together);
    only the files of ``items`` (e.g. the small meta and data) when given."""
    reason, recorded, digest = _local_check(step_dir)
    row = np.zeros(1 + hashlib.sha256().digest_size, np.uint8)
    row[0] = verdict_code(reason)
    row[1 : 1 + len(digest)] = np.frombuffer(digest, np.uint8)
    rows = gather(row)
    reason = agreed_reason(
        str(step_dir), reason, [int(r[0]) for r in rows], [r[1:].tobytes() for r in rows], jax.process_index()
    )
    if reason is not None:
        return reason
    assert recorded is not None  # read, since the verdict is no reason
    names = sorted(n for n in recorded if items is None or n.split("/")[0] in items)
    bad = [n for n, d in zip(names, file_digests(step_dir, names)) if d != recorded[n]]
    if bad:
        return f"sha256 mismatch in {len(bad)} file(s), e.g. {bad[0]}"
    return None


# ----------------------------------------------------------------------------- items


def array_differences(step_dir: Path, abstract_params: Any, abstract_opt_state: Any) -> list[str]:
    """shape_differences of params and opt_state against a step's orbax metadata (empty when that
    metadata is unreadable: then the step is damaged, not the config changed)."""
    try:  # the item's own handler: the manager's item_metadata lacks one for an item it failed on
        handler = ocp.StandardCheckpointHandler()
        pairs = [
            (item, array_shapes(handler.metadata(step_dir / item)), array_shapes(abstract))
            for item, abstract in (("params", abstract_params), ("opt_state", abstract_opt_state))
        ]
    except Exception:  # noqa: BLE001
        return []
    if not all(have for _, have, _ in pairs):  # no stored arrays at all: damage, not a config
        return []
    return [f"{item}: {line}" for item, have, want in pairs for line in shape_differences(have, want)]


def restore_json(step_dir: Path, item: str) -> Any:
    """A JSON item (data, meta) through its orbax handler."""
    return ocp.JsonCheckpointHandler().restore(step_dir / item, args=ocp.args.JsonRestore())


def restore_items(
    step_dir: Path, abstract_params: Any, abstract_opt_state: Any, items: tuple[str, ...] = ITEMS
) -> dict[str, Any]:
    """``items`` of a step, arrays placed as the abstract trees say. Through the items' own orbax
    handlers, not manager.restore / StandardCheckpointer.restore: those end in orbax's barrier,
    which a process whose restore raised never reaches while the others wait in it; here the
    caller's agreed outcome (``agreed``) is the only collective after a restore attempt."""
    out = {}
    for item in items:
        if item in LIGHT:
            out[item] = restore_json(step_dir, item)
            continue
        handler = ocp.StandardCheckpointHandler()
        try:
            abstract = abstract_params if item == "params" else abstract_opt_state
            out[item] = handler.restore(step_dir / item, args=ocp.args.StandardRestore(abstract))
        finally:
            handler.close()
    return out
