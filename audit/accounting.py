"""Check 2 — accounting: per source, documents = train + held-out + duplicates + rejected,
with the reject reasons, each one the pipeline writes for the source's format (`contract.JSONL_REASONS`
for jsonl, `contract.TOKEN_FILE_REASONS` for token files). Pure: reads only the manifest."""

from __future__ import annotations

from typing import Any

from contract import HELDOUT, JSONL_REASONS, TOKEN_FILE_REASONS, TOKENS, TRAIN, Manifest, source_format
from pipelines import decontaminate

from .checks import CheckResult, FailureList, result

NAME, TITLE = "accounting", "2. Accounting"


def check_accounting(manifest: Manifest) -> CheckResult:
    f = FailureList()
    rows: list[dict[str, Any]] = []
    formats = {s["name"]: source_format(s) for s in manifest.mixture_sources()}
    # a decontaminated mixture also rejects `contaminated:<task>`, one reason per task it names
    contaminated = decontaminate.reasons(manifest.raw.get("mixture", {}).get("decontaminate"))
    for name in manifest.source_names:
        known = TOKEN_FILE_REASONS if formats.get(name) == TOKENS else JSONL_REASONS + contaminated
        c = manifest.source(name)["counts"]
        rejected = c["rejected"]
        if not isinstance(rejected, dict):
            f.add(f"source {name}: counts.rejected must map reason -> count, got {rejected!r}")
            rejected = {}
        unknown = sorted(set(rejected) - set(known))
        if unknown:
            f.add(f"source {name}: unknown reject reasons {unknown}; the pipeline writes only {list(known)}")
        n_rej = sum(int(v) for v in rejected.values())
        parts = {TRAIN: int(c[TRAIN]), HELDOUT: int(c[HELDOUT]), "duplicates": int(c["duplicates"]), "rejected": n_rej}
        total = sum(parts.values())
        for k, v in list(parts.items()) + [(f"rejected[{r}]", int(n)) for r, n in rejected.items()]:
            if v < 0:
                f.add(f"source {name}: count {k} is negative ({v})")
        if total != int(c["documents"]):
            f.add(
                f"source {name}: documents={c['documents']} but train {parts[TRAIN]} + held-out "
                f"{parts[HELDOUT]} + duplicates {parts['duplicates']} + rejected {n_rej} = {total} "
                f"(off by {int(c['documents']) - total})"
            )
        rows.append(
            {
                "source": name,
                "documents": int(c["documents"]),
                **parts,
                "reject_reasons": {r: int(n) for r, n in sorted(rejected.items())},
            }
        )
    docs = sum(r["documents"] for r in rows)
    ok = f"{len(rows)} sources, {docs} documents: every one is in train, held-out, duplicates or rejected"
    return result(NAME, TITLE, f, ok, {"sources": rows})
