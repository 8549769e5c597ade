"""trainer.convert.dcp_read: a tensor stored in several chunks (a sharded save: FSDP ranks each
write their rows) is read whole, each chunk in its place; a .metadata that would load any class
outside torch is refused (a pickle is code)."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest
import torch

from trainer.convert.dcp_read import InputRefused, open_step
from trainer.convert.dcp_write import DcpWriter


def test_a_tensor_saved_in_row_shards_is_read_whole(tmp_path):
    """Two row shards of one [6, 4] tensor, as two ranks' chunks (offsets (0, 0) and (3, 0)) of one
    key: the metadata DCP writes for an FSDP-sharded parameter."""
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    full = torch.arange(24, dtype=torch.float32).reshape(6, 4)
    out = DcpWriter(tmp_path / "model_and_optim", sync_files=False)
    out.add({"model.w": full[:3].clone()})
    out.add({"model.w_rest": full[3:].clone()})
    md = out.merged
    rest = md.state_dict_metadata.pop("model.w_rest")
    info = next(v for k, v in list(md.storage_data.items()) if k.fqn == "model.w_rest")
    md.storage_data = {k: v for k, v in md.storage_data.items() if k.fqn != "model.w_rest"}
    md.storage_data[MetadataIndex("model.w", torch.Size([3, 0]))] = info
    w = md.state_dict_metadata["model.w"]
    w.chunks.append(ChunkStorageMetadata(offsets=torch.Size([3, 0]), sizes=rest.size))
    md.state_dict_metadata["model.w"] = dataclasses.replace(w, size=torch.Size([6, 4]))
    out.finish()
    np.testing.assert_array_equal(open_step(tmp_path).read("model.w"), full.numpy())


class Boom:
    def __reduce__(self):
        return (print, ("this would run",))


def test_a_metadata_pickle_of_other_code_is_refused(tmp_path):
    (tmp_path / "model_and_optim").mkdir()
    (tmp_path / "model_and_optim" / ".metadata").write_bytes(pickle.dumps(Boom()))
    with pytest.raises(InputRefused, match="refusing to load builtins.print"):
        open_step(tmp_path)
