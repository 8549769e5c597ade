"""bench/ is run by hand; these check only what keeps it from breaking the standard library."""
from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def test_no_benchmark_module_shadows_a_standard_library_module():
    # `python bench/X.py` puts bench/ first on sys.path: a bench/tokenize.py would then replace the
    # standard library's tokenize for everything the benchmark imports (linecache, inspect, ...)
    names = {p.stem for p in BENCH.glob("*.py")} | {p.name for p in BENCH.iterdir() if p.is_dir()}
    assert names & {"tokenize_job", "tokens"}, names  # the folder was found
    assert not names & set(sys.stdlib_module_names), sorted(names & set(sys.stdlib_module_names))
