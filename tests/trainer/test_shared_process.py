"""The shared trainer process (tests/trainer/shared_process.py) reports a case as its own process would: the exit
status of ``sys.exit(main(argv))``, every byte written to fds 1 and 2, the traceback of an escaped
exception; and each case starts with the environment and working directory the driver had.
The cases run with pytest's own capture off (``capfd.disabled()``): the driver runs with the
process's real fds 1 and 2 and ``sys.stdout``/``sys.stderr`` writing to them, as here."""

from __future__ import annotations

import os
import sys

import pytest

from tests.trainer.shared_process import exit_status, run_case


def test_a_case_reports_the_exit_status_a_process_would_have(capfd):
    assert exit_status(lambda argv: 2, []) == 2
    assert exit_status(lambda argv: 0, []) == 0

    def exits(code):
        def entry(argv):
            raise SystemExit(code)

        return entry

    assert [exit_status(exits(c), []) for c in (None, 0, 2, 7)] == [0, 0, 2, 7]
    with capfd.disabled():
        case = run_case(exits("a message"), [])
    assert (case["returncode"], case["stderr"]) == (1, "a message\n")  # SystemExit("...") prints it, exits 1


def test_every_byte_a_case_writes_is_its_own_and_an_escaped_exception_is_a_traceback(capfd, tmp_path):
    def entry(argv):
        print("out", *argv)
        print("error: said", file=sys.stderr)
        os.write(2, b"raw fd 2\n")  # a C library's write, past Python's sys.stderr
        os.environ["OLMAX_REFUSALS_TEST"] = "set by the case"
        os.chdir(tmp_path)
        raise KeyError("escaped")

    before = (dict(os.environ), os.getcwd())
    with capfd.disabled():
        case, quiet = run_case(entry, ["a", "b"]), run_case(lambda argv: 0, [])
    assert case["returncode"] == 1 and case["stdout"] == "out a b\n"
    assert case["stderr"].startswith("error: said\nraw fd 2\nTraceback (most recent call last):")
    assert case["stderr"].endswith("KeyError: 'escaped'\n")
    assert (dict(os.environ), os.getcwd()) == before  # put back for the next case
    assert quiet == {"returncode": 0, "stdout": "", "stderr": ""}  # nothing of the last case leaks into this one


def test_the_client_runs_only_trainer_commands(tmp_path):
    from tests.trainer.shared_process import OneProcess

    driver = OneProcess(sys.executable, tmp_path, dict(os.environ), tmp_path / "log", 10)
    with pytest.raises(ValueError, match="not a `python -m trainer.main` command"):
        driver.run([sys.executable, "-m", "trainer.compile"])
    assert driver.proc is None  # nothing was started
