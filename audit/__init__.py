"""Data audit: `python -m audit` proves what the model saw (see audit/README.md),
over every manifest the run read (its `data` list, in order).

Checks (one module each, pure where the logic must be proved): integrity, accounting, mixture,
sharding, runlog (what the run consumed), contamination, statistics; `scan` streams the shards
once for integrity/contamination/statistics; `report` renders the HTML.
"""

from typing import TYPE_CHECKING, Any

from .checks import CheckResult

if TYPE_CHECKING:
    from audit.runner import AuditConfig, run_audit, write_outputs

__all__ = ["AuditConfig", "CheckResult", "run_audit", "write_outputs"]


def __getattr__(name: str) -> Any:
    """The runner's names, imported on first use (PEP 562): it imports Apache Beam, which
    ``python -m audit --help`` and the light submodules (checks, datachecks) do without."""
    if name in ("AuditConfig", "run_audit", "write_outputs"):
        from audit import runner  # Apache Beam: on first use (see the docstring)

        return getattr(runner, name)
    raise AttributeError(f"module 'audit' has no attribute {name!r}")
