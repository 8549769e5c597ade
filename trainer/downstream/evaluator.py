"""The in-loop downstream evaluator: OLMo-core's DownstreamEvaluator over frozen task files.

    ev = DownstreamEvaluator.from_files(tasks_dir, labels, model_cfg, mesh, param_shardings,
                                        batch_tokens, seq_len, precision="bfloat16", interval=10_000)
    row = ev(params)   # {"eval/downstream/<label> (<metric label>)": value, ..., "downstream_time_s": s}
    ev.close()

A periodic evaluator as the loop holds them (``interval``, ``__call__(params) -> dict``,
``close()``). Each task: its continuation log-likelihoods in JAX (``score.TaskScorer``, the run's
mesh and parameter shardings), then ICLMetric's numbers (``metric.compute``, per-instance values
rounded to ``precision``: "bfloat16" as AI2's bf16 logits give, or "float32"), under OLMo-core's
keys. A progress line per task while a pass runs and the pass's time are logged.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Mapping, Sequence

import jax

import model
from contract import downstream as ds
from trainer.downstream import metric, score
from trainer.mesh import PyTree

log = logging.getLogger(__name__)

TIME_KEY = "downstream_time_s"
PRECISIONS = tuple(metric.DTYPES)


def check_tasks(tasks: ds.DownstreamTasks, model_cfg: model.ModelConfig, seq_len: int | None) -> None:
    """The files fit the model and the run, or DownstreamTasksError (one line): the tokenizer's
    vocabulary is the model's, the queries were cut at the run's sequence length, no pmi_dc task
    (its domain-conditional pass is not implemented)."""
    tok, where = tasks.manifest["tokenizer"], tasks.root
    if int(tok["vocab_size"]) != model_cfg.vocab_size:
        raise ds.DownstreamTasksError(
            f"{where}: tasks built with tokenizer {tok['name']!r} (vocabulary {tok['vocab_size']}), the model's "
            f"vocabulary is {model_cfg.vocab_size}: build them with the run's tokenizer"
        )
    ctx = int(tasks.manifest["model_ctx_len"])
    if seq_len is not None and ctx != seq_len:
        raise ds.DownstreamTasksError(
            f"{where}: tasks built with model_ctx_len {ctx}, the run's seq_len is {seq_len}: rebuild them "
            f"with `python -m pipelines.downstream_tasks ... --model_ctx_len {seq_len}`"
        )
    dc = [t.label for t in tasks.tasks.values() if t.metric_type == "pmi_dc"]
    if dc:
        raise ds.DownstreamTasksError(f"{where}: pmi_dc tasks {dc} are not supported (no domain-conditional pass)")


class DownstreamEvaluator:
    """Scores ``tasks`` with ``scorer`` every ``interval`` steps (the loop decides when)."""

    def __init__(
        self,
        tasks: ds.DownstreamTasks,
        scorer: score.TaskScorer,
        interval: int,
        precision: str = "bfloat16",
        log_fn: Callable[[str], object] | None = None,
        contaminated: Mapping[str, Collection[int]] | None = None,
    ):
        """contaminated: {task: olmo_eval doc ids found in the run's training data} (the audit's
        check 8, `trainer.downstream.clean.contaminated_instances`): each task is also reported on
        the other instances, under its keys with " clean" appended. None: not reported."""
        if precision not in PRECISIONS:
            raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
        if interval < 1:
            raise ValueError(f"interval must be ≥ 1, got {interval}")
        self.tasks, self.scorer, self.interval, self.precision = tasks, scorer, interval, precision
        self.log = log_fn or log.info
        self.contaminated = None if contaminated is None else {k: set(v) for k, v in contaminated.items()}

    @classmethod
    def from_files(
        cls,
        tasks_dir: str,
        labels: Sequence[str] | str | None,
        model_cfg: model.ModelConfig,
        mesh: jax.sharding.Mesh,
        param_shardings: PyTree,
        batch_tokens: int,
        seq_len: int | None,
        interval: int,
        precision: str = "bfloat16",
        log_fn: Callable[[str], object] | None = None,
    ) -> DownstreamEvaluator:
        """Load ``labels`` (a list, a preset or comma-separated spec such as "olmo3-fast", or None:
        every task of the folder) from ``tasks_dir`` and check them against the model and the run
        (``check_tasks``); ``batch_tokens``: tokens per forward pass (the held-out eval's
        per-microbatch tokens keep the memory bound). Raises DownstreamTasksError (a ValueError,
        one line) for files that do not fit."""
        wanted = ds.task_labels(labels) if isinstance(labels, str) else labels
        tasks = ds.load(tasks_dir, None if wanted is None else list(wanted))
        check_tasks(tasks, model_cfg, seq_len)
        return cls.from_tasks(tasks, model_cfg, mesh, param_shardings, batch_tokens, interval, precision, log_fn)

    @classmethod
    def from_tasks(
        cls,
        tasks: ds.DownstreamTasks,
        model_cfg: model.ModelConfig,
        mesh: jax.sharding.Mesh,
        param_shardings: PyTree,
        batch_tokens: int,
        interval: int,
        precision: str = "bfloat16",
        log_fn: Callable[[str], object] | None = None,
        contaminated: Mapping[str, Collection[int]] | None = None,
    ) -> DownstreamEvaluator:
        """Tasks already loaded and checked (``check_tasks``; the run's start-up does it once)."""
        scorer = score.TaskScorer(
            model_cfg,
            mesh,
            param_shardings,
            batch_tokens,
            int(tasks.manifest["model_ctx_len"]),
            int(tasks.manifest["tokenizer"]["pad_id"]),
        )
        return cls(tasks, scorer, interval, precision, log_fn, contaminated)

    @property
    def labels(self) -> list[str]:
        return self.tasks.labels

    def task_metrics(self, params: PyTree, task: ds.TaskInstances) -> dict[str, float]:
        """{suffix: value} of one task (ICLMetric.compute's names)."""
        return self.task_metrics_and_clean(params, task)[0]

    def task_metrics_and_clean(
        self, params: PyTree, task: ds.TaskInstances
    ) -> tuple[dict[str, float], dict[str, float] | None]:
        """{suffix: value} of one task, and of its clean subset (None when not asked)."""
        ll = self.scorer.loglik(params, task)
        e = metric.entries(task.arrays, ll, task.fast_mc)
        values = metric.compute(task.metric_type, e, dtype=self.precision)
        if self.contaminated is None:
            return values, None
        return values, clean_metrics(task.metric_type, e, self.contaminated.get(task.label, set()), self.precision)

    def __call__(self, params: PyTree) -> dict[str, float]:
        t0 = time.monotonic()
        row: dict[str, float] = {}
        n = len(self.tasks.tasks)
        for i, (label, task) in enumerate(self.tasks.tasks.items(), 1):
            t1 = time.monotonic()
            values, clean = self.task_metrics_and_clean(params, task)
            row.update(metric.keyed(label, values))
            if clean is not None:
                row.update(metric.keyed_clean(label, clean))
            head = next(iter(values))  # logged under its metrics.jsonl key, as OLMo-core names it
            self.log(
                f"downstream [{i}/{n}] {metric.metric_key(label, head)} {values[head]:.4f} "
                f"({len(task):,} instances, {time.monotonic() - t1:.1f}s)"
            )
        row[TIME_KEY] = time.monotonic() - t0
        self.log(
            f"downstream: {n} tasks, {sum(len(t) for t in self.tasks.tasks.values()):,} instances in "
            f"{row[TIME_KEY]:.1f}s"
        )
        return row

    def close(self) -> None:
        """Nothing held open (the task arrays are in memory); here for the loop's interface."""


def clean_metrics(metric_type: str, e: metric.Entries, found: Collection[int], precision: str) -> dict[str, float]:
    """A task's metrics on the documents not in `found`; NaN for each value when none is left."""
    kept = metric.without_docs(e, found)
    full = metric.compute(metric_type, e, dtype=precision)
    if not kept.doc_id.size:
        return dict.fromkeys(full, float("nan"))
    return metric.compute(metric_type, kept, dtype=precision)
