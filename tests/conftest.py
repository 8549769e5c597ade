"""Fixtures shared by every test package."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

_CHROMIUM = next((b for b in ("chromium", "chromium-browser", "google-chrome", "chrome") if shutil.which(b)), None)


def _screenshot(page: Path, shot: Path, size: str) -> subprocess.CompletedProcess:
    """Renders a local page in headless Chromium (no network: background services off) and
    screenshots it; stderr carries the page's console messages."""
    profile = shot.parent / f"{shot.stem}-profile"
    return subprocess.run(
        [_CHROMIUM, "--headless", "--disable-gpu", "--no-sandbox", "--no-first-run", "--disable-sync",
         "--disable-background-networking", "--disable-component-update", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", f"--screenshot={shot}", f"--window-size={size}", f"file://{page}"],
        capture_output=True, text=True, timeout=120)


@pytest.fixture
def chromium():
    """`screenshot(page, shot, size)`. Skips where Chromium is missing, except in CI (CI=true), where
    .ci/run installs it: there a missing browser fails, so the render tests cannot pass by skipping."""
    if _CHROMIUM is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("headless Chromium is missing in CI (.ci/run installs the Debian package chromium)")
        pytest.skip("headless Chromium is not installed")
    return _screenshot
