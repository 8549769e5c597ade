"""olmax's initial weights have OLMo-core 3.0.0's distribution tensor by tensor (bench.init_stats):
OLMo-core's own `Transformer.init_weights` on the harness's OLMo-core model of a d=256, 4-layer OLMo 3
(3 sliding, 1 full) against `model.init`; and OLMo 3 7B's own config sets the init the same way, so
what holds at d=256 holds at its shapes (`python -m bench.init_stats` measures those)."""

from __future__ import annotations

import pytest

from bench import init_stats
from bench.olmo_reference import model_config


@pytest.fixture(scope="module")
def small() -> dict:
    return init_stats.compare(small=True)


def test_olmax_init_has_olmo_cores_distribution_tensor_by_tensor(small):
    """Every tensor: the same std (within sampling error of each other and of a normal of std 0.02
    cut at ±3σ), mean 0, the same truncation bound, norms all ones; no depth scaling on either side."""
    assert init_stats.disagreements(small) == []
    ref = small["olmo_core"]["stats"]
    assert len(ref) == len(small["olmax"]["stats"]) == 3 + 4 * 11  # embedding, head and its norm; 4 blocks of 11
    assert small["expected_std"] == pytest.approx(0.02 * 0.98658, rel=1e-5)


@pytest.mark.parametrize("override", [{"init_std": 0.0196}, {"init_cutoff": 2.5}, {"init_cutoff": 4.0}])
def test_the_comparison_tells_a_slightly_other_init_apart(small, override):
    """One tensor drawn by olmax's initializer (model.layers.weight_init) with a std 2% off, a tighter
    or a looser cut: that tensor, and only it, is named (the comparison is not blind)."""
    import jax
    import numpy as np

    from model.layers import weight_init

    name = "blocks.0.feed_forward.w1.weight"
    other = weight_init(init_stats.small_model(**override))(jax.random.key(1), (256, 704), np.float32)
    stats = {**small["olmax"]["stats"], name: init_stats.tensor_stats(np.asarray(other), 0.02)}
    found = init_stats.disagreements({**small, "olmax": {**small["olmax"], "stats": stats}})
    assert found and all(line.startswith(name + ": ") for line in found), found


def test_olmo3_7b_sets_its_init_as_the_compared_model_does():
    """OLMo-core's OLMo 3 7B config (TransformerConfig.olmo3_7B) chooses the init the harness's
    model has (normal, std 0.02, the embedding's std the same), and olmax's olmo3-7b the same std
    and cut (its init does not depend on widths or depth: one rule for every weight)."""
    from model.config import get_config

    fields = init_stats.init_fields(init_stats.olmo3_7b(100352))
    assert fields == init_stats.init_fields(model_config(init_stats.small_model()))
    assert fields == {"init_method": "normal", "init_std": 0.02, "embedding_init_std": None}
    mc = get_config("olmo3-7b")
    assert (mc.init_std, mc.init_cutoff) == (0.02, 3.0)


def test_tensor_stats_sums_in_chunks_as_in_one(monkeypatch):
    import numpy as np

    x = np.random.default_rng(0).normal(0, 0.02, size=(300, 7)).astype(np.float32)
    whole = init_stats.tensor_stats(x, 0.02)
    monkeypatch.setattr(init_stats, "CHUNK", 64)
    assert init_stats.tensor_stats(x, 0.02) == pytest.approx(whole, rel=1e-9)
    assert whole["std"] == pytest.approx(float(x.astype(np.float64).std(ddof=1)), rel=1e-9)
