"""Run in a subprocess by test_sharding.py with 8 host-platform CPU devices.

Creates tiny params sharded on a (data=2, fsdp=2, tensor=2) mesh straight from ``init``, runs
the forward pass with activation constraints, and compares with the single-device result.
Prints one JSON line.
"""

from __future__ import annotations

import json
import sys

import jax
import numpy as np
from jax.sharding import Mesh

import model
from tests.model.tiny import SEQ_LEN, randomize, tiny_config


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    cfg = tiny_config()
    mesh = Mesh(np.asarray(jax.devices()).reshape(2, 2, 2), model.MESH_AXES)
    shardings = model.param_shardings(cfg, mesh)
    params = jax.jit(lambda k: model.init(cfg, k), out_shardings=shardings)(jax.random.key(0))
    reference = model.init(cfg, jax.random.key(0))
    same_init = all(np.array_equal(np.asarray(a), np.asarray(b))
                    for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference)))
    q = params["layers"]["attn"]["q_proj"]  # [L, D, H, hd] -> (None, fsdp, tensor, None)
    local_q = q.addressable_shards[0].data.shape

    params = randomize(reference, seed=3)
    tokens = np.random.default_rng(0).integers(0, cfg.vocab_size, (4, SEQ_LEN), dtype=np.int32)
    seg = np.repeat(np.arange(1, 5, dtype=np.int32), SEQ_LEN // 4)[None].repeat(4, 0)
    single = np.asarray(model.forward(cfg, params, tokens, seg))
    sharded_params = jax.device_put(params, shardings)
    batch = jax.device_put(tokens, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp"))))
    seg_b = jax.device_put(seg, batch.sharding)
    out = model.forward(cfg, sharded_params, batch, seg_b, sharding=model.ShardingConfig(), mesh=mesh)
    print(json.dumps({
        "same_init": same_init,
        "q_shape": list(q.shape), "local_q_shape": list(local_q),
        "out_spec": str(out.sharding.spec),
        "max_abs_diff": float(np.abs(np.asarray(out) - single).max()),
        "max_abs": float(np.abs(single).max()),
    }))


if __name__ == "__main__":
    sys.exit(main())
