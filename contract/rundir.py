"""A trainer run directory as one value: every file the trainer writes into it, named here once.

    run = RunDir.resolved("~/runs/s1")  # a path a command names: ~ expanded, absolute, links followed
    run = RunDir(path)                  # a path already in hand (a test's tmp_path): kept as given
    run.metrics, run.summary, run.config, run.run_record, run.data_log / data_log_name(h, H)
    run.checkpoints / "1000"            # orbax's steps; RunDir.of_step(step_dir) is the run of a step

The trainer writes these files; the audit, ``compare`` and ``trainer.downstream`` read
them. Every command builds its run's value once, at its edge (``contract.cli.run_dir`` as the
argparse type of ``--run_dir``/``--run``; ``RunDir.resolved`` for a compare side or a lesson's run;
``RunDir.of_step`` for ``--step_dir``), and passes that value on: nothing after it resolves the path
again, so the trainer's start-up checks, its lock, its checkpoints and its logs name one directory.
A new file of a run directory gets its name here, not in the module that writes it.

    metrics.jsonl             one row per optimizer step (and evaluation keys), primary host
    summary.json              the run's end (contract.run.RunSummary)
    config.json               the resolved config of the latest start (for people)
    run.json                  the run record the audit reads (contract.run.RunRecord)
    data_log/host-H-of-N.jsonl  what each host consumed (contract.datalog)
    data_logs_settled.json    the data logs of earlier host counts, cut once (trainer.logs)
    data_verified.json        the shards verified at earlier starts (dataloader.verify)
    checkpoints/<step>/       orbax steps; checkpoints_pending/, checkpoints_rejected/ beside them
    tensorboard/, trackers.json  the trackers' (trainer.trackers)
    .olmax.lock               the run's lock while a process trains in it (contract.lock)
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import ClassVar

from .datalog import DATA_LOG_DIR, DATA_LOG_GLOB
from .lock import LOCK_NAME
from .run import RUN_RECORD_NAME, SUMMARY_NAME


@dataclasses.dataclass(frozen=True)
class RunDir:
    """A run directory (``path``) and the paths of its files."""

    path: Path

    METRICS: ClassVar[str] = "metrics.jsonl"
    SUMMARY: ClassVar[str] = SUMMARY_NAME
    CONFIG: ClassVar[str] = "config.json"
    RUN_RECORD: ClassVar[str] = RUN_RECORD_NAME
    DATA_LOG: ClassVar[str] = DATA_LOG_DIR
    CHECKPOINTS: ClassVar[str] = "checkpoints"
    CHECKPOINTS_PENDING: ClassVar[str] = "checkpoints_pending"  # saved by this code, not yet sealed
    CHECKPOINTS_REJECTED: ClassVar[str] = "checkpoints_rejected"  # steps set aside, + .reason.txt
    TENSORBOARD: ClassVar[str] = "tensorboard"
    TRACKERS_STATE: ClassVar[str] = "trackers.json"
    LOCK: ClassVar[str] = LOCK_NAME
    DATA_VERIFIED: ClassVar[str] = "data_verified.json"  # the shards verified at earlier starts (dataloader.verify)
    DATA_LOGS_SETTLED: ClassVar[str] = "data_logs_settled.json"  # other host counts' data logs, cut (trainer.logs)

    def __init__(self, path: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "path", Path(path))

    @classmethod
    def resolved(cls, path: str | os.PathLike[str]) -> RunDir:
        """The run directory a command names: ``~`` expanded, made absolute against the working
        directory, symlinks followed (a run reached through a link is the run it links to). The one
        place a run directory's path is resolved; OSError/RuntimeError (a symlink loop) as pathlib's."""
        return cls(_resolved(path))

    @classmethod
    def of_step(cls, step_dir: str | os.PathLike[str]) -> RunDir:
        """The run a checkpoint step belongs to: RUN/checkpoints/<step> → RUN (resolved as ``resolved``)."""
        return cls(_resolved(step_dir).parent.parent)

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    @property
    def metrics(self) -> Path:
        return self.path / self.METRICS

    @property
    def summary(self) -> Path:
        return self.path / self.SUMMARY

    @property
    def config(self) -> Path:
        return self.path / self.CONFIG

    @property
    def run_record(self) -> Path:
        return self.path / self.RUN_RECORD

    @property
    def data_log(self) -> Path:
        return self.path / self.DATA_LOG

    @property
    def checkpoints(self) -> Path:
        return self.path / self.CHECKPOINTS

    @property
    def checkpoints_pending(self) -> Path:
        return self.path / self.CHECKPOINTS_PENDING

    @property
    def checkpoints_rejected(self) -> Path:
        return self.path / self.CHECKPOINTS_REJECTED

    @property
    def tensorboard(self) -> Path:
        return self.path / self.TENSORBOARD

    @property
    def trackers_state(self) -> Path:
        return self.path / self.TRACKERS_STATE

    @property
    def lock(self) -> Path:
        return self.path / self.LOCK

    @property
    def data_verified(self) -> Path:
        return self.path / self.DATA_VERIFIED

    @property
    def data_logs_settled(self) -> Path:
        return self.path / self.DATA_LOGS_SETTLED

    def data_logs(self) -> list[Path]:
        """Every host's data log, sorted by name."""
        return sorted(self.data_log.glob(DATA_LOG_GLOB))


def _resolved(path: str | os.PathLike[str]) -> Path:
    return Path(path).expanduser().resolve()
