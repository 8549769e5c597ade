"""`python -m trainer.main` commands, many in one process: what each start-up refusal test needs
(exit 2, one `error:` line, no traceback, the run dir left as it was), and short training runs that
must finish, without paying JAX's start (2.5-4 s of CPU, ~5 s for a run) once per command.

`python -m tests.trainer.shared_process` is the driver: it reads one JSON request a line on stdin
(``{"argv": [...]}``: a trainer command's arguments after ``python -m trainer.main``), runs
``trainer.main.main(argv)`` in its own process with file descriptors 1 and 2 sent to files for
that case (so every byte the case writes is captured: print, logging, warnings, C libraries),
and answers one JSON line ``{"returncode", "stdout", "stderr"}`` on the descriptor its stdout
was: the exit status ``python -m trainer.main`` would have had (``sys.exit(main())``: main's
return value, a SystemExit's code, or 1 with the traceback Python prints for an exception that
escapes). The environment and working directory are put back after each case.

`OneProcess` is the tests' side (`tests/trainer/conftest.py`'s session fixture ``trainer_process``):
``.run(trainer_cmd(...))`` returns a `subprocess.CompletedProcess`, as ``subprocess.run`` of the same
command did. The driver runs the cases of one pytest process (one per xdist worker); it must end
with exit 0 and no traceback (the fixture's teardown checks its log).

What a case cannot share with the others stays a true subprocess: a different CPU device count
(``jax_num_cpu_devices`` is set once per process: every case here runs on trainer_cmd's 2),
``jax.distributed``, a run whose test sets environment variables (the driver keeps the one it
started with), a run that is killed or signalled or stops with an error mid-run, and one real
refusal start per start-up phase, so that the ``python -m trainer.main`` process path itself
stays proven. Runs in the driver (``run_trainer(..., via=trainer_process)``: ``reference_run``
among them) are still compared bit for bit with runs in fresh processes: the SIGKILL chain's
starts (`test_checkpoint_sigkill.py`), the two-process run (`test_train_run.py`). The refusal
starts kept:

* a config value, before JAX: ``test_config.py::test_the_cli_refuses_impossible_values_before_anything_runs``
* the process flags, before JAX: ``test_main.py::test_process_flags_alone_are_refused_by_the_cli_before_anything_starts``
* ``jax.distributed``: ``test_main.py::test_distributed_with_no_cluster_in_the_environment_is_one_error_line``
* the data's start-up checks: ``test_shard_paths_run.py``
* the mesh, JAX up: ``test_microbatches.py::test_a_batch_that_does_not_split_into_the_microbatches_exits_2``,
  which also runs its command here and compares (exit status, stdout, the `error:` line)
* after the lock (the checkpoint's settings, the run dir put back as found):
  ``test_preflight.py::test_a_refused_resume_leaves_the_run_dir_exactly_as_it_found_it``
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import IO

ENTRY = ["-m", "trainer.main"]


def exit_status(entry: Callable[[list[str]], int], argv: list[str]) -> int:
    """The exit status of ``sys.exit(entry(argv))`` as the interpreter sets it; an exception that
    escapes is printed as the interpreter prints it (its traceback, on stderr) and gives 1."""
    try:
        return entry(argv)
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - what an uncaught exception does to a process, for any kind
        traceback.print_exc()
        return 1


def run_case(entry: Callable[[list[str]], int], argv: list[str]) -> dict:
    """One case with fds 1 and 2 captured; the environment and cwd as they were before it."""
    env, cwd = dict(os.environ), os.getcwd()
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        try:
            code = exit_status(entry, argv)
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
            os.chdir(cwd)
            os.environ.clear()
            os.environ.update(env)
        out.seek(0)
        err.seek(0)
        return {
            "returncode": code,
            "stdout": out.read().decode("utf-8", "replace"),
            "stderr": err.read().decode("utf-8", "replace"),
        }


def serve(requests: IO[str], entry: Callable[[list[str]], int]) -> int:
    """Answer each request line on the descriptor stdout was; stdout itself goes to stderr between
    cases, so that nothing but answers reaches the answer pipe."""
    answers = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    for line in requests:
        answers.write(json.dumps(run_case(entry, json.loads(line)["argv"])) + "\n")
        answers.flush()
    return 0


class DriverGone(AssertionError):
    """The driver died or hung during a case (its log says why)."""


class OneProcess:
    """The client: one driver process (started on first use, again after one died), fed a case at a time."""

    def __init__(self, python: str, root: Path, env: dict[str, str], log: Path, timeout: float) -> None:
        self.python, self.root, self.env, self.log, self.timeout = python, root, env, log, timeout
        self.proc: subprocess.Popen | None = None
        self.cases = 0

    def _start(self) -> subprocess.Popen:
        with open(self.log, "a") as log:
            return subprocess.Popen(
                [self.python, "-m", "tests.trainer.shared_process"],
                cwd=self.root,
                env=self.env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )

    def run(self, cmd: list[str], timeout: float | None = None) -> subprocess.CompletedProcess:
        """``subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=...)``
        for a ``python -m trainer.main`` command, run by the driver (a hang kills it: DriverGone)."""
        timeout = self.timeout if timeout is None else timeout
        if cmd[1:3] != ENTRY:
            raise ValueError(f"not a `python -m trainer.main` command: {cmd[:3]}")
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        proc = self.proc
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps({"argv": cmd[3:]}) + "\n")
        proc.stdin.flush()
        deadline = time.monotonic() + timeout
        while not select.select([proc.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
            if time.monotonic() >= deadline:
                proc.kill()
                proc.wait()
                raise DriverGone(f"the shared trainer process ran past {timeout} s on {cmd[3:]} (its log: {self.log})")
        line = proc.stdout.readline()
        if not line:
            proc.wait()
            raise DriverGone(
                f"the shared trainer process exited {proc.returncode} on {cmd[3:]}: {self.log_text()[-3000:]}"
            )
        self.cases += 1
        answer = json.loads(line)
        return subprocess.CompletedProcess(cmd, answer["returncode"], answer["stdout"], answer["stderr"])

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def close(self, timeout: float = 60) -> int | None:
        """End the driver (its stdin closed: it leaves its loop and exits as a process does); its exit status."""
        if self.proc is None:
            return None
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def main() -> int:
    from trainer.main import main as trainer_main  # as `python -m trainer.main` imports it

    return serve(sys.stdin, trainer_main)


if __name__ == "__main__":
    sys.exit(main())
