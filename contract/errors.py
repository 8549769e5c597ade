"""The two kinds of project error; every olmax error class derives from one of them, and each
command line's ``main`` turns them into its exit code and one ``error:`` line:

    Refused  exit 2  the input or the config is wrong; nothing was written (or what a start
                     wrote is put back)
    Stopped  exit 1  something failed while the command ran (a damaged shard or checkpoint, a
                     run that stopped for the reason given)

A command whose exit 1 is a verdict's FAIL (the audit, compare) exits STOPPED_BY_VERDICT_COMMAND
(3) on a Stopped instead, so that a write failure is never read as a FAIL (`run_main(body, 3)`).

A class keeps the Python base its callers catch (``class ManifestError(Refused, ValueError)``).
A class that is both (a resume refused by the checkpoint code: ``RefusedConfigError`` is a
``CheckpointError``) is a refusal: ``exit_code`` and every ``main`` test ``Refused`` first.
"""

from __future__ import annotations

import sys
from collections.abc import Callable

STOPPED_BY_VERDICT_COMMAND = 3  # the exit code of a Stopped where exit 1 is a verdict's FAIL
INTERRUPTED_EXIT = 130  # 128 + SIGINT: a command stopped by Ctrl-C (what a shell reports for one)


class Refused(Exception):
    """The input or the config is wrong; nothing was written (exit 2)."""

    exit_code = 2


class Stopped(Exception):
    """Something failed while running (exit 1)."""

    exit_code = 1


def exit_code(error: BaseException) -> int | None:
    """2 for a Refused, 1 for a Stopped (a class that is both: 2), None for any other exception."""
    if isinstance(error, Refused):
        return Refused.exit_code
    if isinstance(error, Stopped):
        return Stopped.exit_code
    return None


def report(error: Refused | Stopped) -> int:
    """Print ``error: <message>`` to stderr; the exit code of its kind."""
    print(f"error: {error}", file=sys.stderr)
    code = exit_code(error)
    assert code is not None, error
    return code


INTERRUPTED = "interrupted (Ctrl-C): stopped before it finished; rerun the same command"


def interrupted(error: BaseException | None) -> bool:
    """A Ctrl-C's KeyboardInterrupt, or an error raised because of one: Python 3.11 wraps one that
    lands while an import runs a class body in a RuntimeError ("Error calling __set_name__")."""
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def run_main(
    body: Callable[[], int], stopped_code: int = Stopped.exit_code, interrupted_line: str = INTERRUPTED
) -> int:
    """`body()`'s exit code; a Refused or Stopped it raises: one `error:` line, exit 2 (Refused)
    or `stopped_code` (Stopped: 1, or STOPPED_BY_VERDICT_COMMAND in a command that has a FAIL);
    a Ctrl-C: `interrupted_line`, exit INTERRUPTED_EXIT (130)."""
    try:
        return body()
    except (Refused, Stopped) as e:
        code = report(e)
        return stopped_code if code == Stopped.exit_code else code
    except BaseException as e:
        if not interrupted(e):
            raise
        print(interrupted_line, file=sys.stderr, flush=True)
        return INTERRUPTED_EXIT


def yaml_error_line(error: Exception) -> str:
    """A YAML parser's error (PyYAML's MarkedYAMLError: problem, context, marks; read by duck
    typing, the contract imports no YAML) as one line: "line L, column C: problem (context)"."""
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None)
    if mark is not None and problem:
        context = getattr(error, "context", None)
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else "")
    return " ".join(str(error).split())
