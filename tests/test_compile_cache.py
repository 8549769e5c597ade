"""The test session's shared XLA compilation cache (tests/conftest.py) changes no result: a program
read back from JAX's persistent cache computes the same bytes as the one compiled for it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# a float program whose rounding depends on how XLA compiled it (reductions, transcendentals, a matmul)
PROGRAM = """
import jax, jax.numpy as jnp, numpy as np
x = jax.random.normal(jax.random.key(0), (256, 256), jnp.float32)
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(axis=0) + jnp.exp(x).mean(axis=1) * jnp.log1p(jnp.abs(x)).max())
print(np.asarray(f(x)).tobytes().hex())
"""


def _run(cache: Path) -> str:
    env = {
        **os.environ,
        "JAX_PLATFORMS": "cpu",
        "JAX_COMPILATION_CACHE_DIR": str(cache),
        "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", PROGRAM], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout.strip()


def test_a_program_read_from_the_compilation_cache_computes_the_bytes_compiling_it_did(tmp_path):
    cache = tmp_path / "xla-cache"
    compiled = _run(cache)  # compiles, and writes the cache
    entries = sorted(p.name for p in cache.iterdir())
    assert any("lambda" in name for name in entries), entries  # the program is in the cache
    assert _run(cache) == compiled  # read back from the cache: the same bytes


def test_the_session_shares_one_cache_with_its_subprocesses():
    assert os.environ.get("JAX_PLATFORMS") != "cpu" or Path(os.environ["JAX_COMPILATION_CACHE_DIR"]).is_dir()
