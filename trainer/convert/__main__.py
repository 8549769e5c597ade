"""python -m trainer.convert SUBCOMMAND: checkpoints in and out of olmax.

python -m trainer.convert to-hf RUN_OR_STEP --out DIR [--step N]   an olmax step -> Hugging Face
"""

from __future__ import annotations

import os
import sys

from contract.cli import Parser, run_main
from trainer.convert import to_hf


def main(argv: list[str] | None = None) -> int:
    parser = Parser("python -m trainer.convert", __doc__)
    sub = parser.add_subparsers(dest="command", required=True, metavar="SUBCOMMAND")
    to_hf.register(sub)
    args = parser.parse_args(argv)
    if "JAX_PLATFORMS" not in os.environ:
        # a conversion computes nothing on an accelerator: JAX (for the step's checksums and the
        # model's shapes) stays on the CPU rather than claim a TPU a run may be using
        import jax  # lazy: imported by the subcommand's modules already; here only to configure it

        jax.config.update("jax_platforms", "cpu")
    return run_main(lambda: int(args.func(args)))


if __name__ == "__main__":
    sys.exit(main())
