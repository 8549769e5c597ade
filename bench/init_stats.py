"""`python -m bench.init_stats [--small] [--out TABLE.json]` — olmax's initial weights against
OLMo-core 3.0.0's `Transformer.init_weights` (the init OLMo 3 7B trains from), statistically, tensor
by tensor: per tensor (and layer) the mean, the std, the largest |w| in units of the configured std
(the truncation bound: a truncated normal never passes it) and the fraction beyond 2 std (the
tail's shape: 0.0428 for a normal cut at ±3σ, 0.0455 uncut).

OLMo-core's side is its own code on its own config: `TransformerConfig.olmo3_7B` (as
`OLMo-3-1025-7B-pretrain-1.py` builds it; its init fields are llama_like's defaults:
`InitMethod.normal`, `init_std` 0.02, `embedding_init_std` None = init_std), built on the meta
device, its blocks cut to the first and the last (an fp32 7B is ~29 GB; `init_weights` passes
`num_blocks=n_layers` = 32 and each block's own `block_idx`, so a depth-scaled init would still show
in block 31), then `init_weights` on the CPU. olmax's side is `model.init` of `olmo3-7b` with its
true widths and padded vocabulary (128, as AI2 pads it) on 2 layers (its layers are stacked: one
init per stack, no depth in it). `--small` runs a d=256 model of OLMo 3's structure on both sides
(`bench.olmo_reference.model_config`: the harness's OLMo-core model), what the tests check.

Expected for a normal of std σ cut at ±3σ (both sides' rule): std 0.98658 σ, mean 0, max |w| < 3σ.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np

from bench.olmo_reference import model_config

# olmax's parameter path -> OLMo-core's parameter name (in a block: "blocks.<i>.<name>")
OLMAX_TO_OLMO = {
    "embed/embedding": "embeddings.weight",
    "lm_head/kernel": "lm_head.w_out.weight",
    "final_norm/scale": "lm_head.norm.weight",
    "layers/attn/q_proj": "attention.w_q.weight",
    "layers/attn/k_proj": "attention.w_k.weight",
    "layers/attn/v_proj": "attention.w_v.weight",
    "layers/attn/o_proj": "attention.w_out.weight",
    "layers/attn/q_norm/scale": "attention.q_norm.weight",
    "layers/attn/k_norm/scale": "attention.k_norm.weight",
    "layers/mlp/gate_proj": "feed_forward.w1.weight",
    "layers/mlp/up_proj": "feed_forward.w3.weight",
    "layers/mlp/down_proj": "feed_forward.w2.weight",
    "layers/post_attn_norm/scale": "attention_norm.weight",
    "layers/post_mlp_norm/scale": "feed_forward_norm.weight",
}
CHUNK = 1 << 24  # elements summed at a time, in float64


def truncated_std(cutoff: float) -> float:
    """The std of a unit normal cut at ±cutoff, as a fraction of the uncut one."""
    phi = math.exp(-cutoff * cutoff / 2) / math.sqrt(2 * math.pi)
    return math.sqrt(1 - 2 * cutoff * phi / math.erf(cutoff / math.sqrt(2)))


def tensor_stats(x: np.ndarray, std: float) -> dict[str, float]:
    """n, mean, std, max |x| / std and the fraction beyond 2 std of ``x`` (any shape; summed in
    float64 chunks, so a 1.6 GB embedding needs no float64 copy of itself)."""
    flat = x.reshape(-1)
    s = s2 = 0.0
    top, tail = 0.0, 0
    for i in range(0, flat.size, CHUNK):
        c = flat[i : i + CHUNK].astype(np.float64)
        s, s2 = s + float(c.sum()), s2 + float((c * c).sum())
        top = max(top, float(np.abs(c).max()))
        tail += int((np.abs(c) > 2 * std).sum())
    n = flat.size
    mean = s / n
    return {
        "n": n,
        "mean": mean,
        "std": math.sqrt(max(s2 / n - mean * mean, 0.0) * n / max(n - 1, 1)),
        "max_abs_over_std": top / std,
        "frac_beyond_2std": tail / n,
    }


def olmax_stats(mc: Any, seed: int = 0) -> dict[str, dict[str, float]]:
    """{"<olmo-core name>" (blocks.<i>. for layer i): tensor_stats} of ``model.init(mc)``."""
    import jax  # JAX after main's JAX_PLATFORMS=cpu

    import model  # JAX after main's JAX_PLATFORMS=cpu

    params = model.init(mc, jax.random.key(seed))
    out = {}
    for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
        key = "/".join(str(getattr(k, "key", k)) for k in path)
        name = OLMAX_TO_OLMO[key]
        arr = np.asarray(leaf)
        if key.startswith("layers/"):
            for i in range(arr.shape[0]):
                out[f"blocks.{i}.{name}"] = tensor_stats(arr[i], mc.init_std)
        else:
            out[name] = tensor_stats(arr, mc.init_std)
    return out


def olmo_core_stats(config: Any, keep_blocks: tuple[int, ...] | None = None) -> dict[str, dict[str, float]]:
    """{name: tensor_stats} of OLMo-core's ``init_weights`` on ``config`` (a TransformerConfig),
    built on the meta device and, with ``keep_blocks``, cut to those blocks before any memory is
    allocated (init_weights still sees the model's n_layers and each block's block_idx)."""
    import torch  # optional: the test extra (torch)

    model = config.build(init_device="meta")
    if keep_blocks is not None:
        for key in [k for k in model.blocks if int(k) not in keep_blocks]:
            del model.blocks[key]
    with torch.no_grad():
        model.init_weights(device=torch.device("cpu"))
    return {name: tensor_stats(p.detach().numpy(), config.init_std) for name, p in model.named_parameters()}


def init_fields(config: Any) -> dict[str, Any]:
    """The fields of a TransformerConfig that choose its init."""
    return {
        "init_method": str(config.init_method),
        "init_std": config.init_std,
        "embedding_init_std": config.embedding_init_std,
    }


def olmo3_7b(padded_vocab: int) -> Any:
    """OLMo-core's own OLMo 3 7B config (its attention backend set to torch: a CPU has no flash)."""
    from olmo_core.nn.attention import AttentionBackendName  # optional: the test extra (OLMo-core)
    from olmo_core.nn.transformer import TransformerConfig

    return TransformerConfig.olmo3_7B(vocab_size=padded_vocab, attn_backend=AttentionBackendName.torch)


