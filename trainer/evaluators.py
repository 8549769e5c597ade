"""The loop's periodic evaluations, made from the start-up's ``Checked`` and the ``Built`` step:

    evaluators = make_evaluators(checked, built, process_index, process_count)
    ... after step s: [e(params) for e in evaluators if due(e, s, cfg.steps)]

The one place a new evaluation is added. Here, not in ``trainer.startup``: an evaluator needs the
built step and shardings, and ``trainer.build`` imports the start-up (startup ← build ← evaluators).
"""

from __future__ import annotations

from typing import Any, Protocol

from dataloader import heldout
from trainer import heldout_eval
from trainer.build import Built
from trainer.downstream.evaluator import DownstreamEvaluator
from trainer.startup import Checked


class PeriodicEvaluator(Protocol):
    """One periodic evaluation the loop runs: after step ``s`` (1-based count of updates) when
    ``s % interval == 0`` or ``s == cfg.steps``. ``__call__`` returns the metric row's keys it adds
    (its own time key included); ``close`` frees what it holds."""

    interval: int

    def __call__(self, params: Any) -> dict[str, Any]: ...

    def close(self) -> None: ...


def due(evaluator: PeriodicEvaluator, step: int, last_step: int) -> bool:
    return evaluator.interval > 0 and (step % evaluator.interval == 0 or step == last_step)


def make_evaluators(checked: Checked, built: Built, process_index: int, process_count: int) -> list[PeriodicEvaluator]:
    """The run's periodic evaluators, in the order their keys enter the row: the one place a new
    evaluation is added. Today: the held-out loss (``trainer.heldout_eval.Evaluator``, every
    ``eval.every`` steps) when the data has held-out sets to evaluate, then the downstream tasks
    (``trainer.downstream.evaluator.DownstreamEvaluator``, every ``downstream.every`` steps)."""
    cfg = checked.cfg
    evaluators: list[PeriodicEvaluator] = []
    if checked.eval_labels:
        evaluators.append(
            heldout_eval.Evaluator(
                built.eval_step,
                heldout.open_sets(list(checked.manifests), list(checked.eval_labels), cfg.eval.instances),
                built.mesh,
                cfg.global_batch_size,
                cfg.eval_batches,
                process_index,
                process_count,
                cfg.eval.instances,
                interval=cfg.eval.every,
            )
        )
    if checked.downstream_tasks is not None:
        evaluators.append(downstream_evaluator(checked, built))
    return evaluators


def downstream_evaluator(checked: Checked, built: Built) -> PeriodicEvaluator:
    """The recipe's downstream tasks scored on the run's mesh and parameter shardings, every
    ``downstream.every`` steps. Its forward passes hold ``downstream.batch_size`` rows of
    ``seq_len`` tokens (unset: a training microbatch's rows), so they fit where the step fits."""
    cfg, tasks = checked.cfg, checked.downstream_tasks
    assert tasks is not None
    rows = cfg.downstream.batch_size or max(1, cfg.global_batch_size // cfg.microbatches)
    return DownstreamEvaluator.from_tasks(
        tasks,
        built.model_cfg,
        built.mesh,
        built.param_shardings,
        rows * checked.seq_len,
        cfg.downstream.every,
        cfg.downstream.precision,
        contaminated=checked.contaminated,  # downstream.clean_from's (the start-up read and checked it)
    )
