"""Parameter and FLOP accounting (no parameters are allocated).

FLOP convention (``exact=False``, the one the case study's table uses and the trainer reports
for MFU), per token of a training step (forward + backward = 3 × forward):

    6 · N_matmul  +  6 · L · H · hd · S

* ``N_matmul``: parameters that take part in a matmul — every projection and MLP weight plus
  the LM head (vocab_size × D, *without* vocabulary padding); the input embedding (a gather)
  and norm scales are excluded. ``6 = 2`` (multiply-add) ``× 3`` (fwd + 2 bwd matmuls).
* attention: per query and key, ``QKᵀ`` and ``PV`` cost ``2 · 2 · hd`` per head forward, so a
  full ``S × S`` score matrix costs ``12 · H · hd · S`` per token and layer for training; the
  convention counts causal attention as half of that, ``6 · H · hd · S``, in every layer —
  sliding windows are *not* discounted.

For OLMo 3 7B (either head layout), S = 8192: 41.32 + 6.44 = 47.76 GFLOPs/token, so a step of
4 × 8192 tokens per device is 1565 TFLOPs.

``exact=True`` counts the attention keys each query really sees: ``min(q + 1, W)`` for
sliding layers with window W, ``q + 1`` for full layers, averaged over the S queries, at
``12 · H · hd`` per (query, key). (So for full layers it is ``6 · H · hd · (S + 1)``.)

``attention_flops_per_token`` states both for attention alone. OLMo 3 7B at S = 8192, W = 4096
(24 sliding + 8 full layers): the dense-causal convention counts 6.44 GFLOPs/token; the window
really needs 5.24 (81%: a sliding query sees at most 4096 keys, on average 3072.25). MFU divides
the convention's count, so an implementation that skips the window's work (splash's block
skipping, the XLA path's key slicing) shows it as a shorter step, not as fewer FLOPs.
"""

from __future__ import annotations

import math

import jax

from model.config import ModelConfig
from model.transformer import abstract_params

FWD_BWD = 3  # backward costs two matmuls per forward matmul
MADD = 2  # one multiply-add = 2 FLOPs
ATTN_MATMULS = 2  # Q·Kᵀ and P·V


def count_params(cfg: ModelConfig) -> int:
    """Number of parameters ``init(cfg, rng)`` would create (incl. vocabulary padding), via eval_shape."""
    return sum(math.prod(x.shape) for x in jax.tree.leaves(abstract_params(cfg)))


def matmul_params(cfg: ModelConfig) -> int:
    """Weights used in matmuls per token: attention + MLP projections of every layer + LM head.

    Uses the unpadded vocabulary (padding rows do no useful work).
    """
    D, F, L = cfg.d_model, cfg.mlp_hidden, cfg.n_layers
    attn = D * cfg.q_width * 2 + D * cfg.kv_width * 2  # q, o and k, v
    mlp = 3 * D * F
    return L * (attn + mlp) + D * cfg.vocab_size


def _mean_visible_keys(seq_len: int, window: int | None) -> float:
    """Average over queries q < S of the number of keys visible: ``min(q + 1, W)`` (W = S if None)."""
    w = seq_len if window is None else min(window, seq_len)
    # sum_{q<S} min(q+1, w) = w(w+1)/2 + (S - w) * w
    return (w * (w + 1) / 2 + (seq_len - w) * w) / seq_len


def flops_per_token(cfg: ModelConfig, seq_len: int, exact: bool = False) -> float:
    """Training (forward + backward) FLOPs per token at sequence length ``seq_len``; see module doc."""
    if seq_len <= 0:
        raise ValueError(f"seq_len must be positive, got {seq_len}")
    dense = MADD * FWD_BWD * matmul_params(cfg)
    per_key = MADD * FWD_BWD * ATTN_MATMULS * cfg.n_heads * cfg.head_dim  # 12 · H · hd
    if not exact:
        attn = cfg.n_layers * per_key * seq_len / 2
    else:
        attn = sum(per_key * _mean_visible_keys(seq_len, cfg.window_of(i)) for i in range(cfg.n_layers))
    return float(dense + attn)


def attention_flops_per_token(cfg: ModelConfig, seq_len: int) -> dict[str, float]:
    """Training attention FLOPs per token (``QKᵀ`` and ``PV``, forward + backward, all layers):
    ``dense_causal``: the convention MFU counts (half of S² in every layer, windows not discounted);
    ``windowed``: what the masks really need (each query's visible keys, ``exact=True``)."""
    attn = lambda exact: flops_per_token(cfg, seq_len, exact) - MADD * FWD_BWD * matmul_params(cfg)
    return {"dense_causal": attn(False), "windowed": attn(True)}
