"""The audit on AI2-style data in the olmo-core order: token files converted by the job, a run
logged by the loader in that order (2 hosts, past an epoch); the sharding proof and the run check
replay the olmo-core order, not Grain's index_shuffle."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import olmo_core.data as oc  # the oracle (test extra, pinned): missing, these tests fail, never skip
import pytest
import yaml

import contract
from audit import AuditConfig, run_audit
from contract.rundir import RunDir
from dataloader import LoaderConfig, make_loader, olmo_order
from dataloader.loader import load_plan
from pipelines.tokenize import run
from tests.dataloader.olmo_fixtures import write_token_files

L, G, H, SEED = 16, 4, 2, 34521


@pytest.fixture(autouse=True)
def _order_cache(tmp_path, monkeypatch):
    """The audit replays the olmo-core order through the default permutation cache: keep it here."""
    monkeypatch.setenv("OLMAX_ORDER_CACHE", str(tmp_path / "audit-order"))


@pytest.fixture(scope="module")
def ai2(tmp_path_factory):
    root = tmp_path_factory.mktemp("ai2")
    files = write_token_files(str(root), np.random.default_rng(3), {"web": [170, 9, 310], "code": [130, 64]})
    mixture = {
        "name": "ai2-like",
        "tokenizer": "dolma2",
        "seq_len": L,
        "seed": 0,
        "heldout_fraction": 0.0,
        "dedup": False,
        "sources": [
            {"name": n, "format": "tokens", "dtype": "uint32", "weight": 1.0, "paths": paths}
            for n, paths in files.items()
        ],
    }
    (root / "mixture.yaml").write_text(yaml.safe_dump(mixture, sort_keys=False))
    run(["--mixture", str(root / "mixture.yaml"), "--output", str(root / "data")])
    return root


def log_run(root, run_dir, steps, order="olmo-core", recorded=contract.OLMO_CORE, data=None):
    """data_log + run.json + summary.json as the trainer writes them, batches from the loader.
    data: the run's manifests (default: the one under root)."""
    data = list(data or [str(root / "data" / "manifest.json")])
    cfg = LoaderConfig(data=data, global_batch_size=G, seed=SEED, order=order, order_cache=str(root / "order"))
    _, plan = load_plan(cfg)
    os.makedirs(run_dir / contract.DATA_LOG_DIR, exist_ok=True)
    its = [make_loader(cfg, h, H) for h in range(H)]
    logs = [open(run_dir / contract.DATA_LOG_DIR / contract.data_log_name(h, H), "w") for h in range(H)]
    chain = ""
    for step in range(steps):
        parts = [next(it) for it in its]
        for f, b in zip(logs, parts):
            f.write(json.dumps(contract.data_log_row(step, b["index"], b["example"])) + "\n")
        chain = contract.chain_data_sha256(chain, step, np.concatenate([b["example"] for b in parts]))
    for f, it in zip(logs, its):
        f.close()
        it.close()
    ms = [contract.Manifest.load(p) for p in data]
    m = ms[0]
    contract.RunRecord(
        global_batch_size=G,
        seed=SEED,
        data=tuple(data),
        manifest_fingerprints=tuple(x.fingerprint for x in ms),
        loader_fingerprint=plan.fingerprint,
        order=recorded,
        seq_len=L,
        tokenizer=m.tokenizer,
        hosts=(contract.HostRange(0, H),),
    ).write(str(run_dir))
    (run_dir / "summary.json").write_text(json.dumps({"step": steps, "data_sha256": chain}))
    return plan


def audit(root, run_dir, data=None, **kw):
    results, meta = run_audit(
        AuditConfig(
            data=data or str(root / "data" / "manifest.json"), out=str(run_dir / "report"), run=RunDir(run_dir), **kw
        )
    )
    return {r.name: r for r in results}, meta


