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

import os

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
