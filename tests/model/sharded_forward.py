"""Run in a subprocess by test_param_sharding.py with 8 host-platform CPU devices.

Creates tiny params sharded on a (data=2, fsdp=2, tensor=2) mesh straight from ``init``, runs
the forward pass with activation constraints, and compares with the single-device result; then
the same for splash attention (interpret mode, inside shard_map: rows over data x fsdp, kv heads
over tensor) against single-device xla attention, logits and gradients. Prints one JSON line.
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
    same_init = all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(params), jax.tree.leaves(reference))
    )
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
    splash = splash_vs_xla(mesh, params, shardings)
    print(
        json.dumps(
            {
                **splash,
                "same_init": same_init,
                "q_shape": list(q.shape),
                "local_q_shape": list(local_q),
                "out_spec": str(out.sharding.spec),
                "max_abs_diff": float(np.abs(np.asarray(out) - single).max()),
                "max_abs": float(np.abs(single).max()),
            }
        )
    )


def splash_vs_xla(mesh, params, shardings) -> dict:
    """Max |Δ| (relative to the largest value) of sharded splash vs single-device xla: logits, grads."""
    T = 128
    splash = tiny_config(max_seq_len=T, attention_impl="splash", splash_block_q=128, splash_block_kv=128)
    xla = tiny_config(max_seq_len=T, attention_impl="xla")
    tokens = np.random.default_rng(1).integers(0, xla.vocab_size, (4, T), dtype=np.int32)
    seg = np.repeat(np.array([[1, 2, 3, 0]], np.int32), [50, 40, 30, 8], axis=1).repeat(4, 0)
    rows = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec(("data", "fsdp")))

    def loss(cfg, p, t, s, **kw):
        logits = model.forward(cfg, p, t, s, **kw)
        return (logits * logits).mean(), logits

    (_, want), want_g = jax.value_and_grad(lambda p: loss(xla, p, tokens, seg), has_aux=True)(params)
    step = jax.jit(
        jax.value_and_grad(
            lambda p, t, s: loss(splash, p, t, s, sharding=model.ShardingConfig(), mesh=mesh), has_aux=True
        )
    )
    (_, got), got_g = step(jax.device_put(params, shardings), jax.device_put(tokens, rows), jax.device_put(seg, rows))
    rel = lambda a, b: float(np.abs(np.asarray(a) - np.asarray(b)).max() / np.abs(np.asarray(b)).max())
    return {
        "splash_logits_rel": rel(got, want),
        "splash_grads_rel": max(rel(a, b) for a, b in zip(jax.tree.leaves(got_g), jax.tree.leaves(want_g))),
        "splash_in_shard_map": "shard_map" in str(jax.make_jaxpr(step)(params, tokens, seg)),
    }


if __name__ == "__main__":
    sys.exit(main())
