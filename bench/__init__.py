"""Benchmarks, run by hand from the repository root as modules: ``python -m bench.tokenize_job``,
``python -m bench.loader``, ``python -m bench.model``, ``python -m bench.train``, ``python -m bench.audit``,
``python -m bench.tokens``, ``python -m bench.olmo_order``, ``python -m bench.mfu`` (the trainer's step on a chip).

A package (not a folder of scripts): running ``python -m bench.X`` puts the repository root, not
``bench/``, on ``sys.path``. And no module here is named like a standard-library one (the tokenize
benchmark is ``tokenize_job``; tested), so nothing shadows the standard library even were ``bench/``
ever put on the path. Not installed with the project (see pyproject's packages).
"""

import statistics
import time


def rss_mib() -> float:
    """This process's resident memory now (VmRSS, MiB), read from /proc/self/status (Linux)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def matmul_flops(n: int, dtype: str = "float32", reps: int = 5) -> float:
    """Dense [n, n] @ [n, n] FLOP/s in ``dtype`` on the default device (2 n³ per product): the
    median of ``reps`` runs after a compiling one. JAX is imported here, not at package import."""
    import jax  # lazy: the package stays JAX-free (the RSS benchmarks import it)
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    f = jax.jit(lambda x, y: x @ y)
    jax.block_until_ready(f(a, b))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(f(a, b))
        times.append(time.perf_counter() - t0)
    return 2 * n**3 / statistics.median(times)
