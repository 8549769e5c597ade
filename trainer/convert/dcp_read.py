"""An OLMo-core step directory, read one tensor at a time (torch.distributed.checkpoint, no
process group): ``STEP/model_and_optim/.metadata`` + ``*.distcp`` (AI2's trainer's layout; a
directory holding ``.metadata`` itself is accepted too, as OLMo-core's ``dir_is_checkpoint`` does).
Sharded (FSDP) or unsharded alike: DCP assembles a tensor from its chunks.

Everything is checked before a byte is converted (``open_step``): the directory is OLMo-core's
(its metadata reads as a DCP ``Metadata``; the model's tensors are named ``model.*``), and every
chunk the metadata places in a ``.distcp`` file lies inside that file (a torn or partial copy —
an interrupted download, a truncated file — is refused naming the file).

torch is the test extra's (and a converting host's) dependency, never the trainer's: imported here
only, and its absence is one refusal line.
"""

from __future__ import annotations

import io
import os
import pickle
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from contract.errors import Refused

MODEL, OPTIM_STATE = "model.", "optim.state."
MOMENTS = {"exp_avg": "mu", "exp_avg_sq": "nu"}  # SkipStepAdamW's per-parameter state -> optax's


class InputRefused(Refused, ValueError):
    """An input this command cannot convert (one line)."""


def _torch() -> Any:
    try:
        import torch  # torch: a converting host's dependency (the test extra), never the trainer's
        import torch.distributed.checkpoint  # the submodule, loaded for its reader
    except ImportError:
        raise InputRefused(
            "reading an OLMo-core checkpoint needs torch (CPU is enough): pip install torch "
            "--index-url https://download.pytorch.org/whl/cpu"
        ) from None
    return torch


@dataclass
class Step:
    """An OLMo-core checkpoint's ``model_and_optim`` directory, its DCP metadata read."""

    dir: Path
    metadata: Any  # torch.distributed.checkpoint.metadata.Metadata
    reader: Any  # a FileSystemReader whose read_metadata returns the metadata above (read once)

    def shape(self, key: str) -> tuple[int, ...] | None:
        """The shape of a stored tensor, None when the key holds none."""
        md = self.metadata.state_dict_metadata.get(key)
        return tuple(md.size) if md is not None and hasattr(md, "size") else None

    def has_optimizer_state(self) -> bool:
        return any(k.startswith(OPTIM_STATE) for k in self.metadata.state_dict_metadata)

    def nbytes(self, key: str) -> int:
        md = self.metadata.state_dict_metadata[key]
        return int(np.prod(md.size)) * md.properties.dtype.itemsize

    def read(self, key: str) -> np.ndarray:
        """One tensor, whole, as numpy (its own dtype), reading only that tensor's chunks. A tensor
        stored in one chunk (an unsharded save) is torch.load's own tensor: one copy in memory;
        chunks of a sharded save are copied into their place one at a time. InputRefused when
        its bytes cannot be read."""
        torch = _torch()
        try:
            out = self._read(torch, key)
        except InputRefused:
            raise
        except Exception as e:  # noqa: BLE001 - damaged bytes surface as any error of torch.load
            raise InputRefused(f"{self.dir}: cannot read tensor {key!r} ({type(e).__name__}: {e})") from None
        if out.dtype == torch.bfloat16:
            import ml_dtypes  # bfloat16 for numpy (a JAX dependency)

            return out.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
        return out.numpy()

    def _read(self, torch: Any, key: str) -> Any:
        from torch.distributed.checkpoint.metadata import MetadataIndex  # torch: checked by _torch
        from torch.distributed.checkpoint.utils import _create_file_view

        md = self.metadata.state_dict_metadata[key]
        size = tuple(md.size)
        whole = None
        for chunk in md.chunks:
            info = self.metadata.storage_data[MetadataIndex(key, chunk.offsets)]
            if getattr(info, "transform_descriptors", None):  # a compressed save: DCP's own path
                whole = torch.empty(size, dtype=md.properties.dtype)
                with warnings.catch_warnings():  # no_dist=True is the intent: torch warns that it assumes it
                    warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
                    torch.distributed.checkpoint.load({key: whole}, storage_reader=self.reader, no_dist=True)
                return whole
            with open(self.dir / info.relative_path, "rb") as f:
                part = torch.load(_create_file_view(f, info.offset, info.length), map_location="cpu", weights_only=True)
            if tuple(chunk.sizes) == size and len(md.chunks) == 1:
                return part
            if whole is None:
                whole = torch.empty(size, dtype=md.properties.dtype)
            index = tuple(slice(o, o + n) for o, n in zip(chunk.offsets, chunk.sizes))
            whole[index].copy_(part.reshape(tuple(chunk.sizes)))
            del part
        if whole is None:
            raise InputRefused(f"{self.dir}: tensor {key!r} has no stored chunk")
        return whole

    def value(self, key: str) -> Any:
        """A non-tensor entry (DCP stores it as ``torch.save`` bytes: e.g. a param group's ``lr``
        or ``betas``), loaded with ``weights_only``; None when the checkpoint has no such key."""
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex  # torch: _torch

        torch = _torch()
        if not isinstance(self.metadata.state_dict_metadata.get(key), BytesStorageMetadata):
            return None
        info = self.metadata.storage_data[MetadataIndex(key)]
        try:
            with open(self.dir / info.relative_path, "rb") as f:
                f.seek(info.offset)
                return torch.load(io.BytesIO(f.read(info.length)), map_location="cpu", weights_only=True)
        except Exception as e:  # noqa: BLE001 - damaged bytes surface as any error of torch.load
            raise InputRefused(f"{self.dir}: cannot read {key!r} ({type(e).__name__}: {e})") from None

    def model_keys(self) -> Iterator[str]:
        return (k for k in self.metadata.state_dict_metadata if k.startswith(MODEL))


