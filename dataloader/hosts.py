"""Host slices of global batches (pure, no I/O).

Global batch b is the positions [b·G, (b+1)·G). Host h of H reads the contiguous slice
[b·G + h·G/H, b·G + (h+1)·G/H). So a global batch never depends on H, slices never
overlap and together cover the batch.
"""

from __future__ import annotations

import numpy as np


def check_topology(global_batch_size: int, process_index: int, process_count: int) -> int:
    """Validates (G, h, H); returns the per-host batch G/H."""
    if global_batch_size <= 0:
        raise ValueError(f"global_batch_size must be positive, got {global_batch_size}")
    if process_count <= 0 or not 0 <= process_index < process_count:
        raise ValueError(f"process_index {process_index} not in [0, {process_count})")
    if global_batch_size % process_count:
        raise ValueError(
            f"process_count {process_count} does not divide global_batch_size "
            f"{global_batch_size}: every host must read the same number of rows"
        )
    return global_batch_size // process_count


def host_slice(global_batch_size: int, process_index: int, process_count: int) -> tuple[int, int]:
    """[start, stop) of host h's rows within a global batch."""
    per_host = check_topology(global_batch_size, process_index, process_count)
    return process_index * per_host, (process_index + 1) * per_host


def host_positions(step: int, global_batch_size: int, process_index: int, process_count: int) -> np.ndarray:
    """Global positions int64 [G/H] that host h of H reads at `step`."""
    if step < 0:
        raise ValueError(f"step must be non-negative, got {step}")
    start, stop = host_slice(global_batch_size, process_index, process_count)
    base = step * global_batch_size
    return np.arange(base + start, base + stop, dtype=np.int64)
