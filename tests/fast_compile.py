"""LLVM's optimisation of XLA's CPU code turned off, for the compile-bound tests that may do without it.

XLA compiles a CPU program in two parts: its HLO passes (fusion, layout, buffer assignment, SPMD
partitioning, collectives) and then LLVM's optimisation of the machine code. Level 0 skips only the
second: the same ops on the same buffers, the same memory figures, run slower and compiled in ~half
the CPU (bench/RESULTS.md, "make test time, round 8"). Floating-point results may differ from the
default build in the last bits (LLVM forms FMAs and vectorised reductions), so a test may use it only
where every value it compares was computed by programs compiled alike in one process, or where it
checks structure and not numbers. Never for a comparison with another framework (OLMo-core, Hugging
Face, olmo_eval's torch) or with a run from a process compiled at the default level: those keep it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

FLAG = "--xla_backend_optimization_level=0"
# per program, for a test in the pytest process: jax.jit(f, compiler_options=OPTIONS) or .compile(OPTIONS)
OPTIONS = {"xla_backend_optimization_level": 0}


def env(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) for a child process that compiles at level 0:
    the flag added to its XLA_FLAGS (any other flags kept)."""
    out = dict(os.environ if base is None else base)
    flags = out.get("XLA_FLAGS", "").split()
    out["XLA_FLAGS"] = " ".join([f for f in flags if not f.startswith("--xla_backend_optimization_level")] + [FLAG])
    return out


@contextlib.contextmanager
def structure_only() -> Iterator[None]:
    """Every program compiled in the block at level 0, for code that builds its own programs in this
    process (trainer.main) in a test that checks structure and not numbers: JAX's
    ``jax_disable_most_optimizations`` (level 0 and LLVM's expensive passes off; XLA's HLO passes
    kept). A program compiled before the block, at the default level, may serve it. On leaving,
    JAX's in-memory caches are cleared, so that no program compiled in the block serves a later test
    (the persistent cache keys on the options: it holds both builds apart)."""
    import jax  # here: env() serves tests that start JAX only in their children

    name = "jax_disable_most_optimizations"
    before = jax.config.read(name)
    jax.config.update(name, True)
    try:
        yield
    finally:
        jax.config.update(name, before)
        jax.clear_caches()
