"""Read an olmax checkpoint step one tensor (or one layer of a stacked tensor) at a time.

A converter must never hold a 7B checkpoint with its Adam state (~88 GB): this opens the step's
orbax items (``params``, ``opt_state``: an OCDBT key-value store of zarr arrays, one array per
leaf, named by its tree path joined with ".", the layout ``trainer.checkpointing`` writes) with
tensorstore directly and reads the array, or one index of its leading (layer) axis, that the
caller asks for; nothing is cached (``cache_pool`` 0) and one chunk is decoded at a time
(``data_copy_concurrency`` 1), so what a read holds is the part asked for plus one stored chunk.
orbax stores each array in chunks of one device's shard (zstd-compressed, so a chunk is decoded
whole): a stacked ``[L, D, F]`` kernel sharded over ``fsdp`` N is chunked ``[L, D/N, F]``, 5.8 GB / N
for the 7B's MLP kernels; a checkpoint written by one device has one chunk per array.

    step = OlmaxStep.open("runs/s1")                       # the newest step (or step=N, or a step dir)
    step.model_cfg                                         # the ModelConfig the run trained (meta)
    for t in step.tensors("params"): step.read(t)          # t.path ("layers", "mlp", "up_proj"), t.shape
    step.read(t, 3)                                        # layer 3 of a stacked [L, ...] tensor
    adam = step.adam()                                     # AdamState(mu={path: Tensor}, nu=..., count=Tensor) | None

Refused (``OlmaxStepRefused``, one line): a path that is no olmax step or run directory, a step
that is not there, a step that is torn (orbax's temporary directory, no commit marker, no
checksum file: written but never sealed) or whose files do not match their checksums (``verify``
hashes the items read, file by file, before any tensor is read).
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import tensorstore as ts

from contract.errors import Refused
from model.config import ModelConfig
from trainer.checkpointing import files
from trainer.checkpointing.rules import CHECKPOINTS, CHECKSUMS

ARRAY_ITEMS = ("params", "opt_state")
METADATA = "_METADATA"  # orbax's tree metadata of an item (JSON): every leaf's path and shape
COMMIT_MARKER = "commit_success.txt"
Index = int | slice | tuple[int | slice, ...]
_STEP_NAME = re.compile(r"^\d+$")


class OlmaxStepRefused(Refused, ValueError):
    """An input that is no readable olmax checkpoint step (exit 2, one line)."""


@dataclasses.dataclass(frozen=True)
class Tensor:
    """One leaf of an item: its tree path, global shape and stored dtype (numpy's name; ml_dtypes'
    ``bfloat16`` for a bf16 leaf)."""

    item: str
    path: tuple[str, ...]
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def key(self) -> str:
        """The leaf's name in the item's key-value store (orbax joins the path with ".")."""
        return ".".join(self.path)


@dataclasses.dataclass(frozen=True)
class AdamState:
    """SkipStepAdamW's per-parameter moments and update count in an olmax ``opt_state`` item:
    ``mu`` and ``nu`` keyed by the parameter's path (as in ``tensors("params")``), ``count`` the
    Adam state's own (beside mu and nu: ``1.count``, or ``inner_state.1.count`` under the skip
    step, whose other leaves (``losses``, ``grad_norms``, ``seen``, ...) ``tensors`` lists)."""

    mu: dict[tuple[str, ...], Tensor]
    nu: dict[tuple[str, ...], Tensor]
    count: Tensor


def find_step_dir(path: str | Path, step: int | None = None) -> Path:
    """The step directory ``path`` names: a step directory itself, a run directory (its
    ``checkpoints/<step>``) or a run's ``checkpoints/``; the newest sealed step unless ``step``."""
    p = Path(path).absolute()
    if not p.exists():
        raise OlmaxStepRefused(f"{path}: no such file or directory")
    if _is_step_dir(p):
        if step is not None and _STEP_NAME.match(p.name) and int(p.name) != step:
            raise OlmaxStepRefused(f"{path} is step {p.name}, not step {step} (--step)")
        return p
    if p.name.split(".")[0].isdigit() and (p / "params").is_dir():
        raise OlmaxStepRefused(f"{path}: a torn step (orbax's temporary directory, never committed)")
    parent = p / CHECKPOINTS if (p / CHECKPOINTS).is_dir() else p
    steps = sorted(int(c.name) for c in parent.iterdir() if _STEP_NAME.match(c.name) and c.is_dir())
    if not steps:
        raise OlmaxStepRefused(
            f"{path} is not an olmax checkpoint step (no params/ and meta/), nor a run directory with steps in {CHECKPOINTS}/"
        )
    if step is None:
        return parent / str(steps[-1])
    if step not in steps:
        raise OlmaxStepRefused(f"{path} has no step {step} (it has {', '.join(map(str, steps))})")
    return parent / str(step)


