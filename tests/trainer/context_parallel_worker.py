"""The training objective's loss and gradients under context parallelism, context 1, 2, 4, 8 of the
same 8 CPU devices, for the tiny OLMo 3 with a sliding window and packed documents (fp32).

Run by tests/trainer/test_context_parallel_step.py in a subprocess (8 host devices before JAX starts):
    python -m tests.trainer.context_parallel_worker → one JSON line: relative differences vs context 1
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp

import model
from trainer import mesh as mesh_lib
from trainer import step as step_lib
from trainer.build import build
from trainer.checkpointing import files
from trainer.config.schema import load_config

G, T, VOCAB = 16, 64, 512
# a window shorter than a context chunk at context 2 (T / 4 = 16) and longer than one at context 8 (4);
# attention_chunk 2 divides every chunk length: the XLA path's query chunks and key slicing run
# two layers: a sliding one and a full one (the tiny model's pattern at 2 layers)
MODEL = "{compute_dtype: float32, vocab_size: 512, n_layers: 2, sliding_window: 8, attention_chunk: 2}"


def batch_of(rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Packed rows: documents of random lengths (positions restart, segment ids count up), and a
    PAD tail (segment 0, masked out of the loss) in some rows."""
    tokens = rng.integers(1, VOCAB, (G, T)).astype(np.int32)
    seg, pos, mask = (np.zeros((G, T), np.int32) for _ in range(3))
    for r in range(G):
        t, s = 0, 1
        end = T - 2 * r  # row r ends with 2r PAD positions
        while t < end:
            n = min(int(rng.integers(3, 30)), end - t)
            seg[r, t : t + n], pos[r, t : t + n], mask[r, t : t + n] = s, np.arange(n), 1
            t, s = t + n, s + 1
        pos[r, end:] = np.arange(T - end)
    return {"tokens": tokens, "segment_ids": seg, "positions": pos, "loss_mask": mask}


def config(context: int, *extra: str):
    return load_config(
        "trainer/configs/tiny.yaml",
        [
            f"mesh.context={context}",
            "mesh.fsdp=-1",
            f"seq_len={T}",
            f"global_batch_size={G}",
            f"model_overrides={MODEL}",
            *extra,
        ],
    )


def objective_and_grads(
    context: int, params_np: dict, batch_np: dict, *extra: str, paths: tuple[str, ...] = ("fused",), step: bool = False
) -> tuple[dict, dict]:
    """(loss parts, gradient) of the training objective at this context size, by ``paths``: "fused"
    (the fused chunked backward, as the train step runs it), "autodiff" (through the chunked sums);
    with ``step``, the train step's logged loss too."""
    cfg = config(context, *extra)
    b = build(cfg)
    sharding = model.ShardingConfig() if context == 1 else model.context_parallel.sharding_config()
    params = jax.device_put(params_np, b.param_shardings)
    batch = mesh_lib.global_batch(batch_np, b.mesh, G)
    args = (b.model_cfg, sharding, b.mesh, cfg.document_masking, cfg.loss_chunk)

    def laid(bt: dict) -> dict:  # what the train step does first under context parallelism
        return step_lib._laid_out(bt, b.mesh, cfg.document_masking) if context > 1 else bt

    def fused(p: dict, bt: dict) -> tuple[jax.Array, jax.Array]:
        bt = laid(bt)
        n = step_lib._target_count(bt)
        value, sums = step_lib._objective(*args, p, bt, 1.0 / n, cfg.z_loss / n)
        return value, sums.ce / sums.tokens

    def autodiff(p: dict, bt: dict) -> tuple[jax.Array, jax.Array]:
        sums = step_lib._forward(*args, p, laid(bt))
        return (sums.ce + cfg.z_loss * sums.z) / sums.tokens, sums.ce / sums.tokens

    out, grads = {}, {}
    for name, fn in (("fused", fused), ("autodiff", autodiff)):
        if name not in paths:
            continue
        (value, ce), g = jax.jit(jax.value_and_grad(fn, has_aux=True))(params, batch)
        out[name], out[name + "_ce"], grads[name] = float(value), float(ce), jax.device_get(g)
    if step:
        opt = jax.jit(b.tx.init, out_shardings=b.opt_shardings)(params)
        out["step_loss"] = float(b.train_step(params, opt, jnp.float32(1e-3), batch)[2]["loss"])
    out["mesh"], out["microbatches"] = dict(b.mesh.shape), cfg.microbatches
    return out, grads


