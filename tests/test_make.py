"""`make demo` installs only the package it runs; `make test` adds the test and tpu extras; `make check` runs
the linter, the formatter's check and the type checker that the dev extra pins."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# What the test extra brings for the tests' reference implementations, never needed by a run.
TEST_ONLY = ("torch", "transformers", "olmo_core", "olmo_eval", "pytest", "wandb")


def _recipe(target: str) -> tuple[list[str], list[str]]:
    """(prerequisites, recipe lines) of a Makefile target, variables left unexpanded."""
    text = (ROOT / "Makefile").read_text()
    m = re.search(rf"^{re.escape(target)}:(.*)\n((?:\t.*\n?)*)", text, re.M)
    assert m, f"no target {target} in the Makefile"
    return m.group(1).split(), [line.strip() for line in m.group(2).splitlines()]


def _installs(stamp: str) -> list[str]:
    return [line for line in _recipe(stamp)[1] if "pip install" in line and "--upgrade pip" not in line]


def test_make_demo_installs_the_package_without_extras():
    prereqs, _ = _recipe("demo")
    assert prereqs == ["$(STAMP)"]
    assert [line.split("install")[-1].split() for line in _installs("$(STAMP)")] == [["-q", "-e", "."]]


def test_make_test_installs_the_test_and_tpu_extras():
    prereqs, _ = _recipe("test")
    assert prereqs == ["$(TEST_STAMP)"]
    assert "$(STAMP)" in _recipe("$(TEST_STAMP)")[0]
    assert any("'.[test,tpu]'" in line for line in _installs("$(TEST_STAMP)"))


@pytest.mark.slow
def test_the_demo_commands_import_nothing_from_the_test_extra():
    """Each module the demo runs imports with the test-only packages made unimportable."""
    modules = ["pipelines.tokenize", "trainer.main", "audit.__main__"]
    _, lines = _recipe("demo")
    assert all(any(f"-m {m.removesuffix('.__main__')} " in line for line in lines) for m in modules)
    code = (
        "import sys\n"
        + "".join(f"sys.modules[{p!r}] = None\n" for p in TEST_ONLY)
        + "".join(f"import {m}\n" for m in modules)
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-2000:]


@pytest.mark.parametrize("stamp", ["$(STAMP)", "$(TEST_STAMP)"])
def test_an_install_says_what_it_brings_how_big_and_how_long_before_pip_starts(stamp):
    """Before, the first `make` was silent for ~2.5 minutes while pip fetched 1.8 GB (pip stays
    quiet: -q; one line says what is coming)."""
    _, lines = _recipe(stamp)
    first_pip = next(i for i, line in enumerate(lines) if "pip install" in line)
    says = [line for line in lines[:first_pip] if line.startswith("@echo ")]
    assert len(says) == 1, lines
    assert re.search(r"about [\d.]+ GB", says[0]) and re.search(r"minutes", says[0]) and "$(VENV)" in says[0]
    assert all(" -q " in line for line in lines if "pip install" in line)


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def test_make_check_runs_ruff_lint_ruff_format_check_mypy_and_the_import_contracts():
    prereqs, lines = _recipe("check")
    assert prereqs == ["$(DEV_STAMP)"]
    assert [line.split()[1:] for line in lines] == [["check", "."], ["format", "--check", "."], ["-m", "mypy"], []]
    assert lines[0].startswith("$(BIN)/ruff ") and lines[2].startswith("$(BIN)/python ")
    assert lines[3] == "$(BIN)/lint-imports"
    assert any("'.[dev]'" in line for line in _installs("$(DEV_STAMP)"))


def test_make_fix_applies_ruff_fixes_then_formats():
    _, lines = _recipe("fix")
    assert [line.split()[1:3] for line in lines] == [["check", "--fix"], ["format", "."]]


def test_the_dev_extra_pins_ruff_mypy_and_import_linter_and_the_test_extra_brings_it():
    """CI installs `.[test,tpu]` for make test: the same pinned tools as make check's own install."""
    extras = _extras()
    pins = {re.split(r"[=<>\[]", req)[0]: req for req in extras["dev"]}
    assert re.fullmatch(r"ruff==[\d.]+", pins["ruff"]) and re.fullmatch(r"mypy==[\d.]+", pins["mypy"])
    assert re.fullmatch(r"import-linter==[\d.]+", pins["import-linter"])
    assert "olmax[dev]" in extras["test"]


def _pytest_line(target: str) -> list[str]:
    """The pytest command `make -n <target>` would run, split into words (variables expanded)."""
    out = subprocess.run(["make", "-n", target], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    lines = [line for line in out.splitlines() if " -m pytest " in line]
    assert len(lines) == 1, out
    return shlex.split(lines[0])


def test_make_test_runs_every_test_on_two_workers_a_file_per_worker():
    words = _pytest_line("test")
    assert words[words.index("-n") + 1] == "2" and words[words.index("--dist") + 1] == "loadfile"
    assert "--no-loadscope-reorder" in words  # files dealt out in tests/conftest.py's order (deal_order)
    assert words[-1] == "tests" and "-m" not in words[words.index("pytest") :]  # the default selection: all of it


def test_the_longest_files_are_dealt_out_first_then_the_slow_ones_then_the_rest():
    """tests/conftest.py's deal order (make test keeps it: --no-loadscope-reorder): every file named
    in LONGEST_FILES exists (a stale name would silently order nothing), in their listed order."""
    from types import SimpleNamespace

    from tests.conftest import LONGEST_FILES, deal_order

    assert all((ROOT / f).is_file() for f in LONGEST_FILES)
    item = lambda rel: SimpleNamespace(path=ROOT / rel)
    slow = {ROOT / "tests/trainer/test_loop_overlap.py"}  # a slow file not among the longest
    order = [
        deal_order(item(f), slow) for f in (*LONGEST_FILES, "tests/trainer/test_loop_overlap.py", "tests/test_make.py")
    ]
    assert order == sorted(order) and len(set(order)) == len(order)


def test_make_test_fast_leaves_out_the_slow_the_chip_and_the_compile_check_tests_only():
    words = _pytest_line("test-fast")
    assert words[words.index("-n") + 1] == "2" and words[words.index("--dist") + 1] == "loadfile"
    assert words[words.index("-m", words.index("pytest")) + 1] == "not slow and not tpu and not compile_check"
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    assert {m.split(":")[0] for m in markers} >= {"slow", "tpu", "compile_check"}


def test_the_test_extra_pins_the_xdist_that_make_test_runs_on():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["test"]
    assert [d for d in extra if d.startswith("pytest-xdist")] == ["pytest-xdist==3.8.0"]


def test_an_editable_install_prints_no_warning_box(tmp_path):
    """`make demo` installs the package editable: setuptools' meta-path finder printed a 12-line
    "Editable installation" box there; with the root as package dir the editable wheel is one .pth
    line, built silently. (The wheel is built with setuptools' PEP 660 hook, as pip would, and not
    installed: installing it would replace the running environment's olmax.)"""
    code = "from setuptools import build_meta as b; print(b.build_editable(__import__('sys').argv[1]))"
    proc = subprocess.run(
        [sys.executable, "-W", "always", "-c", code, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "Editable installation" not in proc.stderr and "*****" not in proc.stderr, proc.stderr
    with zipfile.ZipFile(tmp_path / proc.stdout.split()[-1]) as wheel:
        (pth,) = [n for n in wheel.namelist() if n.endswith(".pth")]
        assert wheel.read(pth).decode().split() == [str(ROOT)]
