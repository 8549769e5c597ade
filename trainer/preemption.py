"""How a run is stopped from outside: SIGTERM (a preemption) or Ctrl-C (SIGINT, a person).

    preemption = Preemption()          # trainer.main, once the start-up checks passed
    ... after each step: if preemption.agreed(step, manager): save, exit 0
    preemption.restore()

SIGTERM, or a first Ctrl-C: the loop saves after a step every process agrees on and exits 0 ("rerun
the same command to resume"). A second Ctrl-C stops at once: one line, exit 130, no traceback;
whatever was being saved is left unfinished, which a checkpoint never is (orbax writes a step under
a temporary name and the trainer seals it before it counts: the next start resumes from the newest
intact one). A Ctrl-C before the Preemption exists (the start-up checks) is ``trainer.main``'s: one
line, exit 130, the run directory as it was found.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from types import FrameType
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils

from contract.errors import INTERRUPTED_EXIT

log = logging.getLogger(__name__)


class Preemption:
    """SIGTERM or a first Ctrl-C: the loop saves after a step every process agrees on, then exits 0.

    Several processes: orbax's ``CheckpointManager.reached_preemption`` (JAX's preemption service:
    jax.distributed's coordination service catches SIGTERM on any host and agrees on the step
    every host saves at, with no collective of ours per step); a Ctrl-C there sends this process
    SIGTERM, so it reaches every host the same way. One process has no coordination service
    (orbax's reached_preemption is always False there), and a run may turn the service off
    (``jax_enable_preemption_service``): then the handlers set a flag, checked after each step
    (gathered among processes when there are several). A second Ctrl-C: ``stop_now``."""

    def __init__(self) -> None:
        enabled = jax.config.jax_enable_preemption_service  # type: ignore[attr-defined]  # (jax's flag, untyped)
        self.service = jax.process_count() > 1 and bool(enabled)
        self.requested = False
        self.interrupts = 0  # Ctrl-Cs received
        self.started = False  # the loop's state exists (restored or fresh): the loop sets it, and
        self.checkpoint: int | None = None  # the newest step of this run it restored or queued a save of
        if not self.service:  # (the service's own handler must stay: it is how SIGTERM reaches it)
            self._previous = signal.signal(signal.SIGTERM, self._handle)
        self._previous_int = signal.signal(signal.SIGINT, self._interrupt)

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        log.warning("SIGTERM: will checkpoint after the current step and exit")
        self.requested = True

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        self.interrupts += 1
        if self.interrupts > 1:
            self.stop_now()
        if not self.started:
            now = "the run is starting (restoring, compiling): will checkpoint after its first step"
        else:
            now = "will checkpoint after the current step" + (
                "" if self.checkpoint is not None else " (none saved yet)"
            )
        log.warning("Ctrl-C: %s and exit; Ctrl-C again stops at once without saving", now)
        if self.service:
            os.kill(os.getpid(), signal.SIGTERM)  # JAX's preemption service: every host agrees on the step
        else:
            self.requested = True

    def stop_now(self) -> None:
        """A second Ctrl-C: one line, exit 130 at once (no handler, no flush of the run's files:
        every one of them is written so that a process that dies at any point leaves it readable)."""
        if not self.started:
            then = "rerun the same command to start again (it resumes from the run's newest intact checkpoint, if any)"
        elif self.checkpoint is None:
            then = "no checkpoint of this run exists yet: the same command starts it again from the beginning"
        else:
            then = "rerun the same command to resume from the newest intact checkpoint"
        print(f"interrupted: stopped at once without saving (Ctrl-C twice); {then}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(INTERRUPTED_EXIT)

    def agreed(self, step: int, manager: Any) -> bool:
        """After update ``step``: save now and stop? (every process calls it after every step)"""
        if self.service:
            return bool(manager.reached_preemption(step))
        if jax.process_count() == 1:
            return self.requested
        return bool(multihost_utils.process_allgather(np.int32(self.requested)).any())

    def restore(self) -> None:
        if not self.service:
            signal.signal(signal.SIGTERM, self._previous)
        signal.signal(signal.SIGINT, self._previous_int)
