"""The mixture plan: exact deterministic counts, clear errors, compact slot lookup."""

from fractions import Fraction

import numpy as np
import pytest

from dataloader.plan import RECORD_BITS, SourceSpec, epoch_counts, make_plan, plan_from_manifests


def spec(name, ordinal, records, tokens, weight, max_rep=10.0):
    return SourceSpec(name, ordinal, records, tokens, weight, max_rep)


def test_counts_sum_exactly_to_the_rounded_total_and_match_weights():
    sources = [spec("a", 0, 1000, 100_000, 0.5), spec("b", 1, 333, 30_000, 0.3), spec("c", 2, 77, 7_001, 0.2)]
    counts = epoch_counts(sources)
    # a anchors (largest tokens/weight): read exactly once.
    assert counts[0] == 1000
    budget = Fraction(100_000) / Fraction(0.5)
    exact = [Fraction(0.3) * budget / 30_000 * 333, Fraction(0.2) * budget / 7_001 * 77]
    assert sum(counts) == int(1000 + sum(exact) + Fraction(1, 2))
    for n, x in zip(counts[1:], exact):
        assert abs(n - x) < 1
    mean_tokens = [s.tokens / s.records for s in sources]
    shares = np.array(counts) * mean_tokens
    assert np.allclose(shares / shares.sum(), [0.5, 0.3, 0.2], atol=2e-3)


def test_rounding_is_deterministic_and_independent_of_weight_scale():
    sources = [spec("a", 0, 10, 100, 1.0), spec("b", 1, 10, 100, 1.0), spec("c", 2, 10, 100, 1.0)]
    scaled = [spec(s.name, s.ordinal, s.records, s.tokens, 1 / 3) for s in sources]
    assert epoch_counts(sources) == epoch_counts(scaled) == (10, 10, 10)
    # Largest remainders win, ties go to the lower ordinal: 3.5, 3.5, 3 → total round(10)=10.
    odd = [spec("a", 0, 7, 70, 1.0), spec("b", 1, 7, 70, 1.0), spec("c", 2, 6, 60, 0.857142857)]
    assert epoch_counts(odd) == epoch_counts(list(odd))
    assert sum(epoch_counts(odd)) == int(sum([7, 7, Fraction(0.857142857) * 70 / 60 * 6]) + Fraction(1, 2))


def test_impossible_weight_is_a_clear_error_naming_the_source():
    sources = [spec("big", 0, 1000, 100_000, 0.5), spec("tiny", 1, 10, 1_000, 0.5, max_rep=4)]
    with pytest.raises(ValueError, match=r"'tiny'.*repeated 100\.000×.*max_repetition is 4"):
        epoch_counts(sources)
    with pytest.raises(ValueError, match="no examples"):
        epoch_counts([spec("a", 0, 10, 100, 1.0), spec("empty", 1, 0, 0, 0.1)])
    with pytest.raises(ValueError, match="weight 0"):
        epoch_counts([spec("a", 0, 10, 100, 0.0)])


def test_zero_weight_sources_get_no_slots():
    counts = epoch_counts([spec("a", 0, 10, 100, 1.0), spec("off", 1, 0, 0, 0.0), spec("b", 2, 5, 50, 1.0)])
    assert counts == (10, 0, 10)
    plan = make_plan([spec("a", 0, 10, 100, 1.0), spec("off", 1, 0, 0, 0.0), spec("b", 2, 5, 50, 1.0)], ["f"])
    src, _ = plan.locate(np.arange(plan.size))
    assert set(src.tolist()) == {0, 2}


def test_slot_lookup_matches_a_materialised_plan():
    plan = make_plan([spec("a", 0, 7, 70, 0.2), spec("b", 1, 5, 50, 0.5), spec("c", 2, 11, 110, 0.3)], ["f"])
    # c anchors the epoch; a and b are repeated, with partial passes, so all branches run.
    assert plan.counts[2] == 11 and plan.counts[0] % 7 and plan.counts[1] > 5 and plan.counts[1] % 5
    src, rec = plan.locate(np.arange(plan.size))
    expected = []
    for s, (source, n) in enumerate(zip(plan.sources, plan.counts)):
        whole, rem = divmod(n, source.records)
        expected += [(s, r) for _ in range(whole) for r in range(source.records)]
        expected += [(s, (k * source.records) // rem) for k in range(rem)]
    assert list(zip(src.tolist(), rec.tolist())) == expected
    # A partial pass never repeats a record: per source every record is used ⌊n/R⌋ or ⌈n/R⌉ times.
    for s, (source, n) in enumerate(zip(plan.sources, plan.counts)):
        uses = np.bincount(rec[src == s], minlength=source.records)
        assert uses.sum() == n and uses.max() - uses.min() <= 1
    with pytest.raises(IndexError):
        plan.locate(np.array([plan.size]))


def test_example_ids_pack_source_ordinal_and_record():
    plan = make_plan([spec("a", 0, 3, 30, 1.0), spec("b", 1, 3, 30, 1.0)], ["f"])
    ids = plan.example_ids(np.array([0, 1]), np.array([2, 1]))
    assert ids.tolist() == [2, (1 << RECORD_BITS) | 1]


def test_plan_from_manifest_uses_mixture_weights_and_overrides(manifest):
    plan = plan_from_manifests([manifest])
    assert [s.name for s in plan.sources] == ["web", "code"]
    assert [s.weight for s in plan.sources] == [0.7, 0.3]
    assert plan.counts[0] == manifest["sources"]["web"]["splits"]["train"]["examples"]
    other = plan_from_manifests([manifest], weights={"code": 0.1})
    assert other.counts[1] < plan.counts[1] and other.fingerprint != plan.fingerprint
    assert plan_from_manifests([manifest]).fingerprint == plan.fingerprint
    with pytest.raises(ValueError, match="unknown sources"):
        plan_from_manifests([manifest], weights={"nope": 1.0})
    with pytest.raises(ValueError, match="more than one manifest"):
        plan_from_manifests([manifest, manifest])
    held = plan_from_manifests([manifest], split="heldout")
    assert held.counts == tuple(manifest["sources"][n]["splits"]["heldout"]["examples"] for n in ("web", "code"))


def test_absent_max_repetition_means_unlimited(manifest):
    import copy

    m = copy.deepcopy(manifest)
    for s in m["mixture"]["sources"]:
        s["max_repetition"] = None
    plan = plan_from_manifests([m], weights={"web": 0.01, "code": 0.99})
    code = plan.sources[1]
    assert code.max_repetition == float("inf") and plan.counts[1] > 100 * code.records
    with pytest.raises(ValueError, match="max_repetition is 4"):
        plan_from_manifests([manifest], weights={"web": 0.01, "code": 0.99})
