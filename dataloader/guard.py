"""Start-up disjointness guard across hosts.

Every host computes the global positions its sampler will read for the first steps,
the hosts all-gather them (`jax.experimental.multihost_utils.process_allgather`), and
each host checks, with the pure `find_violations`, that for every step the host slices
are disjoint, have no repeats, and together are exactly that step's global batch
[s·G, (s+1)·G). Any violation aborts with a message naming the hosts involved. This is
what catches a sampler that shards twice (slice per host, then Grain `ShardOptions`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from contract.errors import Stopped

_MAX_LISTED = 8  # positions quoted per violation in the error message
_LO_MASK = (1 << 31) - 1


class GuardError(Stopped, RuntimeError):
    """Hosts would read overlapping positions or would not cover a global batch."""


def _quote(values: Iterable[Any]) -> str:
    values = sorted(int(v) for v in values)
    more = f" … (+{len(values) - _MAX_LISTED})" if len(values) > _MAX_LISTED else ""
    return str(values[:_MAX_LISTED]) + more


def find_violations(positions: np.ndarray, counts: np.ndarray, global_batch_size: int, first_step: int) -> list[str]:
    """Pure check of gathered positions.

    positions: int64 [H, S, B] — positions host h reads at step first_step + s
      (rows past counts[h, s] are padding and ignored).
    counts: int64 [H, S] — how many positions host h's sampler returned at that step.
    Returns human-readable violations (empty when the hosts tile every batch exactly).
    """
    n_hosts, n_steps, _ = positions.shape
    per_host = global_batch_size // n_hosts if global_batch_size % n_hosts == 0 else None
    problems: list[str] = []
    for s in range(n_steps):
        step = first_step + s
        batch = set(range(step * global_batch_size, (step + 1) * global_batch_size))
        owner: dict[int, int] = {}
        for h in range(n_hosts):
            if per_host is not None and counts[h, s] != per_host:
                problems.append(f"step {step}: host {h} reads {int(counts[h, s])} positions, expected G/H = {per_host}")
            mine = positions[h, s, : counts[h, s]].tolist()
            repeated = {p for p, c in collections.Counter(mine).items() if c > 1}
            if repeated:
                problems.append(f"step {step}: host {h} reads positions {_quote(repeated)} more than once")
            outside = set(mine) - batch
            if outside:
                problems.append(
                    f"step {step}: host {h} reads positions {_quote(outside)} "
                    f"outside the global batch [{min(batch)}, {max(batch) + 1})"
                )
            for other in sorted({owner[p] for p in mine if p in owner}):
                shared = {p for p in mine if owner.get(p) == other}
                problems.append(f"step {step}: hosts {other} and {h} both read positions {_quote(shared)}")
            for p in mine:
                owner.setdefault(p, h)
        missing = batch - set(owner)
        if missing:
            problems.append(
                f"step {step}: positions {_quote(missing)} of the global batch are "
                f"read by no host (hosts 0..{n_hosts - 1})"
            )
    return problems


def local_positions(
    positions_fn: Callable[[int], np.ndarray], first_step: int, steps: int, width: int
) -> tuple[np.ndarray, np.ndarray]:
    """positions_fn(step) for `steps` steps → (int64 [S, width] padded with -1, int64 [S])."""
    out = np.full((steps, width), -1, dtype=np.int64)
    counts = np.zeros(steps, dtype=np.int64)
    for s in range(steps):
        p = np.asarray(positions_fn(first_step + s), dtype=np.int64).ravel()
        counts[s] = len(p)
        out[s, : min(len(p), width)] = p[:width]
    return out, counts


def _allgather_int64(x: np.ndarray) -> np.ndarray:
    """process_allgather for int64 values without relying on jax_enable_x64: sends the
    value as two non-negative int32 halves (positions ≥ 2**31 survive) → [H, *x.shape]."""
    from jax.experimental import multihost_utils  # JAX only for several hosts (the checks are pure)

    shifted = x + 1  # padding (-1) → 0, so both halves stay non-negative
    hi = (shifted >> 31).astype(np.int32)
    lo = (shifted & _LO_MASK).astype(np.int32)
    g_hi, g_lo = multihost_utils.process_allgather((hi, lo))
    return (np.asarray(g_hi, np.int64) << 31) + np.asarray(g_lo, np.int64) - 1


def check_hosts(
    positions_fn: Callable[[int], np.ndarray],
    first_step: int,
    steps: int,
    global_batch_size: int,
    process_index: int,
    process_count: int,
) -> None:
    """Runs the start-up guard for this host; raises GuardError on any violation.

    With one JAX process per host (jax.process_count() == process_count) the positions
    are all-gathered and the full check runs on every host. When the topology is only
    simulated inside fewer JAX processes (tests, single-host debugging) nothing can be
    gathered, so only this host's own part is checked: the right count, no repeats,
    nothing outside the step's global batch.
    """
    import jax  # JAX only for several hosts (the checks are pure)

    width = max(global_batch_size // process_count, 1)
    # One extra column so that a sampler returning too many positions is seen.
    local, counts = local_positions(positions_fn, first_step, steps, width + 1)
    if process_count > 1 and jax.process_count() == process_count:
        gathered = _allgather_int64(np.concatenate([counts[:, None], local], axis=1))
        all_counts, all_positions = gathered[:, :, 0], gathered[:, :, 1:]
        problems = find_violations(all_positions, all_counts, global_batch_size, first_step)
    elif process_count == 1:
        problems = find_violations(local[None], counts[None], global_batch_size, first_step)
    else:
        problems = []
        for s in range(steps):
            step, mine = first_step + s, local[s, : counts[s]].tolist()
            if counts[s] != width:
                problems.append(
                    f"step {step}: host {process_index} reads {int(counts[s])} positions, expected G/H = {width}"
                )
            if len(set(mine)) != len(mine):
                problems.append(f"step {step}: host {process_index} reads a position twice")
            lo, hi = step * global_batch_size, (step + 1) * global_batch_size
            if any(not lo <= p < hi for p in mine):
                problems.append(f"step {step}: host {process_index} reads outside [{lo}, {hi})")
    if problems:
        raise GuardError(
            f"data-loader start-up guard failed (host {process_index} of {process_count}, "
            f"steps {first_step}..{first_step + steps - 1}): hosts would not read disjoint "
            "slices covering each global batch:\n  " + "\n  ".join(problems)
        )
