"""The trainer with `data_order=olmo-core`: it reads the olmo-core stream, records the order in
run.json, and the audit replays that order over its data logs."""

from __future__ import annotations

import json

import pytest

from audit import AuditConfig, run_audit
from contract import OLMO_CORE, RunDir, RunRecord
from dataloader import LoaderConfig, make_loader
from tests.trainer.conftest import run_trainer

STEPS, G = 6, 4


@pytest.mark.slow
def test_an_olmo_core_order_run_logs_that_stream_and_passes_the_audit(data_manifest, tmp_path, monkeypatch):
    monkeypatch.setenv("OLMAX_ORDER_CACHE", str(tmp_path / "order"))  # the trainer's loader cache
    run_dir = tmp_path / "run"
    run_trainer(
        data_manifest, run_dir, "data_order=olmo-core", f"steps={STEPS}", "eval.every=0", "checkpoint.every=0", "seed=5"
    )
    rec = RunRecord.load(str(run_dir))
    assert rec.order == OLMO_CORE and rec.seed == 5
    logged = [
        json.loads(line)["example"]
        for line in (run_dir / "data_log" / "host-00000-of-00001.jsonl").read_text().splitlines()
    ]
    it = make_loader(
        LoaderConfig(
            data=[str(data_manifest)],
            global_batch_size=G,
            seed=5,
            order="olmo-core",
            order_cache=str(tmp_path / "order"),
        ),
        0,
        1,
    )
    assert logged == [next(it)["example"].tolist() for _ in range(STEPS)]
    it.close()
    grain = make_loader(LoaderConfig(data=[str(data_manifest)], global_batch_size=G, seed=5), 0, 1)
    assert logged != [next(grain)["example"].tolist() for _ in range(STEPS)]  # another stream
    results, meta = run_audit(
        AuditConfig(data=str(data_manifest), out=str(tmp_path / "report"), run=RunDir.resolved(run_dir))
    )
    res = {r.name: r for r in results}
    assert meta["order"] == OLMO_CORE.to_json()
    assert res["run"].passed and res["sharding"].passed, (res["run"].failures[:3], res["sharding"].failures[:3])
    assert res["run"].figures["positions_verified_against_plan"] == STEPS * G
