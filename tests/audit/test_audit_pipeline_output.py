"""The audit against the pipeline's own output (not the audit's fixture writer): what
`python -m pipelines.tokenize` writes must pass every data check, so the two sides of the
issue-2 contract agree."""

from __future__ import annotations

from audit import AuditConfig, run_audit
from audit.eval_leakage import EvalLeakageConfig
from tests.pipelines.leak_plants import TINY as TINY_TASKS


def test_the_pipelines_output_passes_every_data_check(job_out, manifest, tmp_path):
    # the test corpus's "junk" source has weight but no valid document: the loader cannot plan
    # it, so the audit plans without it (as a user would, with --weights '{"junk": 0}')
    cfg = AuditConfig(
        data=str(job_out / "manifest.json"),
        out=str(tmp_path / "report"),
        weights={"junk": 0.0},
        hosts=2,
        global_batch_size=4,
        eval_leakage=EvalLeakageConfig(str(TINY_TASKS)),  # eval leakage against the tiny recipe's tasks
    )
    results = {r.name: r for r in run_audit(cfg)[0]}
    verdicts = {name: r.passed for name, r in results.items()}
    assert verdicts == {
        "integrity": True,
        "accounting": True,
        "mixture": True,
        "sharding": True,
        "run": None,
        "contamination": True,
        "statistics": True,
        "task_contamination": True,
    }, {name: r.summary for name, r in results.items() if r.passed is False}
    assert results["contamination"].figures["exact_overlap"] == 0
    shards = results["integrity"].figures["shards"]
    assert len(shards) == sum(
        len(e["splits"][s]["shards"]) for e in manifest["sources"].values() for s in ("train", "heldout")
    )
    assert all(sh["sha256_ok"] and sh["records"] == sh["expected_records"] for sh in shards)
    stats = {(r["source"], r["split"]): r for r in results["statistics"].figures["splits"]}
    for (source, split), row in stats.items():
        assert row["documents"] == row["eos"] == manifest["sources"][source]["counts"][split]
