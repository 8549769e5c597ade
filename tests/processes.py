"""Real multi-process tests on loopback (jax.distributed + CPU gloo collectives): start N worker
modules, wait for them, never leave one running."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TIMEOUT_S = 120


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def workers(module: str, *args: str, n: int = 2) -> Iterator[list[subprocess.Popen]]:
    """`python -m module PORT i *args` for i in 0..n-1 (CPU only, this checkout first on the path);
    any still running when the block ends is killed."""
    port = str(free_port())
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": ROOT, "XLA_FLAGS": ""}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", module, port, str(i), *args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(n)
    ]
    try:
        yield procs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def outputs_ok(procs: list[subprocess.Popen], word: str = "OK") -> list[str]:
    """Each worker's stdout, once all have exited 0 printing `word` (else the failing one's stderr)."""
    outputs = [p.communicate(timeout=TIMEOUT_S) for p in procs]
    for p, (out, err) in zip(procs, outputs):
        assert p.returncode == 0 and word in out, err[-3000:]
    return [out for out, _ in outputs]