def small_model(**overrides: Any) -> Any:
    """A d=256 model of OLMo 3's structure (3 sliding layers and a full one), 4096 ids."""
    from model.config import get_config  # JAX after main's JAX_PLATFORMS=cpu

    return get_config(
        "olmo3-tiny",
        **{
            "d_model": 256,
            "n_heads": 4,
            "n_kv_heads": 4,
            "head_dim": 64,
            "mlp_hidden": 704,
            "vocab_size": 4096,
            "ranks_sha256": None,
            "eos_id": 4000,
            "pad_id": 4001,
            **overrides,
        },
    )


def compare(small: bool) -> dict[str, Any]:
    """Both sides' stats (the 7B's, or ``small``'s), and the configs they came from."""
    if small:
        mc = small_model()
        config, keep = model_config(mc), None
    else:
        from model.config import get_config  # JAX after main's JAX_PLATFORMS=cpu

        mc = get_config("olmo3-7b", n_layers=2, vocab_pad_multiple=128, vocab_padding="unmasked")
        config = olmo3_7b(mc.padded_vocab_size)
        keep = (0, config.n_layers - 1)
    reference = olmo_core_stats(config, keep)  # first: its memory is freed before olmax's init
    ours = olmax_stats(mc)
    return {
        "olmo_core": {"config": init_fields(config), "n_layers": config.n_layers, "stats": reference},
        "olmax": {"config": {"init_std": mc.init_std, "init_cutoff": mc.init_cutoff}, "stats": ours},
        "expected_std": mc.init_std * truncated_std(mc.init_cutoff),
    }


def counterpart(name: str, ours: dict[str, Any]) -> str:
    """olmax's tensor beside OLMo-core's ``name``: the same name, or (OLMo-core's 7B cut to its
    first and last blocks against olmax's 2 layers) olmax's last layer for a later block."""
    if name in ours or not name.startswith("blocks."):
        return name
    last = max(int(k.split(".")[1]) for k in ours if k.startswith("blocks."))
    return f"blocks.{last}." + name.split(".", 2)[2]


