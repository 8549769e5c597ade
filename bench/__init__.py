"""Benchmarks, run by hand from the repository root as modules: ``python -m bench.tokenize_job``,
``python -m bench.loader``, ``python -m bench.model``, ``python -m bench.train``, ``python -m bench.audit``,
``python -m bench.tokens``, ``python -m bench.olmo_order``, ``python -m bench.mfu`` (the trainer's step on a chip).

A package (not a folder of scripts): running ``python -m bench.X`` puts the repository root, not
``bench/``, on ``sys.path``. And no module here is named like a standard-library one (the tokenize
benchmark is ``tokenize_job``; tested), so nothing shadows the standard library even were ``bench/``
ever put on the path. Not installed with the project (see pyproject's packages).
"""


def rss_mib() -> float:
    """This process's resident memory now (VmRSS, MiB), read from /proc/self/status (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")
