"""`python tests/trainer/convert/write_sharded_step.py RUN_DIR D_MODEL`: an olmax checkpoint step of
a model with the real (padded) vocabulary and width D_MODEL, its arrays sharded over 8 CPU devices
as a multi-device run saves them (orbax chunks each array by device shard). Run with
XLA_FLAGS=--xla_force_host_platform_device_count=8 (the test sets it)."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import jax
import numpy as np

import model
from contract.rundir import RunDir
from tests.trainer.checkpoint_fixtures import Loader
from trainer.checkpointing.checkpoints import Checkpoints
from trainer.config.schema import CheckpointConfig


def config(d_model: int) -> model.ModelConfig:
    return model.get_config(
        "olmo3-tiny",
        d_model=d_model,
        n_heads=4,
        n_kv_heads=4,
        head_dim=d_model // 4,
        mlp_hidden=2 * d_model,
        n_layers=2,
        vocab_pad_multiple=128,
        vocab_padding="unmasked",
        ranks_sha256=None,  # no tokenizer files: the export's weights alone
        compute_dtype="float32",
    )


def main(run_dir: str, d_model: int) -> None:
    cfg = config(d_model)
    mesh = jax.sharding.Mesh(np.array(jax.devices()), ("x",))
    rng = np.random.default_rng(0)

    def sharded(x: jax.ShapeDtypeStruct) -> jax.Array:
        axis = int(np.argmax([d if d % 8 == 0 else 0 for d in x.shape]))  # the largest axis 8 divides
        spec = [None] * len(x.shape)
        spec[axis] = "x"
        value = rng.standard_normal(x.shape, np.float32) * 0.02
        return jax.device_put(value, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(*spec)))

    params = jax.tree.map(sharded, model.abstract_params(cfg))
    ckpt = Checkpoints(RunDir(Path(run_dir).absolute()), CheckpointConfig())
    meta = {"step": 1, "model_resolved": dataclasses.asdict(cfg)}
    ckpt.save(1, params, {"count": np.zeros((), np.int32)}, Loader(1), meta)
    ckpt.close()
    print(sum(x.nbytes for x in jax.tree.leaves(params)))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
