"""Beam metrics per source (namespace `olmax.pipeline`, names `<source>/<counter>`)."""

from __future__ import annotations

from apache_beam.metrics import Metrics
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.runner import PipelineResult

NAMESPACE = "olmax.pipeline"


def inc(source: str, counter: str, n: int = 1) -> None:
    Metrics.counter(NAMESPACE, f"{source}/{counter}").inc(n)


def collect(result: PipelineResult | None) -> dict[str, int]:
    """Committed counter values of a finished pipeline result ({} when the runner has none, or for a
    local dry run's None)."""
    if result is None:
        return {}
    try:
        counters = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))["counters"]
    except Exception:  # noqa: BLE001 - e.g. a Dataflow dry run has no metrics at all
        return {}
    out: dict[str, int] = {}
    for c in counters:
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + (c.committed or 0)
    return dict(sorted(out.items()))
