"""In-loop held-out evaluation: every held-out set on its own, and their token-weighted overall.

metrics.jsonl keys of an evaluation row (`metric_keys`):
  heldout/<set>/loss     mean cross-entropy per target token of the set (nats)
  heldout/<set>/tokens   target tokens it counted (the same every evaluation)
  heldout_loss           Σ ce / Σ tokens over the sets: their token-weighted mean (the key the
                         audit, compare and lessons have always read)
  heldout_tokens         Σ tokens
  eval_settings          {"instances", "batches", "global_batch_size"}: what decides which examples of
                         each set were evaluated (`settings`; batches null = each set whole), so that
                         compare can tell evaluations that are not alike from a changed model
  eval_time_s            seconds the evaluation took (wall, on this process)
The trackers name them as OLMo-core's LMEvaluator does (`trainer.trackers`): the same name, not
quite the same number. Over the same padded instances both sum the same per-target CE (within
1e-6 per target), but LMEvaluator divides by the documents' ids, one more than their targets per
document, so its `eval/lm/<set>/CE loss` = this loss × targets / (targets + documents)
(bench/olmo_evaluator.py, tests/trainer/test_olmo_evaluator.py).
Sets and instances: `dataloader.heldout`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import grain
import jax
import numpy as np

from dataloader import heldout
from trainer import mesh as mesh_lib
from trainer.mesh import PyTree

log = logging.getLogger(__name__)

OVERALL = "heldout_loss"
OVERALL_TOKENS = "heldout_tokens"
PREFIX = "heldout/"
TIME = "eval_time_s"
READ_THREADS, PREFETCH = 2, 2  # batches read ahead in Grain threads while the device evaluates


def set_key(label: str, what: str = "loss") -> str:
    return f"{PREFIX}{label}/{what}"


def parse_set_key(key: str) -> tuple[str, str] | None:
    """'heldout/<label>/<what>' → (label, what); None for any other key."""
    if not key.startswith(PREFIX) or "/" not in key[len(PREFIX) :]:
        return None
    label, what = key[len(PREFIX) :].rsplit("/", 1)
    return label, what


def metric_keys(sums: Mapping[str, tuple[float, float]]) -> dict[str, float]:
    """{set: (Σ ce, Σ target tokens)} → the metrics row's held-out keys (pure). A set that counted
    no target token is an error: its loss would be 0/0."""
    row: dict[str, float] = {}
    for label, (ce, tokens) in sums.items():
        if tokens <= 0:
            raise ValueError(f"held-out set {label!r} has no target tokens")
        row[set_key(label)] = ce / tokens
        row[set_key(label, "tokens")] = tokens
    total_ce, total = sum(c for c, _ in sums.values()), sum(t for _, t in sums.values())
    row[OVERALL], row[OVERALL_TOKENS] = total_ce / total, total
    return row


SETTINGS = "eval_settings"


def settings(instances: str, max_batches: int | None, global_batch_size: int) -> dict[str, Any]:
    """The evaluation settings an evaluation row records under ``SETTINGS`` (pure)."""
    return {"instances": instances, "batches": max_batches, "global_batch_size": global_batch_size}


def set_losses(row: Mapping[str, Any]) -> dict[str, float]:
    """{set: loss} of a metrics row (empty when it holds no evaluation)."""
    out = {}
    for key, value in row.items():
        parsed = parse_set_key(key)
        if parsed and parsed[1] == "loss":
            out[parsed[0]] = value
    return out


class Evaluator:
    """The run's held-out sets, opened once; `__call__(params)` → the row's held-out keys and
    ``eval_time_s``. A periodic evaluator of the loop (``trainer.evaluators.make_evaluators``): runs
    every ``interval`` (eval.every) steps and after the last.

    Every process reads its host slice of each batch; the jitted eval step sums over the global
    batch, so every process gets the same sums."""

    def __init__(
        self,
        eval_fn: Callable,
        sets: Sequence[heldout.EvalSet],
        mesh: jax.sharding.Mesh,
        global_batch_size: int,
        max_batches: int | None,
        process_index: int,
        process_count: int,
        instances: str = "packed",
        interval: int = 0,
    ) -> None:
        self.interval = interval
        self.eval_fn, self.sets, self.mesh = eval_fn, list(sets), mesh
        self.G, self.max_batches = global_batch_size, max_batches
        self.h, self.H = process_index, process_count
        self.instances = instances

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.sets]

    def _batches(self, eval_set: heldout.EvalSet) -> grain.IterDataset:
        n = heldout.num_batches(eval_set, self.G, self.max_batches)
        ds = grain.MapDataset.range(n).map(lambda b: heldout.host_batch(eval_set, b, self.G, self.h, self.H))
        return ds.to_iter_dataset(grain.ReadOptions(num_threads=READ_THREADS, prefetch_buffer_size=PREFETCH))

    def sums(self, params: PyTree) -> dict[str, tuple[float, float]]:
        """{set: (Σ ce, Σ target tokens)} over the set's evaluated batches."""
        out = {}
        for eval_set in self.sets:
            parts = [
                self.eval_fn(params, mesh_lib.global_batch(batch, self.mesh, self.G))
                for batch in self._batches(eval_set)
            ]  # dispatched asynchronously, summed at the end
            ce, tokens = jax.device_get(([p.ce for p in parts], [p.tokens for p in parts]))
            out[eval_set.label] = (
                float(np.sum(np.asarray(ce, np.float64))),
                float(np.sum(np.asarray(tokens, np.float64))),
            )
        return out

    def __call__(self, params: PyTree) -> dict[str, Any]:
        t0 = time.perf_counter()
        row = {**metric_keys(self.sums(params)), SETTINGS: settings(self.instances, self.max_batches, self.G)}
        row[TIME] = time.perf_counter() - t0
        return row

    def close(self) -> None:
        heldout.close_sets(self.sets)
