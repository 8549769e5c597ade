"""Helpers shared by the downstream tests."""

from __future__ import annotations


def whole_docs(samples: list, limit: int) -> list:
    """The first instances up to `limit`, cut where a doc ends (a doc cut short can leave its label
    outside its options, which ICLMetric.compute does not handle)."""
    k = min(limit, len(samples))
    while 0 < k < len(samples) and samples[k]["doc_id"] == samples[k - 1]["doc_id"]:
        k -= 1
    return samples[:k]
