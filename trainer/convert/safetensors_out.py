"""Write safetensors shards tensor by tensor, block by block: never a whole shard (nor a whole
tensor) in memory.

A safetensors file is an 8-byte little-endian header length, a JSON header (each tensor's dtype,
shape and byte range in the data that follows, plus ``__metadata__``), then the tensors' bytes.
Every tensor's name, shape and dtype is known before its data (``Planned``), so each shard is made
at its full size first (``allocate``: header written, data region sparse) and each tensor's bytes
are then written at their place: in order from its ``blocks()`` (``write_blocks``: C-order pieces
along its first axis; too many or too few bytes is an error, not a shorter file), or assigned part
by part into a memory map of it (``place``), in any order. The layout is the one
``safetensors.numpy.save_file`` writes (header padded with spaces to 8 bytes, tensors packed
without gaps), so ``safe_open`` and transformers read it as theirs; sharding (``plan_shards``)
and the index file follow transformers' ``save_pretrained``: shards ``model-0000k-of-0000n.safetensors``
of at most ``max_bytes`` each (a larger tensor alone in its own) and ``model.safetensors.index.json``
(``metadata.total_size``, ``weight_map``); one shard is ``model.safetensors`` with no index.
"""

from __future__ import annotations

import dataclasses
import json
import os
import struct
from collections.abc import Callable, Iterator

import numpy as np

WEIGHTS = "model.safetensors"
INDEX = "model.safetensors.index.json"
DTYPE_NAMES = {"float32": "F32", "bfloat16": "BF16", "float16": "F16"}


@dataclasses.dataclass(frozen=True)
class Planned:
    """One tensor to write: its name, shape, dtype and the source of its bytes
    (``blocks()``: arrays of that dtype whose C-order bytes, concatenated, are the tensor's)."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    blocks: Callable[[], Iterator[np.ndarray]] | None  # None: filled through ``place``

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def plan_shards(tensors: list[Planned], max_bytes: int) -> list[list[Planned]]:
    """Consecutive tensors grouped into shards of at most ``max_bytes`` (a tensor over it alone)."""
    shards: list[list[Planned]] = [[]]
    size = 0
    for t in tensors:
        if shards[-1] and size + t.nbytes > max_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += t.nbytes
    return [s for s in shards if s]


def shard_names(n: int) -> list[str]:
    return [WEIGHTS] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def header_bytes(tensors: list[Planned], metadata: dict[str, str]) -> bytes:
    """The length-prefixed JSON header of a file holding ``tensors`` in that order."""
    header: dict[str, object] = {"__metadata__": metadata}
    offset = 0
    for t in tensors:
        header[t.name] = {
            "dtype": DTYPE_NAMES[t.dtype.name],
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text


Where = dict[str, tuple[str, int]]  # tensor name -> (its shard file, the byte offset of its data)


def allocate(folder: str, tensors: list[Planned], max_bytes: int) -> tuple[list[str], Where]:
    """Every shard of ``tensors`` made at its full size, header written, data not yet (zeros, a sparse
    file), + the index when more than one: (the file names, where each tensor's bytes go)."""
    shards = plan_shards(tensors, max_bytes)
    names = shard_names(len(shards))
    where: Where = {}
    for name, shard in zip(names, shards):
        path = os.path.join(folder, name)
        header = header_bytes(shard, {"format": "pt"})
        with open(path, "xb") as f:
            f.write(header)
            f.truncate(len(header) + sum(t.nbytes for t in shard))
        offset = len(header)
        for t in shard:
            where[t.name] = (path, offset)
            offset += t.nbytes
    if len(shards) == 1:
        return names, where
    index = {
        "metadata": {"total_size": sum(t.nbytes for t in tensors)},
        "weight_map": {t.name: name for name, shard in zip(names, shards) for t in shard},
    }
    with open(os.path.join(folder, INDEX), "x") as f:
        json.dump(index, f, indent=2)
        f.write("\n")
    return [*names, INDEX], where


def write_blocks(where: Where, t: Planned, done: Callable[[int], None]) -> None:
    """``t``'s bytes from its ``blocks()``, in order, at its place (``done(n)`` after each block)."""
    if t.blocks is None:
        raise ValueError(f"{t.name}: no blocks to write (it is filled through place)")
    path, offset = where[t.name]
    written = 0
    with open(path, "r+b") as f:
        f.seek(offset)
        for block in t.blocks():
            if block.dtype != t.dtype:
                raise ValueError(f"{t.name}: a block of {block.dtype}, planned {t.dtype}")
            data = np.ascontiguousarray(block)
            if written + data.nbytes > t.nbytes:
                raise ValueError(f"{t.name}: more bytes than planned (shape {t.shape})")
            f.write(data.reshape(-1).view(np.uint8).data)
            written += data.nbytes
            done(data.nbytes)
    if written != t.nbytes:
        raise ValueError(f"{t.name}: {written} bytes written, {t.nbytes} planned (shape {t.shape})")


def place(where: Where, t: Planned) -> np.memmap:
    """``t``'s bytes in its shard as an array of its shape and dtype, to assign into (a memory map:
    flush and drop it to write)."""
    path, offset = where[t.name]
    return np.memmap(path, dtype=t.dtype, mode="r+", offset=offset, shape=t.shape)


def sync(folder: str, names: list[str]) -> None:
    """Every written file on disk (fsync), before the folder is renamed into place."""
    for name in names:
        with open(os.path.join(folder, name), "rb") as f:
            os.fsync(f.fileno())
