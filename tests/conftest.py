"""Fixtures shared by every test package."""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

# The tokenize job's session-scoped runs (a generated corpus, one run per worker count): the pipeline,
# audit and contract tests share them, so each Beam run happens once per session.
pytest_plugins = ["tests.pipelines.fixtures"]


def tpu_attached() -> bool:
    """Whether a TPU chip is on this machine's PCI bus, by JAX's own probe
    (``jax/_src/hardware_utils.py``, standard library only), loaded from its file so that JAX
    itself is not imported yet: its platform setting is read from the environment at import."""
    spec = importlib.util.find_spec("jax")
    path = Path(next(iter(spec.submodule_search_locations))) / "_src" / "hardware_utils.py" if spec else None
    if path is None or not path.is_file():
        return False
    probe = importlib.util.spec_from_file_location("_olmax_tpu_probe", path)
    module = importlib.util.module_from_spec(probe)
    probe.loader.exec_module(module)
    return module.num_available_tpu_chips_and_device_id()[0] > 0


# `make test` runs the suite on pytest-xdist workers (`-n 2`): separate processes, and one process
# at a time can hold a chip.
XDIST_WORKER = "PYTEST_XDIST_WORKER" in os.environ

# With libtpu installed (the `tpu` extra, which `make test` installs for trainer.compile), JAX on a
# machine without a chip still loads libtpu, takes its lock file and prints its warnings before
# falling back to the CPU. Without a chip, or in an xdist worker, the tests and every subprocess
# they start use the CPU backend only (an explicit JAX_PLATFORMS is kept); in one pytest process on
# a TPU VM JAX picks the chip as usual.
if XDIST_WORKER or not tpu_attached():
    os.environ.setdefault("JAX_PLATFORMS", "cpu")

# The progress lines of long Beam passes (pipelines.progress: every 15 s on stderr) stay out of the
# tests' captured output, and out of the subprocesses they start; the tests of those lines set
# their own interval.
os.environ.setdefault("OLMAX_PROGRESS_S", "0")

# One XLA compilation cache for the session on the CPU (JAX's persistent cache, read from the
# environment when JAX is imported): set here, in the process pytest starts, before the xdist workers
# exist, so they and every subprocess a test starts share it. The suite's ~80 trainer subprocesses
# compile the same few small programs; a program read back from the cache is the executable that was
# compiled (the same bytes out: tests/test_compile_cache.py). A fresh directory per session, removed
# at its end; an explicit JAX_COMPILATION_CACHE_DIR is kept. Not on a chip: its tests time the step.
_OWN_CACHE = None
if os.environ.get("JAX_PLATFORMS") == "cpu" and "JAX_COMPILATION_CACHE_DIR" not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix="olmax-tests-xla-cache-")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = _OWN_CACHE
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")


def pytest_unconfigure(config):
    if _OWN_CACHE is not None:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)


ROOT = Path(__file__).resolve().parents[1]
_CHROMIUM = next((b for b in ("chromium", "chromium-browser", "google-chrome", "chrome") if shutil.which(b)), None)


