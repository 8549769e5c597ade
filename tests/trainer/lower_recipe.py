"""Lowers the full OLMo 3 7B recipe's train step on 8 CPU devices, abstractly (nothing allocated).

Run by test_config.py in a subprocess (it needs 8 CPU devices before JAX starts):
    python tests/trainer/lower_recipe.py CONFIG.yaml ...  → one JSON line of facts per config
"""

from __future__ import annotations

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 8)  # before anything else touches JAX: hence the E402 below

import jax.numpy as jnp  # noqa: E402

from trainer import mesh as mesh_lib  # noqa: E402
from trainer.build import build  # noqa: E402
from trainer.config.schema import load_config  # noqa: E402


def main(path: str) -> None:
    cfg = load_config(path, ["mesh.fsdp=-1"])
    b = build(cfg)
    params, opt = b.abstract_state()
    G, T = cfg.global_batch_size, cfg.seq_len
    batch = {
        k: jax.ShapeDtypeStruct((G, T), jnp.int32, sharding=mesh_lib.batch_sharding(b.mesh))
        for k in mesh_lib.MODEL_INPUTS
    }
    lowered = b.train_step.lower(params, opt, jax.ShapeDtypeStruct((), jnp.float32), batch)
    adam = opt.inner_state[1] if hasattr(opt, "inner_state") else opt[1]
    same = jax.tree.map(lambda m, p: m.sharding == p.sharding, adam.mu, params)
    print(
        json.dumps(
            {
                "params": sum(x.size for x in jax.tree.leaves(params)),
                "mesh": dict(b.mesh.shape),
                "param_dtypes": sorted({str(x.dtype) for x in jax.tree.leaves(params)}),
                "moment_dtypes": sorted({str(x.dtype) for x in jax.tree.leaves((adam.mu, adam.nu))}),
                "moments_sharded_like_params": all(jax.tree.leaves(same)),
                "embed_sharded": str(params["embed"]["embedding"].sharding.spec),
                "compute_dtype": b.model_cfg.compute_dtype,
                "padded_vocab": b.model_cfg.padded_vocab_size != b.model_cfg.vocab_size,
                "lowered_chars": len(lowered.as_text()),
            }
        )
    )


if __name__ == "__main__":
    for config in sys.argv[1:]:
        main(config)
