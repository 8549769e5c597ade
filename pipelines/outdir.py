"""The output folder: which folder the job may write into, and which files it may delete there.

Rules (checked before the job runs, see `check_output`):
- `--output` is a folder: not empty, not a filesystem or bucket root, not a regular file.
- The job writes into a folder only if it is missing or empty, or holds an earlier olmax output
  (its `olmax-output.json` marker or an olmax `manifest.json`), or when asked to explicitly
  (`--overwrite_output`); never into another command's output (a training run, an audit, …:
  `contract.outputs`' one rule, which --overwrite_output does not lift).
- The job deletes only names its own patterns produce (`own_name`), each inside --output, and
  of sources the marker says it wrote there: never a pattern match on the output path.
- One job at a time: the job holds `--output/.olmax.lock` (`lock_output`,
  `contract.lock`) from before its first write or deletion until it ends; a second
  job is refused naming the first. The lock file alone does not make a folder non-empty.

Paths are literal everywhere. Beam's FileSystems treat every path given to `match` *and*
`delete` as a glob (`*`, `?`, `[…]`) and have no literal form, so an output folder called
`o*` would reach `other/`: here local folders are listed and files deleted with `os` calls,
and remote ones through glob-escaped patterns whose results are kept only when they sit
exactly in the folder listed (hand-written because Beam has no escape function).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

from apache_beam.io.filesystems import FileSystems

import contract
from contract import SPLITS
from contract.errors import Refused
from contract.lock import LOCK_NAME, FolderLock, ObjectLockStore
from contract.manifest import valid_source_name
from contract.outputs import TOKENIZE_MARKER, TOKENIZE_OUTPUT, kinds_in, other_output_refusal
from pipelines.shards import TMP_MARK, shard_name, write_bytes

MARKER_NAME = TOKENIZE_MARKER  # "olmax-output.json" (contract.outputs tells a tokenize output by it)
MARKER_KIND = "olmax tokenize output"
REJECTS_DIR, DUPLICATES_DIR = "rejects", "duplicates"
SIDE_DIRS = (REJECTS_DIR, DUPLICATES_DIR)
_TMP = re.escape(TMP_MARK) + "[0-9a-f]{32}"  # shards._commit's temporary suffix: TMP_MARK + uuid4().hex
# shard_name(split, index, count) for any split, index and count
_SHARD = "(?:" + "|".join(re.escape(shard_name(s, 0, 0)).replace("00000", r"\d{5,}") for s in SPLITS) + ")"


class OutputError(Refused, ValueError):
    """--output names a folder the job must not write into."""


def is_local(path: str) -> bool:
    return "://" not in path


def glob_escape(path: str) -> str:
    """`path` as a Beam match pattern that matches only itself (`[*]` is a literal `*`)."""
    return re.sub(r"([*?\[])", r"[\1]", path)


def list_files(folder: str) -> list[str]:
    """Names of the files directly in `folder` (literal path; [] when it does not exist)."""
    if is_local(folder):
        try:
            with os.scandir(folder) as it:
                return sorted(e.name for e in it if e.is_file(follow_symlinks=False) or e.is_symlink())
        except (FileNotFoundError, NotADirectoryError):
            return []
    prefix = folder.rstrip("/") + "/"
    [res] = FileSystems.match([glob_escape(prefix) + "*"])
    return sorted(
        m.path[len(prefix) :]
        for m in res.metadata_list
        if m.path.startswith(prefix) and "/" not in m.path[len(prefix) :]
    )


def delete_files(folder: str, names: Iterable[str]) -> list[str]:
    """Delete files `folder/name` (names without "/"); returns the paths deleted."""
    paths = []
    for name in names:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"not a file name: {name!r}")
        path = FileSystems.join(folder, name)
        if is_local(path):
            os.remove(path)  # a file, never a folder tree (Beam's delete would rmtree one)
        else:
            FileSystems.delete([glob_escape(path)])
        paths.append(path)
    return paths


def own_name(folder: str, name: str, source: str | None = None) -> bool:
    """Is `name` in `folder` ("" = the output's top, a source name, or rejects/duplicates) a name
    this job writes there (for `source`, in the side folders), or a temporary one of those?"""
    if folder == "":
        pattern = rf"(?:{re.escape(contract.MANIFEST_NAME)}|{re.escape(MARKER_NAME)}|{re.escape(LOCK_NAME)}){_TMP}"
    elif folder in SIDE_DIRS:
        pattern = rf"{re.escape(source or '')}\.jsonl(?:{_TMP})?"
    else:
        pattern = rf"{_SHARD}(?:{_TMP})?"
    return re.fullmatch(pattern, name) is not None


def _reader(folder: str) -> Callable[[str], bytes | None]:
    """`name` → the bytes of `folder/name` (any filesystem), None when unreadable."""

    def read(name: str) -> bytes | None:
        try:
            with FileSystems.open(FileSystems.join(folder, name)) as f:
                return f.read()
        except (OSError, ValueError):
            return None

    return read


def _read_json(path: str) -> object:
    try:
        with FileSystems.open(path) as f:
            return json.loads(f.read())
    except (OSError, ValueError):
        return None


def is_olmax_manifest(obj: object) -> TypeGuard[dict[str, Any]]:
    return (
        isinstance(obj, dict)
        and obj.get("format_version") == contract.FORMAT_VERSION
        and obj.get("record_format") == contract.RECORD_FORMAT
        and isinstance(obj.get("sources"), dict)
    )


def sources_written(output: str) -> list[str] | None:
    """Sources an earlier olmax run may have left files for in `output` (from its marker and
    manifest; invalid names are ignored), or None when the folder holds no olmax output."""
    names = set(list_files(output))
    found = None
    if MARKER_NAME in names:
        marker = _read_json(FileSystems.join(output, MARKER_NAME))
        if isinstance(marker, dict) and marker.get("kind") == MARKER_KIND and isinstance(marker.get("sources"), list):
            found = {s for s in marker["sources"] if valid_source_name(s)}
    if contract.MANIFEST_NAME in names:
        manifest = _read_json(FileSystems.join(output, contract.MANIFEST_NAME))
        if is_olmax_manifest(manifest):
            found = (found or set()) | {s for s in manifest["sources"] if valid_source_name(s)}
    return None if found is None else sorted(found)


def check_output(output: str, overwrite: bool = False, look: bool = True) -> tuple[str, list[str]]:
    """Refuse an --output the job must not write into, before anything runs (nothing is written).

    Returns (the output folder as the job uses it: local paths absolute, no trailing "/"; sources
    of an earlier olmax run there). `look=False` skips the listing of a remote folder (a dry run
    has no credentials).
    """
    if not output.strip():
        raise OutputError("--output is empty: name the output folder")
    if not is_local(output):
        _, rest = output.split("://", 1)
        if not rest.strip("/"):
            raise OutputError(f"--output {output!r} names no bucket or folder")
        output = output.rstrip("/")
        if not look:
            return output, []
        if FileSystems.exists(output):
            raise OutputError(f"--output {output} is a file, not a folder")
        listed = [n for n in list_files(output) if n != LOCK_NAME]
        [deep] = FileSystems.match([glob_escape(output + "/") + "**"], limits=[2])
        empty = not listed and not [m for m in deep.metadata_list if m.path != f"{output}/{LOCK_NAME}"]
    else:
        output = os.path.abspath(output)
        if os.path.dirname(output) == output:
            raise OutputError(f"--output {output} is the filesystem root: name a folder for this job")
        if os.path.lexists(output) and not os.path.isdir(output):
            raise OutputError(f"--output {output} exists and is not a folder")
        parent = os.path.dirname(output)
        while not os.path.lexists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise OutputError(f"--output {output}: {parent} is not a folder")
        empty = not os.path.isdir(output) or not [n for n in os.listdir(output) if n != LOCK_NAME]
    if problem := other_output_refusal(
        output, kinds_in(list_files(output), _reader(output)), TOKENIZE_OUTPUT, "--output"
    ):
        raise OutputError(problem + " (--overwrite_output does not lift this)")
    previous = sources_written(output)
    if not empty and previous is None and not overwrite:
        raise OutputError(
            f"--output {output} is a non-empty folder with no olmax output in it (no {MARKER_NAME}, no olmax "
            f"{contract.MANIFEST_NAME}): choose an empty or new folder, or pass --overwrite_output to write into it "
            "anyway (files named as the job names its outputs are then replaced; nothing else is touched)"
        )
    return output, previous or []


def check_own_paths(output: str, sources: Iterable[str], previous: Iterable[str] = ()) -> None:
    """Refuse, before anything is written, an --output where a path the job writes has the wrong
    type (the job would fail mid-run, after the previous manifest was deleted): `rejects`,
    `duplicates` and each `<source>` must be absent or folders (not files, not symlinks: the job
    deletes in them), their `<source>.jsonl` side files and the top-level manifest and marker absent
    or not folders. The folders of `previous` sources (an earlier run's, which this run prunes when
    the mixture dropped them) must not be symlinks either: pruning through one would delete
    shard-named files outside --output. Local folders only (an object store has no folders to
    collide with, nor symlinks)."""
    if not is_local(output):
        return
    sources = list(sources)
    for rel in [*SIDE_DIRS, *sources]:
        path = os.path.join(output, rel)
        if os.path.islink(path) or (os.path.lexists(path) and not os.path.isdir(path)):
            raise OutputError(
                f"--output {output}: {path} must be a folder the job writes into (or absent), "
                "but it is a file or a symlink: move it away or choose another --output"
            )
    for rel in sorted(set(previous) - set(sources)):
        path = os.path.join(output, rel)
        if os.path.islink(path):
            raise OutputError(
                f"--output {output}: {path} (the folder of source {rel!r} of an earlier run, which "
                "this run would prune) is a symlink: the job never deletes through a symlink; "
                "move it away or choose another --output"
            )
    files = [contract.MANIFEST_NAME, MARKER_NAME] + [os.path.join(d, f"{s}.jsonl") for d in SIDE_DIRS for s in sources]
    for rel in files:
        path = os.path.join(output, rel)
        if os.path.isdir(path):
            raise OutputError(
                f"--output {output}: {path} is a folder where the job writes a file: "
                "move it away or choose another --output"
            )


def check_inputs_outside(output: str, files: Iterable[str]) -> None:
    """Refuse an input file inside `output`: the job could overwrite or delete it, and a rerun would
    read the job's own side files back as input (local paths compared after resolving symlinks)."""

    def norm(path: str) -> str:
        return os.path.realpath(path) if is_local(path) else path.rstrip("/")

    root = norm(output) + "/"
    inside = [f for f in files if norm(f).startswith(root)]
    if inside:
        raise OutputError(
            f"--output {output} contains input files of the mixture (e.g. {inside[0]}): write the output somewhere else"
        )


def same_entry(a: str, b: str) -> bool:
    """Do local paths `a` and `b` name one file (as on a case-insensitive filesystem, where
    "Web.jsonl" is "web.jsonl")? False when either is missing, or remote (object stores and
    gs:// are case-sensitive)."""
    if not (is_local(a) and is_local(b)):
        return False
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def dropped_sources(previous: Iterable[str], current: Iterable[str], output: str) -> list[str]:
    """Sources written into `output` before that the mixture no longer has.

    A name that differs from a current one only in case ("Web" then "web") is dropped too —
    its Web/ folder and rejects/duplicates files are another source's — unless the filesystem
    ignores case, where they are this run's own files and must not be pruned. That is decided
    on this run's rejects/<source>.jsonl, so call this after the side files are written."""
    current = list(current)
    by_fold = {n.casefold(): n for n in current}  # the mixture's names are unique ignoring case
    dropped = []
    for name in sorted(set(previous) - set(current)):
        twin = by_fold.get(name.casefold())
        if twin is not None and same_entry(
            FileSystems.join(output, REJECTS_DIR, f"{twin}.jsonl"),
            FileSystems.join(output, REJECTS_DIR, f"{name}.jsonl"),
        ):
            continue
        dropped.append(name)
    return dropped


def marker_bytes(sources: Iterable[str]) -> bytes:
    """The marker: says the folder is an olmax output and which sources may have files in it."""
    return (json.dumps({"kind": MARKER_KIND, "sources": sorted(set(sources))}, indent=1) + "\n").encode()


def _symlinked(folder: str) -> bool:
    """Is local `folder` a symlink? Pruning never lists or deletes through one (its files are
    outside --output); `check_own_paths` refuses these before the job, this catches one made since."""
    if is_local(folder) and os.path.islink(folder):
        logging.warning(
            "%s is a symlink: nothing is deleted through it (the job never touches files outside --output)", folder
        )
        return True
    return False


def prune(output: str, sources: Iterable[str], keep: Iterable[str], dropped: Iterable[str] = ()) -> list[str]:
    """Delete what an earlier or failed run of the job left in `output` and the new manifest will
    not list; returns the paths deleted. Only `own_name` names are deleted, and never through a
    symlinked folder:

    - leftover temporary files of the manifest, the marker, the shards and the side files;
    - shards under <source>/ of `sources` that are not in `keep` (paths relative to output);
    - for `dropped` sources (written there before, not in this mixture): their shards and their
      rejects/ and duplicates/ files (their folder too, when it is left empty, locally).
    """
    sources, keep, dropped = list(sources), set(keep), list(dropped)
    top = [n for n in list_files(output) if own_name("", n)]
    gone = delete_files(output, top)
    for source in sources + dropped:
        folder = FileSystems.join(output, source)
        if _symlinked(folder):
            continue
        stale = [
            n for n in list_files(folder) if own_name(source, n) and (source in dropped or f"{source}/{n}" not in keep)
        ]
        gone += delete_files(folder, stale)
        if source in dropped and is_local(folder) and os.path.isdir(folder) and not os.listdir(folder):
            os.rmdir(folder)
    for side in SIDE_DIRS:
        folder = FileSystems.join(output, side)
        if _symlinked(folder):
            continue
        names = list_files(folder)
        stale = [
            n for n in names for s in sources + dropped if own_name(side, n, s) and (s in dropped or n != f"{s}.jsonl")
        ]
        gone += delete_files(folder, stale)
    return gone


PURPOSE = "python -m pipelines.tokenize"


def lock_output(output: str) -> FolderLock:
    """The job's lock on `output`, taken (LockHeld names the holder). Local folders: flock (a
    killed job's lock is free again). gs:// and other object stores have no flock: the lock is
    an object naming the launching process, best effort (see `contract.lock`): a job
    whose launcher ran on another host is never presumed dead, so after a crash there the
    refusal says which object to delete."""
    if is_local(output):
        return FolderLock(output, PURPOSE).acquire()
    path = FileSystems.join(output, LOCK_NAME)

    def read() -> bytes:
        if not FileSystems.exists(path):
            return b""
        with FileSystems.open(path) as f:
            return f.read()

    store = ObjectLockStore(path, read, lambda data: write_bytes(data, path), lambda: delete_files(output, [LOCK_NAME]))
    return FolderLock(output, PURPOSE, store).acquire()


def remove_temporaries(output: str, sources: Iterable[str]) -> list[str]:
    """Delete the job's own temporary files (`<name>.tmp-<uuid>`) in `output` after a failed job
    (its writers remove theirs; this catches any a killed worker left): only `own_name`
    temporaries, never through a symlinked folder. Returns the paths deleted."""
    gone = delete_files(output, [n for n in list_files(output) if own_name("", n)])
    for folder, names in [*((s, None) for s in sources), *((d, list(sources)) for d in SIDE_DIRS)]:
        path = FileSystems.join(output, folder)
        if _symlinked(path):
            continue
        tmp = [
            n
            for n in list_files(path)
            if TMP_MARK in n and (own_name(folder, n) if names is None else any(own_name(folder, n, s) for s in names))
        ]
        gone += delete_files(path, tmp)
    return gone
