"""tests/fast_compile.py's in-process block: what it compiles is at LLVM level 0, and nothing it
compiled serves a program after it."""

from __future__ import annotations

import jax
import numpy as np
from jax._src import compiler  # JAX's own reading of its flags: the options each compile is given

from tests import fast_compile


def _level() -> int:
    """The LLVM level a compile started now would be given."""
    options = compiler.get_compile_options(1, 1)
    return int(options.executable_build_options.debug_options.xla_backend_optimization_level)


def test_structure_only_compiles_at_level_0_and_leaves_no_program_behind():
    f = jax.jit(lambda x: x + 1)
    before = _level()  # 3, XLA's default, unless XLA_FLAGS says otherwise
    with fast_compile.structure_only():
        assert _level() == 0
        np.testing.assert_array_equal(f(np.zeros(3, np.float32)), 1.0)
        assert f._cache_size() == 1
    assert f._cache_size() == 0  # the level-0 program is gone: the next call compiles at the default
    assert _level() == before
