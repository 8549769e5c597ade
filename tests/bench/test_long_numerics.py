"""bench.long_numerics: its synthetic batches are packed documents of a learnable walk, and its
verdict compares two loss trajectories step by step against the on-chip splash test's bound."""

from __future__ import annotations

import numpy as np
import pytest

from bench import long_numerics as ln
from tests.model.test_attention_tpu import ATOL_BF16


def test_the_loss_bound_is_the_on_chip_splash_tests():
    assert ln.LOSS_ATOL == ATOL_BF16


def test_a_walk_batch_is_packed_documents_with_their_own_positions():
    b = ln.walk_batch(step=3, global_batch=2, seq_len=1000, eos_id=5000, docs=7)
    assert {k: v.shape for k, v in b.items()} == {
        k: (2, 1000) for k in ("tokens", "segment_ids", "positions", "loss_mask")
    }
    for row in range(2):
        seg, pos = b["segment_ids"][row], b["positions"][row]
        assert list(np.unique(seg)) == list(range(1, 8)) and (np.diff(seg) >= 0).all()
        starts = np.flatnonzero(np.diff(seg, prepend=0))
        assert (pos[starts] == 0).all() and (np.diff(pos)[np.diff(seg) == 0] == 1).all()
    graph = np.random.default_rng(0).choice(ln.WORDS, size=(ln.WORDS, ln.SUCCESSORS))
    t = b["tokens"][0]
    assert t.max() < ln.WORDS and all(t[i + 1] in graph[t[i]] for i in range(999))  # a walk of the graph
    again = ln.walk_batch(step=3, global_batch=2, seq_len=1000, eos_id=5000, docs=7)
    assert all((again[k] == b[k]).all() for k in b)  # the same batch for the same step
    assert (ln.walk_batch(4, 2, 1000, 5000, 7)["tokens"] != b["tokens"]).any()


def test_the_verdict_holds_every_step_to_the_bound():
    ref = [10.0, 8.0, 6.0]
    assert ln.compare(ref, [10.0, 8.01, 5.995])["within"]
    off = ln.compare(ref, [10.0, 8.0, 6.0 + 2 * ln.LOSS_ATOL])
    assert not off["within"] and off["worst_step"] == 2 and off["max_abs_diff"] == pytest.approx(2 * ln.LOSS_ATOL)
    assert not ln.compare(ref, [10.0, float("nan"), 6.0])["within"]
    with pytest.raises(ValueError):
        ln.compare(ref, ref[:2])
