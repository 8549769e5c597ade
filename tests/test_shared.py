"""build_once: a session fixture's value is built once for all pytest-xdist workers of a run."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.shared import build_once


class _Factory:
    """The part of pytest's TempPathFactory build_once uses: one worker's basetemp, under the run's."""

    def __init__(self, run: Path, worker: str):
        self.base = run / f"popen-{worker}"
        self.base.mkdir(parents=True, exist_ok=True)

    def getbasetemp(self) -> Path:
        return self.base


def test_two_workers_asking_at_once_build_the_value_once_and_both_get_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    builds, got = [], {}

    def build(folder: Path) -> tuple[Path, int]:
        builds.append(folder)
        time.sleep(0.3)  # long enough that the other worker asks while this one builds
        (folder / "out").write_text("built")
        return folder, len(builds)

    def worker(name: str) -> None:
        got[name] = build_once(_Factory(tmp_path, name), "job", build)

    threads = [threading.Thread(target=worker, args=(w,)) for w in ("gw0", "gw1")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(builds) == 1 and got["gw0"] == got["gw1"] == (tmp_path / "shared" / "job", 1)
    assert (tmp_path / "shared" / "job" / "out").read_text() == "built"


def test_a_build_that_failed_is_built_again_from_an_empty_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")

    def failing(folder: Path):
        (folder / "half").write_text("x")
        raise RuntimeError("the job failed")

    with pytest.raises(RuntimeError, match="the job failed"):
        build_once(_Factory(tmp_path, "gw0"), "job", failing)
    assert build_once(_Factory(tmp_path, "gw1"), "job", lambda folder: sorted(p.name for p in folder.iterdir())) == []


def test_without_xdist_each_session_builds_its_own(tmp_path_factory, monkeypatch):
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    a = build_once(tmp_path_factory, "job", lambda folder: folder)
    b = build_once(tmp_path_factory, "job", lambda folder: folder)
    assert a != b and a.is_dir() and b.is_dir()
