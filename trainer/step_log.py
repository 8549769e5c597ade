"""What the loop writes each step, in one object: the metrics row (``metrics.jsonl`` on the
primary, the trackers, the console progress line) and the data logs (one per logged host)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax

import contract
from contract.rundir import RunDir
from dataloader.loader import Sampler
from trainer import logs
from trainer import peak as peak_lib
from trainer import trackers as trackers_lib
from trainer.config.schema import TrainConfig


class StepLogger:
    """Opened before the loader (``metrics.jsonl`` and the data logs continue from ``start_step``,
    ``summary`` from the checkpoint's meta; None: from the log); ``open_trackers`` once the run
    record is written; ``close`` closes every writer."""

    def __init__(
        self,
        cfg: TrainConfig,
        run: RunDir,
        start_step: int,
        flops_per_token: float,
        peak: peak_lib.Peak,
        sampler: Sampler,
        summary: logs.RunningSummary | None,
    ):
        h = jax.process_index()
        self.cfg, self.run, self.primary = cfg, run, h == 0
        self.flops, self.peak, self.sampler = flops_per_token, peak, sampler
        self.metrics = logs.JsonlWriter(run.metrics, start_step) if self.primary else None
        # summary.json's running part: the checkpoint's; from the cut log's tail for a checkpoint
        # saved without it (the primary's: the others write no summary)
        if summary is None:
            summary = logs.RunningSummary.of_tail(run.metrics) if self.primary else logs.RunningSummary()
        self.summary = summary
        # the hosts the loader's sampler reads for (this process; every simulated host of the lessons' replay)
        logged_hosts, self.logged_count = sampler.logged_hosts()
        if self.primary:
            logs.truncate_other_data_logs(run, self.logged_count, start_step)
        self.data_logs = [
            logs.JsonlWriter(run.data_log / contract.data_log_name(x, self.logged_count), start_step)
            for x in logged_hosts
        ]
        self.progress = logs.Progress(cfg.steps, cfg.log.progress_every, self.primary)
        self.trackers: trackers_lib.Trackers | None = None

    def open_trackers(self, start_step: int, info: Mapping[str, Any]) -> None:
        self.trackers = trackers_lib.Trackers(
            self.cfg.log,
            self.run,
            start_step,
            lambda: logs.read_jsonl(self.run.metrics),
            info,
            enabled=self.primary,
        )

    def data(self, step: int, batch: Mapping[str, Any]) -> None:
        """The step's rows in each logged host's data log."""
        parts = zip(self.sampler.host_parts(batch["index"]), self.sampler.host_parts(batch["example"]))
        for writer, (index, example) in zip(self.data_logs, parts):
            writer.write(contract.data_log_row(step, index, example))

    def speed(self, row: dict[str, Any], tokens: int, step_tokens: int, dt: float, t_data: float) -> None:
        """The row's throughput keys: tokens so far, tokens/s, step and data time, TFLOP/s, MFU."""
        row["skipped"] = bool(row["skipped"])
        row.update(tokens=tokens, tokens_per_s=step_tokens / dt, step_time_s=dt, data_time_s=t_data)
        row["tflops_per_device"] = self.flops * row["tokens_per_s"] / jax.device_count() / 1e12
        row["mfu"] = peak_lib.mfu(row["tflops_per_device"], self.peak)

    def write(self, step: int, row: dict[str, Any], dt: float) -> None:
        self.summary.add(row)
        if self.metrics:
            self.metrics.write(row)
        if self.trackers:
            self.trackers.write(row)
        self.progress.update(step, row, dt)

    def close(self) -> None:
        for writer in self.data_logs:
            writer.close()
        if self.metrics:
            self.metrics.close()
        if self.trackers:
            self.trackers.close()
