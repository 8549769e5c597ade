"""A torch distributed checkpoint (DCP) directory written one tensor at a time: each ``add`` is
its own ``torch.distributed.checkpoint.save`` into a scratch folder (one process, no process
group), whose ``.distcp`` file moves into the directory under a unique name and whose metadata
merges into the one ``.metadata`` ``finish`` writes. What DCP's reader (and OLMo-core's
``load_state_dict``) sees is one checkpoint; this process never holds more than the tensor it adds.
"""

from __future__ import annotations

import dataclasses
import pickle
import shutil
import warnings
from pathlib import Path
from typing import Any


class DcpWriter:
    def __init__(self, folder: Path, sync_files: bool = True):
        import torch.distributed.checkpoint as dcp  # torch: a converting host's dependency (the test extra)

        self.dcp, self.folder, self.sync = dcp, folder, sync_files
        self.folder.mkdir(parents=True)
        self.merged: Any = None
        self.parts = 0

    def add(self, values: dict[str, Any]) -> None:
        """Save ``values`` ({flat key: tensor, or any picklable value: DCP stores it as bytes})."""
        from torch.distributed.checkpoint import FileSystemReader  # torch: imported by __init__

        part = self.folder / f".part{self.parts}"
        writer = self.dcp.FileSystemWriter(str(part), sync_files=self.sync)
        with warnings.catch_warnings():  # no_dist=True is the intent: torch warns that it assumes it
            warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
            self.dcp.save(values, storage_writer=writer, no_dist=True)
        md = FileSystemReader(str(part)).read_metadata()
        renamed = {}
        for f in part.glob("*.distcp"):
            renamed[f.name] = f"p{self.parts}{f.name}"
            f.rename(self.folder / renamed[f.name])
        md.storage_data = {
            k: dataclasses.replace(v, relative_path=renamed[v.relative_path]) for k, v in md.storage_data.items()
        }
        shutil.rmtree(part)
        self.parts += 1
        if self.merged is None:
            md.storage_meta = None
            self.merged = md
            return
        self.merged.state_dict_metadata.update(md.state_dict_metadata)
        self.merged.storage_data.update(md.storage_data)

    def finish(self) -> None:
        """The merged ``.metadata`` (last: without it the directory is no checkpoint)."""
        with open(self.folder / ".metadata", "wb") as f:
            pickle.dump(self.merged, f)
