"""Check 2 — accounting: per source, documents = train + held-out + duplicates + rejected,
with the reject reasons. Pure: reads only the manifest's counts."""
from __future__ import annotations

from .checks import CheckResult, FailureList, result
from pipelines.contract import Manifest

NAME, TITLE = "accounting", "2. Accounting"


def check_accounting(manifest: Manifest) -> CheckResult:
    f = FailureList()
    rows = []
    for name in manifest.source_names:
        c = manifest.source(name)["counts"]
        rejected = c["rejected"]
        if not isinstance(rejected, dict):
            f.add(f"source {name}: counts.rejected must map reason -> count, got {rejected!r}")
            rejected = {}
        n_rej = sum(int(v) for v in rejected.values())
        parts = {"train": int(c["train"]), "heldout": int(c["heldout"]),
                 "duplicates": int(c["duplicates"]), "rejected": n_rej}
        total = sum(parts.values())
        for k, v in list(parts.items()) + [(f"rejected[{r}]", int(n)) for r, n in rejected.items()]:
            if v < 0:
                f.add(f"source {name}: count {k} is negative ({v})")
        if total != int(c["documents"]):
            f.add(f"source {name}: documents={c['documents']} but train {parts['train']} + held-out "
                  f"{parts['heldout']} + duplicates {parts['duplicates']} + rejected {n_rej} = {total} "
                  f"(off by {int(c['documents']) - total})")
        rows.append({"source": name, "documents": int(c["documents"]), **parts,
                     "reject_reasons": {r: int(n) for r, n in sorted(rejected.items())}})
    docs = sum(r["documents"] for r in rows)
    ok = f"{len(rows)} sources, {docs} documents: every one is in train, held-out, duplicates or rejected"
    return result(NAME, TITLE, f, ok, {"sources": rows})
