"""The tokenize CLI's start-up, trimmed: imported first by `pipelines.tokenize`, it acts only in the
CLI's own process (`python -m pipelines.tokenize`, or a caller that asks with `lean()`), never in a
process that merely imports the job (tests, a Beam worker, the trainer).

One worker's fixed cost is paid once per job on the local runner and once per worker on Dataflow;
on the bench's 256 MiB it was ~20% of the job's CPU (bench/RESULTS.md, issue 60). Two parts of it
do nothing for the job:
  - pandas and pyarrow (~0.35 CPU-s of Beam's ~1.3): Beam imports them only for its DataFrame and
    Arrow type hints, each behind `except ImportError`; the job uses neither, so `lean()` makes their
    import fail (None in sys.modules) and Beam goes on without them;
  - the cyclic garbage collector's full collections while ~200k module objects are created (~0.2
    CPU-s): `lean()` turns it off for the imports and `settle()` (after the engine is loaded) collects
    once, freezes the survivors (modules, classes, the vocabulary tables: they live as long as the
    process) out of later collections, and turns it back on.
"""

from __future__ import annotations

import gc
import sys

# Imported by Apache Beam only to register type hints for them, each in a try/except ImportError
# (apache_beam/typehints/__init__.py); nothing the job runs needs them.
OPTIONAL_IMPORTS = ("pandas", "pyarrow")
CLI_MODULE = "pipelines.tokenize"

_lean = False  # lean() acted: settle() has the collector to turn back on


def _is_cli() -> bool:
    """This process runs `python -m pipelines.tokenize` (its __main__ is that module)."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return spec is not None and spec.name == CLI_MODULE


def lean() -> bool:
    """Before Beam is imported: keep pandas and pyarrow out, pause the collector. Does nothing (False)
    once Beam or either module is already imported: then they may be in use."""
    global _lean
    if _lean:
        return True
    if any(name in sys.modules for name in ("apache_beam", *OPTIONAL_IMPORTS)):
        return False
    for name in OPTIONAL_IMPORTS:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ModuleNotFoundError
    gc.disable()
    _lean = True
    return True


def settle() -> None:
    """After the imports and the engine's start-up: one collection, the survivors frozen, the
    collector back on (nothing if `lean()` did not act)."""
    global _lean
    if not _lean:
        return
    gc.collect()
    gc.freeze()
    gc.enable()
    _lean = False


if _is_cli():
    lean()