def model_dir(path: Path) -> Path:
    """STEP/model_and_optim, or STEP itself when it holds the DCP metadata."""
    return path if (path / ".metadata").is_file() else path / "model_and_optim"


def open_step(path: str | os.PathLike) -> Step:
    """The step directory's DCP metadata, checked (see the module doc); InputRefused otherwise."""
    torch = _torch()
    from torch.distributed.checkpoint import FileSystemReader  # torch: checked just above

    root = Path(path)
    if not root.is_dir():
        raise InputRefused(f"{root}: no such directory (expected an OLMo-core step directory, e.g. .../step1000)")
    d = model_dir(root)
    if not (d / ".metadata").is_file():
        raise InputRefused(
            f"{root} is not an OLMo-core step directory: no model_and_optim/.metadata (OLMo-core's "
            "checkpointer writes STEP/model_and_optim/{.metadata,*.distcp} and STEP/train/rank*.pt)"
        )
    reader = FileSystemReader(str(d))
    try:
        with open(d / ".metadata", "rb") as f:
            metadata = MetadataUnpickler(f).load()
    except Exception as e:  # noqa: BLE001 - a file that is no pickled DCP Metadata
        raise InputRefused(
            f"{d}/.metadata is not a torch distributed checkpoint's metadata ({type(e).__name__}: {e})"
        ) from None
    if not isinstance(metadata, torch.distributed.checkpoint.metadata.Metadata) or not any(
        k.startswith(MODEL) for k in metadata.state_dict_metadata
    ):
        raise InputRefused(f"{d}/.metadata holds no OLMo-core model (no model.* tensors): not an OLMo-core checkpoint")
    check_files(d, metadata)
    setattr(reader, "read_metadata", lambda *a, **k: metadata)  # read once (DCP's load asks per call)  # noqa: B010
    return Step(d, metadata, reader)


class MetadataUnpickler(pickle.Unpickler):
    """DCP's ``.metadata`` is a pickle. OLMo-core's writer pickles its own copy of torch's
    ``_StorageInfo`` (``olmo_core.distributed.checkpoint.filesystem._StorageInfo``): read as
    torch's, so no OLMo-core install is needed. Any other global than DCP's metadata classes and
    the few plain ones it pickles (``SAFE_GLOBALS``, torch's dtypes and Size) is refused: a pickle
    is code, and a ``.metadata`` is no place for any."""

    def find_class(self, module: str, name: str) -> Any:
        import torch  # torch: checked by open_step
        from torch.distributed.checkpoint.filesystem import _StorageInfo

        if module.startswith("olmo_core.") and name == "_StorageInfo":
            return _StorageInfo
        if (module, name) in SAFE_GLOBALS or module == "torch.distributed.checkpoint.metadata":
            return super().find_class(module, name)
        if module == "torch" and (name == "Size" or isinstance(getattr(torch, name, None), torch.dtype)):
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a checkpoint's .metadata")


# what DCP's metadata pickles besides its own classes (torch 2.x, OLMo-core 3.0.0's writer)
SAFE_GLOBALS = {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
    ("pathlib", "WindowsPath"),
    ("pathlib", "PureWindowsPath"),
    ("collections", "OrderedDict"),
    ("copyreg", "_reconstructor"),
    ("_codecs", "encode"),
    *(
        ("builtins", n)
        for n in ("set", "frozenset", "slice", "complex", "bytearray", "object", "tuple", "list", "dict")
    ),
}


def check_files(d: Path, metadata: Any) -> None:
    """Every stored chunk lies inside its file (InputRefused naming the first that does not)."""
    need: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        end = int(info.offset) + int(info.length)
        need[info.relative_path] = max(need.get(info.relative_path, 0), end)
    for name, end in sorted(need.items()):
        f = d / name
        if not f.is_file():
            raise InputRefused(f"{d}: {name} is missing (the metadata stores tensors in it): a partial copy")
        size = f.stat().st_size
        if size < end:
            raise InputRefused(
                f"{d}: {name} is torn ({size:,} bytes; the metadata stores data up to byte {end:,}): "
                "a partial copy or an interrupted download"
            )


def optim_key(param: str, state: str) -> str:
    """The flattened optimizer-state key of one parameter's state (OLMo-core saves it flattened)."""
    return f"{OPTIM_STATE}{param}.{state}"
