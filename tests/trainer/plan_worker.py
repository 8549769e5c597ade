"""python -m tests.trainer.plan_worker DUMP_DIR CAPACITY_FILE [trainer.compile's arguments]

``python -m trainer.compile`` itself (the recipe and its libtpu flags, ``trainer.build``, the hosts' layout
checks, the compiler's capacity probe, the step's compile), with two changes a test needs to stop it
at the compiler's buffer assignment instead of waiting for the TPU backend's code generation:

- XLA's dump (trainer.compile's own dump flags: the steps' buffer assignment and memory-usage report)
  goes to DUMP_DIR, not to a temporary folder removed at exit;
- the capacity trainer.compile measures (``memory_report.compiler_hbm_bytes``) is written to
  CAPACITY_FILE as JSON as soon as it is known, before the step compiles.

Run as a subprocess by tests/trainer/test_compile_long.py, which kills it once the report is read.
"""

from __future__ import annotations

import json
import sys
import tempfile
import types
from typing import Any

import trainer.compile as tc
from contract.outputs import write_atomic
from trainer import memory_report as report


class KeptDump:
    """trainer.compile's ``tempfile.TemporaryDirectory`` for the dump, kept in the folder given."""

    folder = ""

    def __init__(self, prefix: str | None = None) -> None:
        self.name = self.folder

    def cleanup(self) -> None:
        pass


def main(argv: list[str]) -> int:
    dump, capacity_file, args = argv[0], argv[1], argv[2:]
    KeptDump.folder = dump
    tc.tempfile = types.SimpleNamespace(TemporaryDirectory=KeptDump, TemporaryFile=tempfile.TemporaryFile)  # type: ignore[assignment]
    probe = report.compiler_hbm_bytes

    def announced(device: Any) -> int:
        n = probe(device)
        write_atomic(capacity_file, json.dumps({"hbm_bytes_per_device": n}) + "\n")
        return n

    report.compiler_hbm_bytes = announced  # type: ignore[assignment]
    return tc.main(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
