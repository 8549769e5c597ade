"""``python -m trainer.convert SUBCOMMAND ...``: checkpoints in and out of olmax.

  from-olmo-core STEP_DIR --out DIR --config RECIPE   AI2's OLMo-core step (params + Adam state)
                                                      -> an olmax step for checkpoint.init_from

Each subcommand is a module with ``register(subparsers)`` and ``run(args) -> int``.
"""

from __future__ import annotations

import importlib
import sys

from contract.cli import Parser, run_main

# subcommand -> its module (register/run)
SUBCOMMANDS = {
    "from-olmo-core": "trainer.convert.from_olmo_core",
}


def main(argv: list[str] | None = None) -> int:
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
