"""TEST-ONLY: `python -m tests.trainer.interrupt_at POINT MARKER TRAINER-ARGS...` runs `python -m
trainer.main TRAINER-ARGS...` and, at a named point, creates the file MARKER and waits there (up to
WAIT_S) for the test to send it Ctrl-C (SIGINT), so that a test's signal lands exactly where it
means to:

  lock       in the start-up, right after the run directory's lock was taken (the Ctrl-C raises
             out of the wait: the start stops there);
  step:N:K   in the first training step of index >= N, until K Ctrl-Cs were received (K=1: the run
             then goes on, to save after that step; K=2: the second one ends it).

The trainer's code is untouched: the points are wrappers put around its functions here (as
tests/trainer/kill_at.py's). Nothing outside the tests imports this module.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import time
from pathlib import Path

from trainer import main

WAIT_S = 300


def arrived(marker: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    Path(marker).write_text("here")


def arm(point: str, marker: str) -> None:
    from contract.lock import FolderLock  # after main's logging set-up (as kill_at's)
    from trainer import loop, preemption

    if point == "lock":
        real_acquire = FolderLock.acquire

        def acquire(self):
            held = real_acquire(self)
            arrived(marker)
            deadline = time.monotonic() + WAIT_S
            while time.monotonic() < deadline:  # the Ctrl-C's KeyboardInterrupt ends the wait
                time.sleep(0.05)
            return held

        FolderLock.acquire = acquire
        return
    _, n, k = point.split(":")
    seen: dict = {"preemption": None, "step": -1}
    real_init = preemption.Preemption.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        seen["preemption"] = self

    preemption.Preemption.__init__ = init
    real_build = loop.build

    def build(cfg):
        built = real_build(cfg)
        real_step, real_schedule = built.train_step, built.schedule

        def schedule(step):  # the loop asks for each step's learning rate just before the step
            seen["step"] = int(step)
            return real_schedule(step)

        def train_step(params, opt_state, lr, batch):
            if seen["step"] == int(n):
                arrived(marker)
                deadline = time.monotonic() + WAIT_S
                while seen["preemption"].interrupts < int(k) and time.monotonic() < deadline:
                    time.sleep(0.05)
            return real_step(params, opt_state, lr, batch)

        return dataclasses.replace(built, train_step=train_step, schedule=schedule)

    loop.build = build


if __name__ == "__main__":
    where, marker, *argv = sys.argv[1:]
    assert where == "lock" or where.startswith("step:"), where
    # Ctrl-C as a terminal delivers it: a launcher that runs the suite in the background (`cmd &`
    # in a script) leaves SIGINT ignored in every child, and Python then installs no
    # KeyboardInterrupt handler; the test's SIGINT stands for a person's Ctrl-C, so restore it
    signal.signal(signal.SIGINT, signal.default_int_handler)
    main.setup_logging()  # before the trainer's modules are imported (as main.main sets it up)
    arm(where, marker)
    sys.exit(main.main(argv))
