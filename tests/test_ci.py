"""CI runs the render tests for real: .ci/run exports CI=true before the suite, and with CI=true a
missing browser fails the render tests instead of skipping them."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import missing_browser

CI_RUN = Path(__file__).resolve().parents[1] / ".ci" / "run"


def test_ci_script_exports_ci_true_before_the_tests_run():
    lines = [line.strip() for line in CI_RUN.read_text().splitlines()]
    assert "export CI=true" in lines and "make test" in lines
    assert lines.index("export CI=true") < lines.index("make test")
    assert any("apt-get install" in line and "chromium" in line for line in lines[: lines.index("make test")])


def test_ci_runs_make_check_before_make_test_and_the_7b_compile_after_it():
    lines = [line.strip() for line in CI_RUN.read_text().splitlines()]
    assert "make check" in lines and lines.index("make check") < lines.index("make test")
    # make test deselects the 7B compile (pyproject's addopts): CI runs it on its own
    assert "make compile-7b" in lines and lines.index("make test") < lines.index("make compile-7b")


def test_ci_runs_the_proofs_make_test_deselects_in_their_own_step():
    """make test deselects ci_extra (pyproject's addopts, for its 12 minutes): CI must run them."""
    lines = [line.strip() for line in CI_RUN.read_text().splitlines()]
    assert "make test-extra" in lines and lines.index("make test") < lines.index("make test-extra")
    pyproject = (CI_RUN.parents[1] / "pyproject.toml").read_text()
    assert "not ci_extra" in pyproject
    makefile = (CI_RUN.parents[1] / "Makefile").read_text()
    assert "-m ci_extra tests" in makefile


def test_ci_checks_the_65k_proxys_memory_plan_after_the_7b_compile():
    """make test deselects compile_plan (pyproject's addopts): CI runs the 65k one-chip proxy's
    memory-plan check (make compile-long) in its own step, after the 7B compile; make compile-check
    runs it too, with the whole compiles."""
    lines = [line.strip() for line in CI_RUN.read_text().splitlines()]
    assert "make compile-long" in lines and lines.index("make compile-7b") < lines.index("make compile-long")
    assert "not compile_plan" in (CI_RUN.parents[1] / "pyproject.toml").read_text()
    makefile = (CI_RUN.parents[1] / "Makefile").read_text()
    assert "-m compile_plan tests/trainer/test_compile_long.py" in makefile
    check = next(line for line in makefile.splitlines() if '-m "compile_check or' in line)
    assert "compile_long or compile_plan" in check and "test_compile_context.py" in check


def test_a_missing_browser_fails_in_ci_and_skips_on_a_dev_machine():
    assert missing_browser({"CI": "true"})[0] == "fail" and missing_browser({"CI": "TRUE"})[0] == "fail"
    assert missing_browser({})[0] == "skip" and missing_browser({"CI": ""})[0] == "skip"


def test_a_passed_tests_tmp_path_is_removed_when_it_ends(pytestconfig):
    """A whole run would otherwise leave ~4 GB of trainer run dirs behind, and a CI run here failed
    once with "No space left on device": pytest keeps only a failed test's tmp_path."""
    assert pytestconfig.getini("tmp_path_retention_policy") == "failed"