def rel(a: dict, b: dict) -> float:
    """Largest per-leaf relative error ||a - b|| / ||b|| over the gradient tree."""
    return max(
        float(np.linalg.norm(x - y) / max(np.linalg.norm(y), 1e-30))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def rel_max(a: dict, b: dict) -> float:
    """Largest per-leaf max |a - b| / max |b| (elementwise, against the leaf's largest entry)."""
    return max(
        float(np.max(np.abs(x - y)) / max(np.max(np.abs(y)), 1e-30))
        for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))
    )


def resume_across_context(params_np: dict) -> dict:
    """Params and optimizer state saved from a context-1 mesh (as the trainer's checkpoint items are,
    orbax ``StandardSave``) and restored onto context 2's shardings by the trainer's restore: the
    same arrays (their values do not depend on the context size), laid out as context 2 wants."""
    b1, b2 = build(config(1)), build(config(2))
    params = jax.device_put(params_np, b1.param_shardings)
    state = {"params": params, "opt_state": jax.jit(b1.tx.init, out_shardings=b1.opt_shardings)(params)}
    with tempfile.TemporaryDirectory() as d:
        mngr = ocp.CheckpointManager(Path(d), item_names=("params", "opt_state"))
        mngr.save(0, args=ocp.args.Composite(**{k: ocp.args.StandardSave(v) for k, v in state.items()}))
        mngr.wait_until_finished()
        mngr.close()
        restored = files.restore_items(Path(d) / "0", *b2.abstract_state(), items=("params", "opt_state"))
    pairs = list(zip(jax.tree.leaves(jax.device_get(state)), jax.tree.leaves(jax.device_get(restored))))
    wanted = jax.tree.leaves(b2.param_shardings)
    return {
        "arrays": len(pairs),
        "equal": all(np.array_equal(a, b) for a, b in pairs),
        "context_2_shardings": all(r.sharding == w for r, w in zip(jax.tree.leaves(restored["params"]), wanted)),
    }


def main() -> None:
    assert jax.device_count() == 8, jax.devices()
    rng = np.random.default_rng(0)
    cfg = config(1)
    params_np = jax.device_get(model.init(cfg.model_cfg(), jax.random.key(0)))
    batch_np = batch_of(rng)
    both = ("fused", "autodiff")
    base, base_g = objective_and_grads(1, params_np, batch_np, paths=both)
    result: dict = {"base": base, "runs": {}, "elementwise": {}}
    no_docs = ("document_masking=false",)
    refs = {(): (base, base_g), no_docs: objective_and_grads(1, params_np, batch_np, *no_docs)}
    runs = [
        (2, (), {}),
        (4, (), {}),
        (8, (), {"paths": both}),
        (2, ("microbatches=2",), {"step": True}),
        (4, no_docs, {}),
    ]
    for context, extra, kw in runs:
        ref, ref_g = refs[() if extra != no_docs else no_docs]
        out, g = objective_and_grads(context, params_np, batch_np, *extra, **kw)
        key = f"context={context}" + "".join(f" {e}" for e in extra)
        result["runs"][key] = {
            "mesh": out["mesh"],
            "microbatches": out["microbatches"],
            **{k: abs(out[k] - ref[k]) / abs(ref[k]) for k in ("fused", "autodiff") if k in out},
            # the train step's logged loss (cross-entropy per target token) against context 1's
            **({"step_loss": abs(out["step_loss"] - ref["fused_ce"]) / ref["fused_ce"]} if "step_loss" in out else {}),
            **{f"grad_{k}": rel(g[k], ref_g[k]) for k in g},
        }
        result["elementwise"][key] = {f"grad_{k}": rel_max(g[k], ref_g[k]) for k in g}
    result["base_ce"] = base["fused_ce"]
    result["resume"] = resume_across_context(params_np)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
