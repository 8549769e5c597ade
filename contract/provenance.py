"""What made an output: the olmax version, the git commit of the code, the command line, when it
started and how long it took (`run_facts`), shown in the reports' collapsed "run facts" block."""

from __future__ import annotations

import datetime
import importlib.metadata
import os
import shlex
import subprocess
import sys
import time
from typing import Any

PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def olmax_version() -> str | None:
    try:
        return importlib.metadata.version("olmax")
    except importlib.metadata.PackageNotFoundError:  # run from a source tree that is not installed
        return None


def git_commit(root: str = PACKAGE_ROOT) -> str | None:
    """The checkout's HEAD commit (with "+dirty" when tracked files changed), None outside a git
    checkout or without git: an installed wheel has no commit to tell."""
    try:
        head = subprocess.run(
            ["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None


def command_line(module: str, argv: list[str] | None = None) -> str:
    """`python -m MODULE ARGS…` as it could be typed again (shell-quoted)."""
    args = sys.argv[1:] if argv is None else argv
    return shlex.join(["python", "-m", module, *args])


def run_facts(module: str, started: float, argv: list[str] | None = None) -> dict[str, Any]:
    """started: time.time() when the command began."""
    return {
        "olmax_version": olmax_version(),
        "commit": git_commit(),
        "command": command_line(module, argv),
        "started_utc": datetime.datetime.fromtimestamp(started, datetime.UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "duration_s": round(time.time() - started, 1),
    }
