"""Data audit: `python -m audit` proves what the model saw (see audit/README.md),
over every manifest the run read (its `data` list, in order).

Checks (one module each, pure where the logic must be proved): integrity, accounting, mixture,
sharding, runlog (what the run consumed), contamination, statistics; `scan` streams the shards
once for integrity/contamination/statistics; `report` renders the HTML.
"""

from audit.runner import AuditConfig, run_audit, write_outputs

from .checks import CheckResult

__all__ = ["AuditConfig", "CheckResult", "run_audit", "write_outputs"]
