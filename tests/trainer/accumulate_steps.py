"""Run by test_microbatches.py in a subprocess with 4 CPU devices (fsdp=4): the trainer's own
train step (``trainer.build``) on one fixed batch for several ``microbatches`` / ``loss_chunk``
settings, float32, and what the microbatch split compiles to. Prints one JSON line.

    python -m tests.trainer.accumulate_steps
"""

from __future__ import annotations

import json

import jax

jax.config.update("jax_num_cpu_devices", 4)  # before anything else touches JAX: hence the E402 below

import numpy as np  # noqa: E402

import model  # noqa: E402
from trainer import mesh as mesh_lib  # noqa: E402
from trainer.build import build  # noqa: E402
from trainer.config.schema import load_config  # noqa: E402

G, T, STEPS = 16, 32, 2
# optimizer.eps 1e-3: Adam's first updates are ±lr wherever |grad| >> eps, so with the default 1e-8 a
# gradient that is ~0 up to rounding flips its parameter by 2·lr; a larger eps keeps the update a
# smooth function of the gradient, so "same update" can be asserted at a float32 tolerance.
TINY = [
    "model=olmo3-tiny",
    "model_overrides={compute_dtype: float32, vocab_size: 256, n_layers: 2, "
    "n_kv_heads: 2, sliding_window: 8, eos_id: 1, pad_id: 0}",
    f"global_batch_size={G}",
    "lr=1e-2",
    "schedule.warmup_steps=0",
    "optimizer.eps=1e-3",
    "skip_step.enabled=true",
    "skip_step.min_history=2",
    "skip_step.window=4",
    "z_loss=1e-2",
]
SETTINGS = {
    "n1": ["microbatches=1", "loss_chunk=0"],
    "n2": ["microbatches=2", "loss_chunk=0"],
    "n4": ["microbatches=4", "loss_chunk=0"],
    "n2_chunk5": ["microbatches=2", "loss_chunk=5"],
}


def batches(steps: int) -> list[dict[str, np.ndarray]]:
    """Packed rows: two documents each (positions restart), the last three rows PAD (mask 0)."""
    rng = np.random.default_rng(0)
    out = []
    for _ in range(steps):
        seg = np.where(np.arange(T) < T // 3, 1, 2)[None].repeat(G, 0).astype(np.int32)
        pos = np.where(seg == 1, np.arange(T), np.arange(T) - T // 3).astype(np.int32)
        mask = np.ones((G, T), np.int32)
        mask[-3:] = 0
        seg[-3:] = 0
        out.append(
            {
                "tokens": rng.integers(2, 256, (G, T), dtype=np.int32),
                "segment_ids": seg,
                "positions": pos,
                "loss_mask": mask,
            }
        )
    return out


def run(overrides: list[str]) -> dict:
    cfg = load_config(None, TINY + overrides)
    b = build(cfg)
    params = jax.jit(lambda k: model.init(b.model_cfg, k), out_shardings=b.param_shardings)(jax.random.key(0))
    opt = jax.jit(b.tx.init, out_shardings=b.opt_shardings)(params)
    rows = []
    for s, batch in enumerate(batches(STEPS)):
        mesh_lib.check_microbatches(b.mesh, G, cfg.microbatches)
        params, opt, m = b.train_step(params, opt, np.float32(b.schedule(s)), mesh_lib.global_batch(batch, b.mesh, G))
        rows.append({k: float(v) for k, v in m.items()})
        ev = b.eval_step(params, mesh_lib.global_batch(batch, b.mesh, G))
        rows[-1]["eval_ce"] = float(ev.ce)
    return {"metrics": rows, "params": [np.asarray(x).ravel().tolist() for x in jax.tree.leaves(params)]}


def split_collectives() -> list[str]:
    """Collective ops in the compiled microbatch split of a [G, T] batch sharded over 4 devices."""
    mesh = mesh_lib.make_mesh(load_config(None, TINY).mesh)
    shards = mesh_lib.batch_shards(mesh)
    split = jax.jit(
        lambda x: mesh_lib.split_microbatches(x, 2, shards),
        in_shardings=mesh_lib.batch_sharding(mesh),
        out_shardings=mesh_lib.microbatch_sharding(mesh, 3),
    )
    hlo = split.lower(jax.ShapeDtypeStruct((G, T), np.int32)).compile().as_text()
    ops = ("all-to-all", "all-gather", "collective-permute", "all-reduce", "reduce-scatter")
    return [op for op in ops if op in hlo]


def main() -> None:
    assert jax.device_count() == 4, jax.devices()
    out = {name: run(o) for name, o in SETTINGS.items()}
    print(json.dumps({"runs": out, "split_collectives": split_collectives()}))


if __name__ == "__main__":
    main()
