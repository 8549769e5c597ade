"""The two kinds of project error; every olmax error class derives from one of them, and each
command line's ``main`` turns them into its exit code and one ``error:`` line:

    Refused  exit 2  the input or the config is wrong; nothing was written (or what a start
                     wrote is put back)
    Stopped  exit 1  something failed while the command ran (a damaged shard or checkpoint, a
                     run that stopped for the reason given)

A class keeps the Python base its callers catch (``class ManifestError(Refused, ValueError)``).
A class that is both (a resume refused by the checkpoint code: ``RefusedConfigError`` is a
``CheckpointError``) is a refusal: ``exit_code`` and every ``main`` test ``Refused`` first.
"""

from __future__ import annotations

import sys


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