def _is_step_dir(p: Path) -> bool:
    """A trainer's step (``checkpoints/<N>``), or any directory holding a sealed step's items (what
    ``from-olmo-core --out`` writes, under the name the user gave)."""
    items = (p / "params").is_dir() and (p / "meta").is_dir()
    named = bool(_STEP_NAME.match(p.name)) or ("orbax-checkpoint-tmp" not in p.name and (p / CHECKSUMS).is_file())
    return items and named


def torn_reason(step_dir: Path, items: tuple[str, ...]) -> str | None:
    """Why ``step_dir`` is not a whole, sealed step for ``items`` (one line), or None."""
    for item in ("meta", *items):
        if not (step_dir / item).is_dir():
            return f"no {item}/ (a partial copy?)"
        if not (step_dir / item / COMMIT_MARKER).is_file() and item != "meta":
            return f"{item}/ has no {COMMIT_MARKER}: orbax never finished writing it"
    if not (step_dir / CHECKSUMS).is_file():
        return f"no {CHECKSUMS}: written but never sealed (the run stopped before its commit)"
    return None


class OlmaxStep:
    """One olmax checkpoint step, read leaf by leaf (see the module docstring)."""

    def __init__(self, step_dir: Path, meta: dict[str, Any]):
        self.dir = step_dir
        # a trainer's step is named by its number; an imported one (from-olmo-core --out) records it
        self.step = int(step_dir.name) if _STEP_NAME.match(step_dir.name) else int(meta.get("step", 0))
        self.meta = meta
        # no cache, and one chunk decoded at a time: a read holds its result and one stored chunk
        self._context = ts.Context({"cache_pool": {"total_bytes_limit": 0}, "data_copy_concurrency": {"limit": 1}})
        self._leaves: dict[str, list[Tensor]] = {}
        self._zarr: dict[str, str] = {}
        self._ocdbt: dict[str, bool] = {}

    @classmethod
    def open(
        cls, path: str | Path, step: int | None = None, items: tuple[str, ...] = ("params",), verify: bool = True
    ) -> OlmaxStep:
        """The step ``path`` names (``find_step_dir``), checked whole for ``items``: refused if torn;
        with ``verify``, its meta and ``items`` files hashed against their recorded sha256 first."""
        step_dir = find_step_dir(path, step)
        if reason := torn_reason(step_dir, items):
            raise OlmaxStepRefused(f"{step_dir}: a torn step: {reason}")
        if verify and (reason := files.verify_step(step_dir, ("meta", *items))):
            raise OlmaxStepRefused(f"{step_dir}: a torn or damaged step: {reason}")
        try:
            meta = files.restore_json(step_dir, "meta")
        except Exception as e:  # noqa: BLE001 - orbax raises many kinds for an unreadable item
            raise OlmaxStepRefused(f"{step_dir}: its meta cannot be read ({type(e).__name__}: {e})") from None
        if not isinstance(meta, dict):
            raise OlmaxStepRefused(f"{step_dir}: its meta is no JSON object (not written by olmax's trainer)")
        return cls(step_dir, meta)

    @property
    def model_cfg(self) -> ModelConfig:
        """The ModelConfig the run trained (its meta's ``model_resolved``)."""
        if not isinstance(self.meta.get("model_resolved"), dict):
            raise OlmaxStepRefused(f"{self.dir}: its meta has no model_resolved (not written by olmax's trainer)")
        return ModelConfig.from_record(self.meta["model_resolved"])

    def has(self, item: str) -> bool:
        return (self.dir / item / METADATA).is_file()

    def tensors(self, item: str) -> list[Tensor]:
        """Every array leaf of ``item`` (``params`` or ``opt_state``), in the metadata's order."""
        if item not in self._leaves:
            self._leaves[item] = list(self._read_leaves(item))
        return self._leaves[item]

    def _read_leaves(self, item: str) -> Iterator[Tensor]:
        try:
            metadata = json.loads((self.dir / item / METADATA).read_text())
        except (OSError, ValueError) as e:
            raise OlmaxStepRefused(f"{self.dir}: {item}/{METADATA} cannot be read ({e})") from None
        self._zarr[item] = "zarr3" if metadata.get("use_zarr3") else "zarr"
        self._ocdbt[item] = metadata.get("use_ocdbt", True) is not False
        for entry in metadata["tree_metadata"].values():
            value = entry["value_metadata"]
            if value.get("value_type") not in ("jax.Array", "np.ndarray") or value.get("skip_deserialize"):
                continue  # None/empty nodes (e.g. optax's EmptyState)
            path = tuple(str(k["key"]) for k in entry["key_metadata"])
            store = self._open(item, ".".join(path))  # (write_shape is one shard's: the array says its own)
            yield Tensor(item, path, tuple(int(d) for d in store.shape), np.dtype(store.dtype.numpy_dtype).name)

    def _open(self, item: str, key: str) -> Any:
        spec = {
            "driver": self._zarr[item],
            # the trainer's steps are OCDBT; from-olmo-core's are one zarr array per leaf (olmax_write)
            "kvstore": {"driver": "ocdbt", "base": f"file://{self.dir / item}/", "path": key}
            if self._ocdbt[item]
            else {"driver": "file", "path": f"{self.dir / item / key}/"},
        }
        try:
            return ts.open(spec, open=True, read=True, context=self._context).result()
        except ValueError as e:  # tensorstore's NOT_FOUND / corrupt metadata
            raise OlmaxStepRefused(
                f"{self.dir}: {item}/{key} cannot be opened ({str(e).splitlines()[0][:300]})"
            ) from None

    def chunk_shape(self, t: Tensor) -> tuple[int, ...]:
        """The shape of ``t``'s stored chunks (orbax: one device's shard); a read decodes every
        chunk it touches whole."""
        return tuple(int(d) for d in self._open(t.item, t.key).chunk_layout.read_chunk.shape)

    def read(self, t: Tensor, index: Index | None = None) -> np.ndarray:
        """``t``'s stored array, or the part ``index`` selects (numpy's basic indexing: ``3``, one
        layer of a stacked ``[L, ...]`` tensor; ``slice(a, b)``, rows a..b; ``(slice(None), slice(a, b))``,
        columns a..b): only that part is read."""
        store = self._open(t.item, t.key)
        part = store if index is None else store[index]
        return np.asarray(part.read().result())

    def read_part(self, t: Tensor, index: tuple[int | slice, ...]) -> np.ndarray:
        """``t[index]`` (numpy's basic indexing): only the chunks it crosses are read."""
        return self.read(t, index)

    def adam(self) -> AdamState | None:
        """The Adam moments and count of the ``opt_state`` item, or None when the step has none
        (no ``opt_state``, or no ``mu``/``nu`` leaf for every parameter)."""
        if not self.has("opt_state"):
            return None
        params = {t.path for t in self.tensors("params")}
        leaves = {t.path: t for t in self.tensors("opt_state")}
        slots: dict[str, dict[tuple[str, ...], Tensor]] = {"mu": {}, "nu": {}}
        prefixes = set()
        for path, t in leaves.items():
            for i, name in enumerate(path):
                if name in slots and path[i + 1 :] in params:
                    slots[name][path[i + 1 :]] = t
                    prefixes.add(path[:i])
                    break
        count = leaves.get((*prefixes.pop(), "count")) if len(prefixes) == 1 else None
        if set(slots["mu"]) != params or set(slots["nu"]) != params or count is None:
            return None
        return AdamState(mu=slots["mu"], nu=slots["nu"], count=count)