def disagreements(result: dict[str, Any], sigmas: float = 5.0) -> list[str]:
    """How olmax's init differs from OLMo-core's, one line per tensor (empty: the same
    distribution). Norm scales: all ones on both sides. Weights: the same size; each side's std
    within ``sigmas`` standard errors of the cut normal's (``expected_std``) and the two within
    ``sigmas`` of each other (a normal's SE of a std is std/sqrt(2n); of a difference of two,
    std/sqrt(n)); each mean within ``sigmas`` x std/sqrt(n) of 0; the same truncation bound: no
    |w| past ``init_cutoff`` std, and (tensors of >= 4096 entries) some within 0.05 std of it."""
    ours, ref, expected = result["olmax"]["stats"], result["olmo_core"]["stats"], result["expected_std"]
    cutoff = result["olmax"]["config"]["init_cutoff"]
    out = []
    for name, r in ref.items():
        o = ours.get(counterpart(name, ours))
        if o is None or o["n"] != r["n"]:
            out.append(f"{name}: olmax has {None if o is None else o['n']} entries, OLMo-core {r['n']}")
            continue
        if r["std"] == 0.0:  # a norm scale (ones): olmax's must be ones too
            if (o["std"], o["mean"]) != (0.0, 1.0) or r["mean"] != 1.0:
                out.append(
                    f"{name}: norm scale mean/std olmax {o['mean']}/{o['std']}, OLMo-core {r['mean']}/{r['std']}"
                )
            continue
        n, se = r["n"], expected / math.sqrt(2 * r["n"])
        checks = {
            "std vs each other": abs(o["std"] - r["std"]) <= sigmas * expected / math.sqrt(n),
            "olmax std vs expected": abs(o["std"] - expected) <= sigmas * se,
            "OLMo-core std vs expected": abs(r["std"] - expected) <= sigmas * se,
            "means": max(abs(o["mean"]), abs(r["mean"])) <= sigmas * expected / math.sqrt(n),
            "truncation bound": max(o["max_abs_over_std"], r["max_abs_over_std"]) <= cutoff * (1 + 1e-6)
            and (n < 4096 or min(o["max_abs_over_std"], r["max_abs_over_std"]) >= cutoff - 0.05),
        }
        out += [f"{name}: {what} (olmax {o}, OLMo-core {r})" for what, ok in checks.items() if not ok]
    return out


def rows(result: dict[str, Any]) -> Iterator[str]:
    """The table (markdown): per OLMo-core tensor, olmax's of the same kind beside it (counterpart)."""
    ours, ref = result["olmax"]["stats"], result["olmo_core"]["stats"]
    yield (
        "| tensor (OLMo-core name) | n | std OLMo-core | std olmax | mean OLMo-core | mean olmax "
        "| max/σ OLMo-core | max/σ olmax | >2σ OLMo-core | >2σ olmax |"
    )
    yield "|---|---|---|---|---|---|---|---|---|---|"
    for name, r in ref.items():
        o = ours[counterpart(name, ours)]
        yield (
            f"| {name} | {r['n']} | {r['std']:.6f} | {o['std']:.6f} | {r['mean']:.2e} | {o['mean']:.2e} | "
            f"{r['max_abs_over_std']:.4f} | {o['max_abs_over_std']:.4f} | {r['frac_beyond_2std']:.5f} | "
            f"{o['frac_beyond_2std']:.5f} |"
        )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.init_stats", description=__doc__.splitlines()[0])
    p.add_argument("--small", action="store_true", help="the tests' d=256 model instead of the 7B's shapes")
    p.add_argument("--out", help="also write the stats (JSON) here")
    a = p.parse_args(argv)
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    result = compare(a.small)
    print(f"OLMo-core: {result['olmo_core']['config']}, n_layers {result['olmo_core']['n_layers']}")
    print(f"olmax: {result['olmax']['config']}; expected std {result['expected_std']:.6f}")
    for line in rows(result):
        print(line)
    problems = disagreements(result)
    print("same distribution: " + ("yes" if not problems else "NO\n  " + "\n  ".join(problems)))
    if a.out:
        tmp = a.out + ".tmp"
        with open(tmp, "w") as f:
            json.dump(result, f, indent=1, default=lambda o: dataclasses.asdict(o))
        os.replace(tmp, a.out)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
