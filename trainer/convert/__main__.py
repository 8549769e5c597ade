"""``python -m trainer.convert SUBCOMMAND ...``: checkpoints in and out of olmax.

  from-olmo-core STEP_DIR --out DIR --config RECIPE   AI2's OLMo-core step (params + Adam state)
                                                      -> an olmax step for checkpoint.init_from
  to-olmo-core STEP --out DIR                         an olmax step -> an OLMo-core step directory
                                                      (DCP with Adam state) OLMo-core continues
  to-hf RUN_OR_STEP --out DIR [--step N]              an olmax step -> a Hugging Face
                                                      Olmo3ForCausalLM directory (safetensors)

Each subcommand is a module with ``register(subparsers)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib
import os
import sys

from contract.cli import Parser, run_main

# subcommand -> its module (register/run)
SUBCOMMANDS = {
    "from-olmo-core": "trainer.convert.from_olmo_core",
    "to-olmo-core": "trainer.convert.to_olmo_core",
    "to-hf": "trainer.convert.to_hf",
}


M_ARENA_MAX = -8  # glibc's mallopt parameter


def limit_malloc_arenas(arenas: int = 1) -> None:
    """At most ``arenas`` glibc malloc arenas for this process. A conversion allocates each tensor
    once and frees it; tensorstore's and orbax's worker threads would each take an arena of their
    own (up to 8 per core), and each keeps the memory freed in it: measured on a 0.8 GB checkpoint,
    the peak above the start-up footprint was 423 MiB with glibc's default and 179 MiB with one
    arena, at the same speed. Not glibc (another libc, macOS): nothing to do."""
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt(M_ARENA_MAX, arenas)
    except (OSError, AttributeError, TypeError):
        return


def main(argv: list[str] | None = None) -> int:
    limit_malloc_arenas()
    # a conversion computes nothing on an accelerator: JAX stays on the CPU (set before any
    # subcommand imports JAX, which reads it then), never claiming a TPU a run may be using
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    p = Parser("python -m trainer.convert", __doc__)
    sub = p.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    modules = {name: importlib.import_module(path) for name, path in SUBCOMMANDS.items()}
    for module in modules.values():
        module.register(sub)
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] not in modules:
        p.parse_args(argv)  # --help, or one error line naming the subcommands
    # the subcommand's own parser, intermixed: key=value overrides may follow its options
    args = sub.choices[argv[0]].parse_intermixed_args(argv[1:])
    args.command = argv[0]
    return run_main(lambda: modules[args.command].run(args))


if __name__ == "__main__":
    sys.exit(main())
