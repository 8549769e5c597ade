"""bench/ is a package run as `python -m bench.NAME`: no benchmark shadows a standard-library or
project module, and none rewrites sys.path to get around it."""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "bench"


def test_bench_is_a_package_and_no_benchmark_edits_sys_path():
    assert (BENCH / "__init__.py").is_file()
    files = sorted(BENCH.glob("*.py"))
    assert {"tokenize_job.py", "tokens.py", "loader.py", "model.py", "train.py", "audit.py"} <= {f.name for f in files}
    for f in files:
        for node in ast.walk(ast.parse(f.read_text(), str(f))):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                assert (node.value.id, node.attr) != ("sys", "path"), f"{f.name} edits sys.path"


def test_no_benchmark_module_is_named_like_a_standard_library_module():
    # were bench/ ever first on sys.path (a benchmark run by its file path), a bench/tokenize.py would
    # replace the standard library's tokenize for everything imported after it (linecache, inspect, ...)
    names = {f.stem for f in BENCH.glob("*.py")} | {d.name for d in BENCH.iterdir() if d.is_dir()}
    clash = sorted(names & set(sys.stdlib_module_names))
    assert clash == [], clash


@pytest.mark.slow
def test_benchmarks_run_as_modules_from_the_repository_root():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for name in ("tokenize_job", "audit"):  # the two that import nothing heavy before parsing arguments
        proc = subprocess.run(
            [sys.executable, "-m", f"bench.{name}", "--help"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stderr
        assert "usage:" in proc.stdout


def test_documented_benchmark_commands_use_the_module_form():
    """Every README / bench/RESULTS.md / docstring command is `python -m bench.X`, never the script path."""
    texts = {"README.md": (ROOT / "README.md").read_text()}
    texts.update({f"bench/{f.name}": f.read_text() for f in [*BENCH.glob("*.py"), *BENCH.glob("*.md")]})
    for where, text in texts.items():
        scripts = re.findall(r"python bench/\w+\.py|bench/\w+\.py --", text)  # a command, not a file name
        assert scripts == [], f"{where} still runs a benchmark as a script: {scripts}"