def _screenshot(page: Path, shot: Path, size: str) -> subprocess.CompletedProcess:
    """Renders a local page in headless Chromium (no network: background services off) and
    screenshots it; stderr carries the page's console messages."""
    profile = shot.parent / f"{shot.stem}-profile"
    return subprocess.run(
        [
            _CHROMIUM,
            "--headless",
            "--disable-gpu",
            "--hide-scrollbars",
            "--no-sandbox",
            "--no-first-run",
            "--disable-sync",
            "--disable-background-networking",
            "--disable-component-update",
            f"--user-data-dir={profile}",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={shot}",
            f"--window-size={size}",
            f"file://{page}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )


def missing_browser(env) -> tuple[str, str]:
    """What a render test does without Chromium: ("fail", why) in CI (`CI=true`, which .ci/run
    exports after installing it), else ("skip", why) — a dev machine need not have a browser."""
    if env.get("CI", "").lower() == "true":
        return "fail", "headless Chromium is missing in CI (.ci/run installs the Debian package chromium)"
    return "skip", "headless Chromium is not installed"


@pytest.fixture
def chromium():
    """`screenshot(page, shot, size)`. Skips where Chromium is missing, except in CI (CI=true), where
    .ci/run installs it: there a missing browser fails, so the render tests cannot pass by skipping."""
    if _CHROMIUM is None:
        action, why = missing_browser(os.environ)
        (pytest.fail if action == "fail" else pytest.skip)(why)
    return _screenshot


# Run the `tpu` tests on whatever backend JAX has (a dry run of the chip tests on a CPU: they size
# themselves by the backend they find), instead of skipping them without a TPU.
TPU_TESTS_ON_CPU_ENV = "OLMAX_TPU_TESTS_ON_CPU"


@functools.cache
def default_backend() -> str:
    """JAX's default backend, asked in a child process (called only when a tpu test is collected):
    a process that opens a TPU holds it, so the pytest process must not, or the chip tests' trainer
    subprocesses could not open it."""
    proc = subprocess.run(
        [sys.executable, "-c", "import jax; print(jax.default_backend())"], capture_output=True, text=True, timeout=300
    )
    return proc.stdout.strip().splitlines()[-1] if proc.returncode == 0 and proc.stdout.strip() else "unknown"


def on_tpu() -> bool:
    """True when JAX's default backend is a TPU."""
    return default_backend() == "tpu"


# The files that take longest in `make test`, longest first: per-file totals of the slowest tests and
# fixtures of a full-suite `pytest -q -n 2 --durations=120 tests` (bench/RESULTS.md, "make test time,
# round 7b"; each 1-5 minutes on 2 loaded cores, most of it one compile, one fixture or a few trainer
# starts). Dealt first, so that the last files dealt are short ones.
LONGEST_FILES = (
    "tests/trainer/test_compile.py",
    "tests/model/test_numerics.py",
    "tests/model/test_attention.py",
    "tests/pipelines/test_downstream_tasks.py",
    "tests/trainer/downstream/test_score.py",
    "tests/trainer/test_microbatches.py",
    "tests/bench/test_mfu.py",
    "tests/trainer/downstream/test_cross_framework.py",
    "tests/trainer/test_train_run.py",
    "tests/trainer/downstream/test_downstream_in_loop.py",
    "tests/trainer/test_preflight.py",
    "tests/model/test_param_sharding.py",
    "tests/trainer/test_checkpoint_sigkill.py",
    "tests/bench/test_attention_bench.py",
    "tests/trainer/test_checkpoint_write_failure.py",
    "tests/trainer/test_data_contract.py",
    "tests/trainer/test_eval_run.py",
    "tests/trainer/test_attention_run.py",
    "tests/trainer/test_olmo_reference.py",
    "tests/model/test_layers.py",
)


def deal_order(item: pytest.Item, slow_files: set) -> tuple[int, int]:
    """Where `item`'s file is dealt to the xdist workers: the longest files first (LONGEST_FILES,
    in that order), then the other files holding a test marked slow (trainer, compile and bench
    subprocesses), then the rest, so that the run does not end with one worker finishing a long
    file alone. `make test` passes --no-loadscope-reorder, or --dist loadfile would deal the files
    with the most tests first (and the 7B compile, one test, 121st of 138)."""
    rel = item.path.relative_to(ROOT).as_posix() if item.path.is_relative_to(ROOT) else str(item.path)
    if rel in LONGEST_FILES:
        return (0, LONGEST_FILES.index(rel))
    return (1 if item.path in slow_files else 2, 0)


def pytest_collection_modifyitems(config, items):
    """`@pytest.mark.tpu` tests run only where JAX's default backend is a TPU (CI has none: they
    skip there, and their results are recorded in bench/RESULTS.md with the command that ran them),
    or anywhere with OLMAX_TPU_TESTS_ON_CPU=1. One program at a time holds a chip, so they run in
    one process: in an xdist worker (pytest -n, as `make test` runs) they skip; those marked
    `tpu_subprocesses` run first, before any test opens the chip in the pytest process itself.
    On xdist workers the files are put in the order they are dealt out (`deal_order`)."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    if XDIST_WORKER:
        items.sort(key=lambda item: deal_order(item, slow_files))  # stable: file order kept otherwise
    tpu_items = [item for item in items if item.get_closest_marker("tpu")]
    if not tpu_items:
        return
    items.sort(key=lambda item: item.get_closest_marker("tpu_subprocesses") is None)  # stable
    if os.environ.get(TPU_TESTS_ON_CPU_ENV) == "1":
        return
    if XDIST_WORKER:
        why = "the chip tests run in one process (python -m pytest -m tpu tests), not on pytest-xdist workers"
    elif on_tpu():
        return
    else:
        why = "needs a TPU backend (JAX's default backend is not tpu)"
    skip = pytest.mark.skip(reason=why)
    for item in tpu_items:
        item.add_marker(skip)
