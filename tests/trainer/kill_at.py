"""TEST-ONLY: `python -m tests.trainer.kill_at POINT:N TRAINER-ARGS...` runs `python -m trainer.main
TRAINER-ARGS...` and SIGKILLs itself at a named point, so a test kills a run exactly where it
means to (a preemption as the trainer sees it: no handler runs, nothing is flushed):

  committed:N  right after checkpoint N's save returned and its directory has its final name;
  step:N       in the first training step of index >= N, once checkpoint N has its final name;
  eval:N       in the first evaluation after the training step of index >= N (ditto);
  written:M    in orbax's commit path of checkpoint M: every file
               written, before its checksums and before its commit;
  sealed:M     in orbax's commit path of checkpoint M: checksums recorded, before the commit.

The trainer's code is untouched: the points are wrappers put around its functions here. Nothing
outside the tests imports this module.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time
from pathlib import Path

from trainer import main


def die() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def wait_committed(directory: Path, step: int) -> None:
    """Until the step directory has its final name (orbax commits in a background thread)."""
    deadline = time.monotonic() + 120
    while not (directory / str(step)).is_dir():
        if time.monotonic() > deadline:
            raise SystemExit(f"kill_at: checkpoint {step} never appeared in {directory}")
        time.sleep(0.01)


def arm(point: str, n: int) -> None:
    from trainer import heldout_eval, loop  # after main's logging set-up
    from trainer.checkpointing import checkpoints as checkpoint
    from trainer.checkpointing import files as checkpoint_files

    seen = {"directory": None, "step": -1}
    real_init, real_save = checkpoint.Checkpoints.__init__, checkpoint.Checkpoints.save

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        seen["directory"] = self.directory

    def save(self, step, *args, **kwargs):
        real_save(self, step, *args, **kwargs)
        if point == "committed" and step == n:
            wait_committed(self.directory, n)
            die()

    checkpoint.Checkpoints.__init__, checkpoint.Checkpoints.save = init, save

    if point in ("step", "eval"):
        real_build = loop.build

        def build(cfg):
            built = real_build(cfg)
            real_step, real_schedule = built.train_step, built.schedule

            def schedule(step):  # the loop asks for each step's learning rate just before the step
                seen["step"] = int(step)
                return real_schedule(step)

            def train_step(params, opt_state, lr, batch):
                if point == "step" and seen["step"] >= n:
                    wait_committed(seen["directory"], n)
                    die()
                return real_step(params, opt_state, lr, batch)

            return dataclasses.replace(built, train_step=train_step, schedule=schedule)

        loop.build = build
        real_call = heldout_eval.Evaluator.__call__

        def call(self, params):
            if point == "eval" and seen["step"] >= n:
                wait_committed(seen["directory"], n)
                die()
            return real_call(self, params)

        heldout_eval.Evaluator.__call__ = call

    if point in ("written", "sealed"):
        real_seal = checkpoint_files.seal

        def seal(step_dir):
            if int(Path(step_dir).name.split(".")[0]) == n:
                if point == "written":
                    die()
                real_seal(step_dir)
                die()
            real_seal(step_dir)

        checkpoint_files.seal = seal


if __name__ == "__main__":
    where, *argv = sys.argv[1:]
    name, _, step = where.partition(":")
    assert name in ("committed", "step", "eval", "written", "sealed"), where
    main.setup_logging()  # before the trainer's modules are imported (as main.main sets it up)
    arm(name, int(step))
    sys.exit(main.main(argv))
