"""An olmax checkpoint step written one tensor slice at a time: what ``checkpoint.init_from``
reads (``trainer.checkpointing``: the items params, opt_state, data, meta; sealed with its
checksums), never holding a whole array.

orbax writes an array only from memory, whole (its jax.Array and numpy handlers copy it), so the
step is made in two passes over orbax's own layout:

1. orbax itself (``CheckpointManager`` with the trainer's item names) saves the step with every
   large leaf (params, Adam's mu and nu) as a one-element stand-in, its other leaves (Adam's
   count, the skip step's history) at their real values. The array items are written without
   OCDBT (``use_ocdbt=False``): one zarr array per leaf, ``ITEM/<leaf.path>/``, which orbax's
   restore reads as it reads its OCDBT steps (it takes each array's shape from its zarr metadata).
2. Each large leaf's zarr array is then created at its full shape with tensorstore, chunked one
   layer (and at most CHUNK_BYTES) per chunk, and filled slice by slice; orbax's per-leaf storage
   record (``write_shape``, ``chunk_shape`` in ``_METADATA`` and ``array_metadatas/``) is set to
   what was written.

Then the step is sealed (``trainer.checkpointing.files.write_checksums``) and renamed into place:
the step appears whole or not at all; until then it lives in a hidden sibling of the output
(``.<name>.<random>.tmp``), removed if anything fails.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
import tensorstore as ts

from trainer.checkpointing.files import fsync_dir, write_checksums
from trainer.checkpointing.rules import ITEMS

CHUNK_BYTES = 64 << 20  # a zarr chunk of a large leaf: one layer's slice, halved until at most this
ARRAY_ITEMS = ("params", "opt_state")
Path_ = tuple[Any, ...]  # a jax key path


def leaf_name(path: Path_) -> str:
    """orbax's name of a leaf without OCDBT: its keys joined by dots (its directory)."""
    parts = []
    for k in path:
        for attr in ("key", "name", "idx"):
            if hasattr(k, attr):
                parts.append(str(getattr(k, attr)))
                break
        else:
            raise TypeError(f"unexpected key {k!r}")
    return ".".join(parts)


def chunk_shape(shape: tuple[int, ...], itemsize: int, stacked: bool) -> list[int]:
    """One layer per chunk for a stacked leaf, then its largest axis halved until the chunk holds at
    most CHUNK_BYTES: a slice's write touches its own chunks only, each encoded in bounded memory."""
    chunk = list(shape)
    if stacked and chunk:
        chunk[0] = 1
    while math.prod(chunk) * itemsize > CHUNK_BYTES:
        axis = max(range(len(chunk)), key=lambda i: chunk[i])
        if chunk[axis] == 1:
            break
        chunk[axis] = -(-chunk[axis] // 2)
    return chunk


def stand_in(x: Any) -> jax.Array:
    """A one-element array of a leaf's rank and dtype (what orbax saves in its place)."""
    return jnp.zeros((1,) * len(x.shape), x.dtype)


class StepWriter:
    """Context manager: the step in a temporary sibling of ``out``; ``fill(item, path, shape,
    dtype, stacked)`` makes one large leaf and returns a slice writer; on a clean exit the step is
    sealed and renamed to ``out``, else the temporary is removed."""

    def __init__(self, out: Path, step: int):
        self.out, self.step = out, step
        self.tmp_root = out.parent / f".{out.name}.{secrets.token_hex(6)}.tmp"
        self.dir = self.tmp_root / str(step)
        self._records: dict[str, dict[str, tuple[list[int], list[int]]]] = {i: {} for i in ARRAY_ITEMS}

    def __enter__(self) -> StepWriter:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp_root.mkdir()
        return self

    def __exit__(self, kind: Any, *rest: Any) -> None:
        try:
            if kind is None:
                self._finish()
        finally:
            shutil.rmtree(self.tmp_root, ignore_errors=True)

    def save_skeleton(self, params: Any, opt_state: Any, data: dict[str, Any], meta: dict[str, Any]) -> None:
        """Pass 1: orbax writes the step (``params``/``opt_state``: stand-ins and small leaves)."""
        array = ocp.StandardCheckpointHandler(use_ocdbt=False)
        handlers = {"params": array, "opt_state": ocp.StandardCheckpointHandler(use_ocdbt=False)}
        handlers |= {"data": ocp.JsonCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
        mgr = ocp.CheckpointManager(self.tmp_root, item_names=ITEMS, item_handlers=handlers)
        try:
            mgr.save(
                self.step,
                force=True,
                args=ocp.args.Composite(
                    params=ocp.args.StandardSave(params),
                    opt_state=ocp.args.StandardSave(opt_state),
                    data=ocp.args.JsonSave(data),
                    meta=ocp.args.JsonSave(meta),
                ),
            )
            mgr.wait_until_finished()
        finally:
            mgr.close()

    def fill(self, item: str, path: Path_, shape: tuple[int, ...], dtype: Any, stacked: bool) -> Any:
        """Pass 2 for one leaf: its zarr array at full shape (replacing the stand-in); returns the
        tensorstore handle (``handle[i].write(slice).result()``)."""
        name = leaf_name(path)
        leaf = self.dir / item / name
        if not (leaf / ".zarray").is_file():
            raise FileNotFoundError(f"orbax wrote no leaf {item}/{name}")
        shutil.rmtree(leaf)
        dtype = np.dtype(dtype)
        chunks = chunk_shape(shape, dtype.itemsize, stacked)
        self._records[item][name] = (list(shape), chunks)
        spec = {
            "driver": "zarr",
            "kvstore": {"driver": "file", "path": str(leaf)},
            "metadata": {
                "shape": list(shape),
                "chunks": chunks,
                "dtype": ts.dtype(dtype.name).to_json() if dtype.name == "bfloat16" else dtype.str,
                "compressor": {"id": "zstd", "level": 1},  # orbax's own
                "fill_value": None,
                "order": "C",
                "dimension_separator": ".",
            },
            "create": True,
        }
        return ts.open(spec).result()

    def _patch_records(self) -> None:
        """orbax's per-leaf storage records of the refilled leaves: what was written."""
        for item, records in self._records.items():
            meta_path = self.dir / item / "_METADATA"
            tree = json.loads(meta_path.read_text())
            for entry in tree["tree_metadata"].values():
                name = ".".join(str(m["key"]) for m in entry["key_metadata"])
                if name in records:
                    entry["value_metadata"]["write_shape"] = records[name][0]
            meta_path.write_text(json.dumps(tree))
            for f in sorted((self.dir / item / "array_metadatas").glob("process_*")):
                rows = json.loads(f.read_text())
                for row in rows["array_metadatas"]:
                    m = row["array_metadata"]
                    if m["param_name"] in records:
                        m["write_shape"], m["chunk_shape"] = records[m["param_name"]]
                f.write_text(json.dumps(rows))

    def _finish(self) -> None:
        self._patch_records()
        write_checksums(self.dir)
        os.rename(self.dir, self.out)  # the step appears whole (never over an existing --out: checked before)
        fsync_dir(self.out.parent)


@contextlib.contextmanager
def quiet_orbax() -> Iterator[None]:
    """orbax logs each save through absl; a converter's output is its progress line."""
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)  # its "Skipping merge of OCDBT checkpoints" warning: no OCDBT here, by design
    try:
        yield
    finally:
        logger.setLevel(level)