def test_an_olmo_core_order_run_passes_the_sharding_proof_and_the_run_check(ai2, tmp_path):
    plan = log_run(ai2, tmp_path, steps=0)  # to size the run: 1.5 epochs
    per_epoch = olmo_order.batches_per_epoch(plan.size, G)
    assert plan.size % G, "the fixture should leave a remainder that OLMo-core does not read"
    log_run(ai2, tmp_path, steps=per_epoch + per_epoch // 2)
    res, meta = audit(ai2, tmp_path)
    assert meta["order"] == {"name": "olmo-core.numpy_fsl", "version": 1}
    assert {k: r.passed for k, r in res.items()} == {
        **dict.fromkeys(("integrity", "accounting", "mixture", "sharding", "run", "contamination", "statistics"), True),
        "task_contamination": None,  # not run without --eval-tasks
    }, {k: r.failures[:3] for k, r in res.items() if not r.passed}
    assert res["run"].figures["positions_verified_against_plan"] == (per_epoch + per_epoch // 2) * G
    bf = res["sharding"].figures["brute_force"]
    assert bf["shared_slots"] == 0 and res["sharding"].figures["epochs"] == 1.0  # one epoch = G·(N // G) positions


def test_the_same_logs_recorded_as_grains_order_fail_the_run_check(ai2, tmp_path):
    plan = log_run(ai2, tmp_path, steps=0)
    log_run(ai2, tmp_path, steps=olmo_order.batches_per_epoch(plan.size, G), recorded=contract.INDEX_SHUFFLE)
    res, _ = audit(ai2, tmp_path)
    assert not res["run"].passed
    f = res["run"].failures
    # both the recorded order (in the loader fingerprint) and the examples themselves give it away
    assert f[0].startswith("the run's loader fingerprint ") and "is not the audited plan's" in f[0]
    assert f[1].startswith("step 0, host 0: position 0 gave example ") and f", the plan (seed {SEED}) says " in f[1]


def test_the_jobs_converted_files_in_olmo_core_order_are_olmo_cores_batches(ai2, tmp_path):
    """End to end: token files → the job → the loader (olmo-core order) = OLMo-core on the files."""
    mixture = yaml.safe_load((ai2 / "mixture.yaml").read_text())
    paths = [p for s in mixture["sources"] for p in s["paths"]]
    ds = oc.NumpyFSLDatasetConfig(
        tokenizer=oc.TokenizerConfig.dolma2(),
        paths=paths,
        sequence_length=L,
        dtype="uint32",
        work_dir=str(tmp_path / "oc"),
    ).build()
    dl = oc.NumpyDataLoaderConfig(
        global_batch_size=G * L, seed=SEED, num_workers=0, work_dir=str(tmp_path / "oc")
    ).build(ds)
    ref = []
    for epoch in (1, 2):
        dl.reshuffle(epoch=epoch)
        ref += [b["input_ids"].numpy() for b in dl]
        dl.reset()
    cfg = LoaderConfig(
        data=[str(ai2 / "data" / "manifest.json")],
        global_batch_size=G,
        seed=SEED,
        order="olmo-core",
        order_cache=str(tmp_path / "order"),
    )
    it = make_loader(cfg, 0, 1)
    for step, want in enumerate(ref):
        assert np.array_equal(next(it)["tokens"], want), step
    it.close()


def heldout_token_manifest(tmp_path):
    """AI2-style validation sets: token files → `from-olmo-mix --split heldout` → the job.
    Returns ({source: token file paths}, the held-out manifest's path)."""
    from pipelines import olmo_mix

    files = write_token_files(str(tmp_path), np.random.default_rng(11), {"val": [200, 40], "val2": [90]})
    text = "".join(
        f"{name}-validation,{os.path.relpath(p, tmp_path)}\n".replace("npy/", "{TOKENIZER}/", 1)
        for name, paths in files.items()
        for p in paths
    )
    mixture = olmo_mix.mixture_from_olmo_mix(
        text, str(tmp_path), tokenizer_id="npy", seq_len=L, split="heldout", name="val"
    )
    (tmp_path / "val.yaml").write_text(olmo_mix.to_yaml(mixture))
    run(["--mixture", str(tmp_path / "val.yaml"), "--output", str(tmp_path / "val")])
    return files, str(tmp_path / "val" / "manifest.json")


def test_an_olmo_core_run_on_a_training_and_a_heldout_manifest_passes_every_check(ai2, tmp_path):
    """The AI2 recipe's `data: [training, held-out]`: the run check's loader fingerprint is the
    olmo-core plan over both manifests, and contamination covers the held-out token files."""
    _, held_m = heldout_token_manifest(tmp_path / "in")
    data = [str(ai2 / "data" / "manifest.json"), held_m]
    plan = log_run(ai2, tmp_path, steps=0, data=data)
    per_epoch = olmo_order.batches_per_epoch(plan.size, G)
    log_run(ai2, tmp_path, steps=per_epoch + 2, data=data)
    res, meta = audit(ai2, tmp_path, data=data)
    assert {k: r.passed for k, r in res.items()} == {
        **dict.fromkeys(("integrity", "accounting", "mixture", "sharding", "run", "contamination", "statistics"), True),
        "task_contamination": None,  # not run without --eval-tasks
    }, {k: r.failures[:3] for k, r in res.items() if not r.passed}
    assert meta["plan_size"] == plan.size and "loader_fingerprint" not in res["run"].not_run
    assert res["run"].figures["positions_verified_against_plan"] == (per_epoch + 2) * G
    c = res["contamination"].figures  # every held-out document scanned came from the held-out manifest
    heldout_rows = [r for r in res["statistics"].figures["splits"] if r["split"] == "heldout" and r["documents"]]
    assert {r["manifest"] for r in heldout_rows} == {held_m} and c["exact_overlap"] == 0
    assert (
        c["heldout_documents"] + c["empty_documents_not_compared"]["heldout"]
        == sum(r["documents"] for r in heldout_rows)
        > 0
    )
    assert "val-validation" in {r["source"] for r in c["ngram_by_source"]}
    solo, _ = audit(ai2, tmp_path)  # the training manifest alone is not what this run read
    assert solo["run"].passed is False and "trained on other manifests" in solo["run"].failures[0]
    assert "loader fingerprint" in solo["run"].failures[1]


def heldout_records(ids: np.ndarray) -> np.ndarray:
    """A held-out token file's records: OLMo-core's instances [n // L, L], then the remainder's ids up
    to its last EOS PAD-filled to one more record (pipelines.token_files: the evaluator reads them too)."""
    from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID

    whole = ids[: len(ids) // L * L].reshape(-1, L)
    rest = ids[whole.size :]
    eos = np.flatnonzero(rest == EOS_ID)
    if not len(eos):
        return whole
    tail = np.full((1, L), PAD_ID, ids.dtype)
    tail[0, : eos[-1] + 1] = rest[: eos[-1] + 1]
    return np.concatenate([whole, tail])


def test_a_held_out_token_manifest_next_to_the_training_one_changes_no_training_batch(ai2, tmp_path):
    """The AI2 recipe's layout: training files in one manifest, a `from-olmo-mix --split heldout`
    mixture's files in a second one. The olmo-core training stream is unchanged (OLMo-core's
    instance numbering of the training files holds), the held-out loader reads every held-out
    instance, and the trainer's start-up check finds them."""
    from trainer.data_contract import check_heldout_for_eval

    files, held_m = heldout_token_manifest(tmp_path)
    train_m = str(ai2 / "data" / "manifest.json")
    alone = LoaderConfig(
        data=[train_m], global_batch_size=G, seed=SEED, order="olmo-core", order_cache=str(tmp_path / "order")
    )
    both = LoaderConfig(
        data=[train_m, held_m], global_batch_size=G, seed=SEED, order="olmo-core", order_cache=str(tmp_path / "order")
    )
    assert load_plan(both)[1].size == load_plan(alone)[1].size
    a, b = make_loader(alone, 0, 1), make_loader(both, 0, 1)
    for _ in range(olmo_order.batches_per_epoch(load_plan(alone)[1].size, G) + 2):
        x, y = next(a), next(b)
        assert np.array_equal(x["tokens"], y["tokens"]) and np.array_equal(x["example"], y["example"])
    a.close(), b.close()
    want = [p for paths in files.values() for p in paths]
    expect = np.concatenate([heldout_records(np.fromfile(p, "<u4")) for p in want])
    assert len(expect) > G
    manifests = [contract.Manifest.load(p) for p in (train_m, held_m)]
    assert check_heldout_for_eval(manifests, 1) == len(expect) and check_heldout_for_eval(manifests[:1], 0) == 0
    with make_loader(dataclasses.replace(both, split="heldout"), 0, 1) as it:
        rows = [(batch["tokens"], batch["example"]) for batch in it]
    seen = np.concatenate([t[e >= 0] for t, e in rows])  # the last batch's PAD rows have example −1
    assert np.array_equal(seen, expect)  # every held-out instance once, in listed order


def test_a_token_file_listed_twice_is_read_twice_as_olmo_core_does(tmp_path):
    """A mix file may list a file twice (dolma17.txt's wiki, OLMoE-mix-0824.txt's dclm): OLMo-core
    numbers both occurrences; the job keeps one shard per occurrence, so the batches still match."""
    files = write_token_files(str(tmp_path), np.random.default_rng(5), {"wiki": [90, 50], "web": [120]})
    wiki, web = files["wiki"], files["web"]
    listed = {"wiki": [wiki[0], wiki[1], wiki[0]], "web": web}
    mixture = {
        "name": "repeats",
        "tokenizer": "dolma2",
        "seq_len": L,
        "seed": 0,
        "heldout_fraction": 0.0,
        "dedup": False,
        "sources": [
            {"name": n, "format": "tokens", "dtype": "uint32", "weight": 1.0, "paths": p} for n, p in listed.items()
        ],
    }
    (tmp_path / "mixture.yaml").write_text(yaml.safe_dump(mixture, sort_keys=False))
    run(["--mixture", str(tmp_path / "mixture.yaml"), "--output", str(tmp_path / "data")])
    m = contract.Manifest.load(str(tmp_path / "data" / "manifest.json"))
    assert [s.records for s in m.shards("train", "wiki")] == [90 // L, 50 // L, 90 // L]
    paths = [p for ps in listed.values() for p in ps]
    ds = oc.NumpyFSLDatasetConfig(
        tokenizer=oc.TokenizerConfig.dolma2(),
        paths=paths,
        sequence_length=L,
        dtype="uint32",
        work_dir=str(tmp_path / "oc"),
    ).build()
    dl = oc.NumpyDataLoaderConfig(
        global_batch_size=G * L, seed=SEED, num_workers=0, work_dir=str(tmp_path / "oc")
    ).build(ds)
    dl.reshuffle(epoch=1)
    ref = [b["input_ids"].numpy() for b in dl]
    cfg = LoaderConfig(
        data=[str(tmp_path / "data" / "manifest.json")],
        global_batch_size=G,
        seed=SEED,
        order="olmo-core",
        order_cache=str(tmp_path / "order"),
    )
    assert load_plan(cfg)[1].size == len(ds) == (2 * (90 // L) + 50 // L + 120 // L)
    with make_loader(cfg, 0, 1) as it:
        for step, want in enumerate(ref):
            assert np.array_equal(next(it)["tokens"], want), step
