"""Which batch rows a process's devices hold: checked in the devices' count, not the batch's."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from trainer import mesh as mesh_lib


@pytest.mark.parametrize(
    ("intervals", "spans"),
    [
        ([(0, 4)], [(0, 4)]),
        ([(4, 8), (0, 4)], [(0, 8)]),  # adjacent, out of order
        ([(0, 4), (0, 4), (4, 8)], [(0, 8)]),  # a slice replicated over two devices
        ([(0, 2), (4, 6)], [(0, 2), (4, 6)]),  # a gap
        ([(0, 6), (2, 4)], [(0, 6)]),  # nested
    ],
)
def test_spans_are_the_union_of_the_devices_rows(intervals, spans):
    assert mesh_lib.contiguous_spans(intervals) == spans


def test_a_huge_global_batch_is_checked_without_a_row_by_row_set():
    devices = np.array(jax.devices()[:1]).reshape(1, 1, 1)
    mesh = Mesh(devices, ("data", "fsdp", "tensor"))
    # 10^12 rows: building a set of row numbers (as the check once did) would need terabytes
    assert mesh_lib.process_rows(mesh, 10**12, 8, 0) == (0, 10**12)
    mesh_lib.check_host_rows(mesh, 10**12, 8, 0, 1)
