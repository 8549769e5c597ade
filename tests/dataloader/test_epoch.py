"""Each epoch reads every planned slot exactly as planned; token shares follow the weights."""

import numpy as np
import pytest

from dataloader import LoaderConfig, make_loader
from dataloader.plan import RECORD_BITS
from pipelines.dolma2_tokenizer import PAD_ID


def read_positions(it, first, count):
    """Rows of the stream at global positions [first, first + count) (H = 1, G rows/step)."""
    G = it.cfg.global_batch_size
    rows = {k: [] for k in ("example", "tokens", "index")}
    for step in range(first // G, -(-(first + count) // G)):
        b = it.batch_at(step)
        for k in rows:
            rows[k].append(b[k])
    out = {k: np.concatenate(v) for k, v in rows.items()}
    lo = first - (first // G) * G
    return {k: v[lo : lo + count] for k, v in out.items()}


@pytest.mark.parametrize("epoch", [0, 3])
def test_each_epoch_uses_every_slot_as_planned(manifest_path, epoch):
    it = make_loader(LoaderConfig(data=[manifest_path], global_batch_size=32, seed=5), 0, 1)
    plan = it.plan
    rows = read_positions(it, epoch * plan.size, plan.size)
    assert rows["index"].tolist() == list(range(epoch * plan.size, (epoch + 1) * plan.size))
    src = rows["example"] >> RECORD_BITS
    rec = rows["example"] & ((1 << RECORD_BITS) - 1)
    for s, (source, n) in enumerate(zip(plan.sources, plan.counts)):
        uses = np.bincount(rec[src == s], minlength=source.records)
        whole, rem = divmod(n, source.records)
        assert uses.sum() == n
        assert sorted(uses.tolist()) == [whole] * (source.records - rem) + [whole + 1] * rem
    it.close()


def test_token_shares_over_an_epoch_follow_weights(manifest_path):
    weights = {"web": 0.55, "code": 0.45}
    it = make_loader(LoaderConfig(data=[manifest_path], global_batch_size=32, weights=weights), 0, 1)
    rows = read_positions(it, 0, it.plan.size)
    real = (rows["tokens"] != PAD_ID).sum(axis=1)
    src = rows["example"] >> RECORD_BITS
    per_source = np.array([real[src == s].sum() for s in range(2)])
    shares = per_source / per_source.sum()
    assert np.abs(shares - [0.55, 0.45]).max() < 0.01, shares
    it.close()
