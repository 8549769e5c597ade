"""Context-parallel attention (``model.context_parallel.attend``) against the unsharded attention
(``model.attention.attend``) on 8 CPU devices: outputs and q/k/v gradients, sliding and full
layers, document segments; the XLA path at context 2, 4 and 8, splash (Pallas interpret mode) at
context 2, its per-device query shard through its slice of the kernel's mask info.

Run by tests/model/test_context_parallel.py in a subprocess (8 host devices before JAX starts):
    python -m tests.model.context_parallel_worker → one JSON line {case: relative difference}
"""

from __future__ import annotations

import dataclasses
import json
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

import model
from model import attention
from model import context_parallel as cp

B, K, G, HD = 2, 2, 2, 16


def segments(rng: np.random.Generator, T: int) -> np.ndarray:
    """int32 [B, T]: documents of random lengths, each row ending in a PAD run (id 0)."""
    seg = np.zeros((B, T), np.int32)
    for r in range(B):
        t, s = 0, 1
        while t < T - 7:
            n = min(int(rng.integers(5, T // 3)), T - 7 - t)
            seg[r, t : t + n], t, s = s, t + n, s + 1
    return seg


def case(C: int, T: int, window: int | None, impl: str, seed: int) -> float:
    """max over (output, dq, dk, dv) of max |cp - ref| / max |ref|, the context run laid out and
    brought back to natural order."""
    cfg = dataclasses.replace(
        model.get_config("olmo3-tiny", compute_dtype="float32"),
        attention_impl=impl,
        head_dim=HD,
        attention_chunk=4 if impl == "xla" else None,
        splash_block_q=128,
        splash_block_kv=128,
    )
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((B, T, K, G, HD)).astype(np.float32)
    k, v = (rng.standard_normal((B, T, K, HD)).astype(np.float32) for _ in range(2))
    seg = segments(rng, T)
    w = rng.standard_normal((B, T, K, G, HD)).astype(np.float32)  # a cotangent: loss = sum(out * w)

    def ref_loss(q: jax.Array, k: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = attention.attend(q, k, v, jnp.asarray(seg), window, cfg)
        return jnp.sum(out * w), out

    (_, ref_out), ref_g = jax.jit(jax.value_and_grad(ref_loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)

    data = min(B, 8 // C)  # rows over data, kv heads over tensor with what is left (context 2: 2 x 2 x 2)
    devices = np.asarray(jax.devices()).reshape(data, 1, C, 8 // (C * data))
    mesh = Mesh(devices, model.CONTEXT_MESH_AXES)
    rules = cp.sharding_config().rules
    split = lambda a: jax.device_put(cp.to_layout(a, C), NamedSharding(mesh, P(("data", "fsdp"), "context")))

    def cp_loss(q: jax.Array, k: jax.Array, v: jax.Array, s: jax.Array) -> tuple[jax.Array, jax.Array]:
        out = cp.attend(q, k, v, s, window, cfg, rules, mesh)
        return jnp.sum(out * cp.to_layout(jnp.asarray(w), C)), out

    fn = jax.jit(jax.value_and_grad(cp_loss, argnums=(0, 1, 2), has_aux=True))
    (_, out), grads = fn(split(q), split(k), split(v), split(seg))
    diffs = [
        float(np.max(np.abs(cp.from_layout(np.asarray(a), C) - np.asarray(b))) / float(np.max(np.abs(b))))
        for a, b in zip((out, *grads), (ref_out, *ref_g))
    ]
    return max(diffs)


def main() -> None:
    assert jax.device_count() == 8
    out = {}
    for C in (2, 4, 8):
        for window in (None, 6, 40):
            out[f"xla C={C} window={window}"] = case(C, 64, window, "xla", C)
    for window in (None, 100):
        out[f"splash C=2 window={window}"] = case(2, 256, window, "splash", 7)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
