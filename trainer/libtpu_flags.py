"""The recipe's libtpu compiler flags (``libtpu_flags``), put into ``LIBTPU_INIT_ARGS`` before the
TPU backend starts.

libtpu reads its flags once, from the ``LIBTPU_INIT_ARGS`` environment variable, when JAX loads it:
a flag set after the backend started does nothing, silently. So every entry point that starts a
backend for a recipe (``trainer.main``, ``trainer.compile``, ``bench.mfu``'s step worker) calls
:func:`apply` first, and a flag is a recipe value (recorded in the run's config) rather than a
shell habit. A flag the environment already sets keeps the environment's value: an operator's
explicit ``LIBTPU_INIT_ARGS`` wins, and :func:`apply` says which flags it left alone. Off a TPU the
variable is read by nothing.

Why a recipe sets one (``trainer/configs/olmo3-7b-proxy-v5e*.yaml``): splash attention's Pallas
kernels allocate their tiles in the TPU core's scoped VMEM, whose default limit on v5e is 16 MiB;
``xla_tpu_scoped_vmem_limit_kib`` raises it (MaxText's v5e recipes do the same), which lets the
16 x 256-head layout run 1024 x 1024 blocks (bench/RESULTS.md).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, MutableMapping

ENV = "LIBTPU_INIT_ARGS"
_SET = re.compile(r"--([A-Za-z0-9_]+)(?:=|\s|$)")


def render(name: str, value: object) -> str:
    """One flag as libtpu reads it: ``--name=value`` (booleans as ``true``/``false``)."""
    text = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return f"--{name}={text}"


def merged(current: str, flags: Mapping[str, object]) -> tuple[str, list[str]]:
    """(the new ``LIBTPU_INIT_ARGS``, the recipe's flags left out because ``current`` sets them).
    Pure: the recipe's flags are appended in their order after what the environment holds."""
    present = set(_SET.findall(current))
    kept = [name for name in flags if name in present]
    added = [render(name, value) for name, value in flags.items() if name not in present]
    return " ".join([current.strip(), *added]).strip(), kept


def apply(flags: Mapping[str, object], environ: MutableMapping[str, str] = os.environ) -> list[str]:
    """Puts ``flags`` into ``environ[LIBTPU_INIT_ARGS]`` (before JAX starts its backend); returns the
    names the environment already set, whose values it keeps."""
    if not flags:
        return []
    value, kept = merged(environ.get(ENV, ""), flags)
    environ[ENV] = value
    return kept
