"""`python -m tests.trainer.olmo_reference_runs SPEC.json`: the olmax side of the OLMo-core reference
tests, `trainer.main.main` itself (the CLI's own entry point, as `python -m trainer.main` runs it) once
per run named in SPEC ({"config": YAML, "runs": [[run_dir, [override, ...]], ...]}), in order, in this
one process: each run pays its own compilation but not JAX's start-up. Exit status: the first
non-zero run's, else 0."""

from __future__ import annotations

import json
import sys


def main(argv: list[str]) -> int:
    spec = json.loads(open(argv[0]).read())
    from trainer import main as trainer_main

    for run_dir, overrides in spec["runs"]:
        code = trainer_main.main(["--config", spec["config"], "--run_dir", run_dir, *overrides])
        if code:
            return code
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
