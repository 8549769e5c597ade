"""Global order: position p → plan slot (pure, no I/O).

Training: slot(p) = shuffle_e(p mod N) with epoch e = p div N, where shuffle_e is Grain's
`index_shuffle` permutation of [0, N) seeded with (seed + e) mod 2**32 — exactly what
`grain.MapDataset.range(N).shuffle(seed=seed)[p]` returns (a test checks it), computed
per index so that no permutation is ever materialised and seeking is O(1).
Held-out: the identity over a single finite pass (slot(p) = p for p < N, else -1).

Each order is named by a contract `Order` (name + version) that the plan fingerprint records,
and `dataloader.golden` checks at start-up that the code (and Grain) still computes it.
"""

from __future__ import annotations

import numpy as np

from contract import INDEX_SHUFFLE, Order

SEED_MODULUS = 2**32  # index_shuffle and Grain's shuffle take 32-bit seeds
ROUNDS = 4  # Grain's MapDataset.shuffle uses 4 rounds


# Training: index_shuffle with ROUNDS rounds, per-epoch seed (seed + e) mod 2**32.
TRAIN_ORDER = INDEX_SHUFFLE  # Order("grain.index_shuffle", 1), named in the contract (run.json)
# Held-out: one pass in plan order.
HELDOUT_ORDER = Order("identity", 1)


def check_seed(seed: int) -> int:
    if not 0 <= int(seed) < SEED_MODULUS:
        raise ValueError(f"seed must be in [0, 2**32), got {seed}")
    return int(seed)


def train_slots(positions: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Global positions int64 [k] (≥ 0) → plan slots int64 [k] in [0, n)."""
    check_seed(seed)
    if n <= 0:
        raise ValueError(f"plan size must be positive, got {n}")
    positions = np.asarray(positions, dtype=np.int64)
    if positions.size and positions.min() < 0:
        raise ValueError("positions must be non-negative")
    # Grain (and the JAX it loads) only where a training order is computed: the audit's and compare's
    # --help, and an audit that replays no Grain order, import the plan without it (tests/test_cli.py)
    from grain.experimental import index_shuffle

    epochs, within = np.divmod(positions, n)
    out = np.empty_like(positions)
    for i, (e, j) in enumerate(zip(epochs.tolist(), within.tolist())):
        out[i] = index_shuffle(j, max_index=n - 1, seed=(seed + e) % SEED_MODULUS, rounds=ROUNDS)
    return out


def heldout_slots(positions: np.ndarray, n: int) -> np.ndarray:
    """Held-out positions int64 [k] → slots int64 [k]; -1 past the end of the pass."""
    positions = np.asarray(positions, dtype=np.int64)
    return np.where((positions >= 0) & (positions < n), positions, -1)


def num_heldout_steps(n: int, global_batch_size: int) -> int:
    """Steps of the finite held-out pass: ceil(n / G) (the last one PAD-completed)."""
    return -(-n // global_batch_size)


def slots(spec: Order, positions: np.ndarray, n: int, seed: int) -> np.ndarray:
    """Positions int64 [k] → slots int64 [k] under the order `spec` (-1: past a finite pass)."""
    if spec == TRAIN_ORDER:
        return train_slots(positions, n, seed)
    if spec == HELDOUT_ORDER:
        return heldout_slots(positions, n)
    raise ValueError(
        f"unknown data order {spec.to_json()}; known: {[o.to_json() for o in (TRAIN_ORDER, HELDOUT_ORDER)]}"
    )
