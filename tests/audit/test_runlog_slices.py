"""The run check's host slices: each host reads exactly its planned slice of every global batch."""

from __future__ import annotations

import numpy as np

from audit import runlog


def test_a_split_shifted_between_hosts_fails_even_when_the_step_reads_every_position_once():
    """Host 0 reads one position of host 1's slice at step 1 (not a step the loader's slices are
    recomputed at): the step's positions joined are the planned ones, each read once, but neither
    host read its own slice, and the check says so."""
    G, H, k = 8, 2, 4
    positions = np.arange(G, 2 * G, dtype=np.int64)  # step 1
    slices = runlog.Slices(G, runlog.Evidence())
    shifted = runlog.Step.from_lines(
        1, [(H, 0, positions[: k + 1], positions[: k + 1]), (H, 1, positions[k + 1 :], positions[k + 1 :])]
    )
    planned = runlog.Step.from_lines(1, [(H, 0, positions[:k], positions[:k]), (H, 1, positions[k:], positions[k:])])
    slices.step(planned)
    assert slices.f.count == 0
    slices.step(shifted)
    assert slices.f.count == 2, slices.f.items
    assert "step 1, host 0: read positions [8, 13) but its slice is [8, 12)" in slices.f.items[0]
