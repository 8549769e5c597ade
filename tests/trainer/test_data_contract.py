"""The trainer's side of the data contract: manifests checked against the model at start-up,
run.json written at every start and cut/continued on an elastic restart."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil

import pytest

import model
from contract import INDEX_SHUFFLE, HostRange, Manifest, Order, RunDir, RunRecord, with_fingerprint
from tests.trainer.conftest import ROOT, SEQ_LEN, trainer_cmd
from trainer.data_contract import (
    DataContractError,
    build_hint,
    check_data,
    check_heldout_for_eval,
    load_manifests,
    run_record,
    update_run_record,
)


def _with(manifest_path, tmp_path, fn, refingerprint=True):
    dst = tmp_path / "data"
    shutil.copytree(manifest_path.parent, dst)
    m = json.loads((dst / "manifest.json").read_text())
    fn(m)
    (dst / "manifest.json").write_text(json.dumps(with_fingerprint(m) if refingerprint else m))
    return dst / "manifest.json"


@pytest.mark.slow
def test_trainer_refuses_a_manifest_whose_fingerprint_does_not_match(trainer_process, data_manifest, tmp_path):
    bad = _with(
        data_manifest,
        tmp_path,
        lambda m: m["sources"]["prose"]["splits"]["train"]["shards"].reverse(),
        refingerprint=False,
    )
    proc = trainer_process.run(trainer_cmd(bad, tmp_path / "run", "steps=2"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "fingerprint" in proc.stderr and "does not match the manifest's content" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()


@pytest.mark.slow
@pytest.mark.parametrize(
    "weights, says",
    [
        ("{nosuch: 1}", "the data plan cannot be built: weights name unknown sources ['nosuch']"),
        ("{prose: 1, nosuch: 0}", "the data plan cannot be built: weights name unknown sources ['nosuch']"),
        ("{prose: 0}", "bad trainer config: data_weights={'prose': 0.0}; must be weights >= 0, not all 0"),
    ],
)
def test_data_weights_the_plan_cannot_meet_are_refused_before_the_run_dir_is_written(
    trainer_process, data_manifest, tmp_path, weights, says
):
    proc = trainer_process.run(trainer_cmd(data_manifest, tmp_path / "run", "steps=2", f"data_weights={weights}"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert says in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("field,value", [("vocab_size", 50_000), ("eos_id", 0), ("pad_id", 1)])
def test_trainer_refuses_data_whose_tokenizer_does_not_fit_the_model(data_manifest, tmp_path, field, value):
    tiny = model.get_config("olmo3-tiny")
    fits = Manifest.load(str(data_manifest))  # the fixture fits: its seq_len and dolma2 tokenizer come back
    seq_len, tok = check_data([fits], tiny, None)
    assert seq_len == SEQ_LEN and tok.name == "dolma2"
    assert (tok.vocab_size, tok.eos_id, tok.pad_id) == (tiny.vocab_size, tiny.eos_id, tiny.pad_id)
    assert check_data([fits], tiny, SEQ_LEN) == (SEQ_LEN, tok)
    bad = _with(data_manifest, tmp_path, lambda m: m["tokenizer"].__setitem__(field, value))
    with pytest.raises(
        DataContractError, match=f"does not fit the model config .*{field}: data {value}, model {getattr(tiny, field)}"
    ):
        check_data([Manifest.load(str(bad))], tiny, None)
    with pytest.raises(DataContractError, match="config seq_len=7"):
        check_data([Manifest.load(str(data_manifest))], tiny, 7)


def _fresh(manifest_path, hosts, fingerprint="plan"):
    return run_record(
        manifests=[Manifest.load(str(manifest_path))],
        global_batch_size=4,
        seed=0,
        weights=None,
        loader_fingerprint=fingerprint,
        host_count=hosts,
        model={"name": "olmo3-tiny"},
    )


def test_run_record_is_cut_and_continued_on_an_elastic_restart(data_manifest, tmp_path):
    update_run_record(RunDir(tmp_path), _fresh(data_manifest, 2), 0)
    update_run_record(RunDir(tmp_path), _fresh(data_manifest, 1), 4)  # resumed from checkpoint 4 on 1 host
    rec = RunRecord.load(str(tmp_path))
    assert rec.hosts == (HostRange(0, 2), HostRange(4, 1)) and rec.order == INDEX_SHUFFLE
    update_run_record(RunDir(tmp_path), _fresh(data_manifest, 2), 2)  # killed, resumed from checkpoint 2
    assert RunRecord.load(str(tmp_path)).hosts == (HostRange(0, 2),)
    update_run_record(RunDir(tmp_path), _fresh(data_manifest, 3), 0)  # started over
    assert RunRecord.load(str(tmp_path)).hosts == (HostRange(0, 3),)


def test_resume_with_another_data_stream_is_refused_by_the_run_record(data_manifest, tmp_path):
    update_run_record(RunDir(tmp_path), _fresh(data_manifest, 1), 0)
    with pytest.raises(DataContractError, match="loader_fingerprint: run.json has 'plan', this start has 'other'"):
        update_run_record(RunDir(tmp_path), _fresh(data_manifest, 1, fingerprint="other"), 4)
    other_order = dataclasses.replace(_fresh(data_manifest, 1), order=Order("olmo-core", 1))
    with pytest.raises(DataContractError, match="order"):
        update_run_record(RunDir(tmp_path), other_order, 4)
    assert RunRecord.load(str(tmp_path)).loader_fingerprint == "plan"  # unchanged by a refused start


def test_an_allowed_stream_change_is_recorded_instead_of_refused(data_manifest, tmp_path):
    """checkpoint.allow_data_mismatch=true reaches run.json too: the new stream is recorded."""
    update_run_record(RunDir(tmp_path), _fresh(data_manifest, 1), 0)
    changed = _fresh(data_manifest, 2, fingerprint="other")
    rec = update_run_record(RunDir(tmp_path), changed, 4, allow_stream_change=True)
    assert RunRecord.load(str(tmp_path)) == rec
    assert rec.loader_fingerprint == "other" and rec.hosts == (HostRange(0, 1), HostRange(4, 2))


def test_trainer_refuses_data_tokenized_with_other_ranks_unless_the_model_leaves_them_unknown(data_manifest, tmp_path):
    import dataclasses

    tiny = model.get_config("olmo3-tiny")
    other = "0" * 64
    bad = _with(data_manifest, tmp_path, lambda m: m["tokenizer"].__setitem__("ranks_sha256", other))
    with pytest.raises(DataContractError, match=f"ranks_sha256: data {other}, model {tiny.ranks_sha256}"):
        check_data([Manifest.load(str(bad))], tiny, None)
    unknown = dataclasses.replace(tiny, ranks_sha256=None)  # e.g. a converted checkpoint
    assert (
        check_data([Manifest.load(str(bad))], unknown, None)[0]
        == check_data([Manifest.load(str(data_manifest))], tiny, None)[0]
    )


def _no_heldout(m):
    for entry in m["sources"].values():
        entry["splits"]["heldout"] = {"examples": 0, "shards": []}


@pytest.mark.slow
def test_evaluating_without_held_out_data_is_refused_at_start_up_not_at_the_first_eval(
    trainer_process, data_manifest, tmp_path
):
    fits = Manifest.load(str(data_manifest))
    assert (
        check_heldout_for_eval([fits], 4)
        == sum(e["splits"]["heldout"]["examples"] for e in fits["sources"].values())
        > 0
    )
    bare = _with(data_manifest, tmp_path, _no_heldout)
    assert check_heldout_for_eval([Manifest.load(str(bare))], 0) == 0  # no eval: nothing needed
    with pytest.raises(DataContractError, match="eval.every=4 but the data holds no held-out examples"):
        check_heldout_for_eval([Manifest.load(str(bare))], 4)
    # the trainer: exit 2 before step 0 (no checkpoint, no metrics), naming both fixes
    proc = trainer_process.run(trainer_cmd(bare, tmp_path / "run", "steps=8", "eval.every=4"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert "no held-out examples" in proc.stderr and "eval.every=0" in proc.stderr and "split: heldout" in proc.stderr
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "metrics.jsonl").exists()


def test_a_heldout_manifest_added_to_a_run_that_started_without_it_is_refused_on_resume(data_manifest, tmp_path):
    # the AI2 recipe's note: the held-out manifest changes no training batch, but it is part of the
    # run's data (manifest list, and for the olmo-core order the plan fingerprint): list it from step 0
    from dataloader.loader import LoaderConfig, load_plan

    def heldout_only(m):
        entry = m["sources"].pop("prose")
        entry["counts"].update(documents=entry["counts"]["heldout"], train=0)
        entry["tokens"]["train"] = 0
        entry["splits"]["train"] = {"examples": 0, "shards": []}
        m["sources"]["val"] = entry
        m["mixture"]["sources"][0]["name"] = "val"

    held = _with(data_manifest, tmp_path, heldout_only)
    train_only, both = [str(data_manifest)], [str(data_manifest), str(held)]
    plans = {
        name: load_plan(LoaderConfig(data=paths, global_batch_size=4, order="olmo-core"))[1]
        for name, paths in (("train_only", train_only), ("both", both))
    }
    assert plans["train_only"].size == plans["both"].size  # not one training instance more or less
    assert plans["train_only"].fingerprint != plans["both"].fingerprint

    def fresh(paths, plan):
        return run_record(
            manifests=[Manifest.load(p) for p in paths],
            global_batch_size=4,
            seed=0,
            weights=None,
            loader_fingerprint=plan.fingerprint,
            host_count=1,
            model={"name": "olmo3-tiny"},
            order=Order("olmo-core", 1),
        )

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    update_run_record(RunDir(run_dir), fresh(train_only, plans["train_only"]), 0)
    with pytest.raises(DataContractError, match="manifest_fingerprints|loader_fingerprint"):
        update_run_record(RunDir(run_dir), fresh(both, plans["both"]), 4)
    update_run_record(RunDir(run_dir), fresh(both, plans["both"]), 4, allow_stream_change=True)  # allow_data_mismatch


@pytest.mark.slow
def test_a_manifest_not_built_yet_is_refused_naming_it_and_the_command_that_builds_it(
    trainer_process, data_manifest, tmp_path, monkeypatch
):
    missing = str(tmp_path / "not-built" / "manifest.json")
    with pytest.raises(
        DataContractError,
        match=f"manifest {re.escape(missing)} not found; it is built by "
        rf"`python -m pipelines\.tokenize --mixture MIXTURE\.yaml --output {re.escape(str(tmp_path))}/not-built`",
    ):
        load_manifests([str(data_manifest), missing])
    # the AI2 recipe's folders are named for their mixtures: the hint names the real one
    monkeypatch.chdir(ROOT)
    assert build_hint("out/olmo3-ppl-validation-ai2/manifest.json") == (
        "it is built by `python -m pipelines.tokenize --mixture data_manifests/mixtures/olmo3-ppl-validation-ai2.yaml "
        "--output out/olmo3-ppl-validation-ai2` (run that first, or fix the path in `data`)"
    )
    unreadable = tmp_path / "dir_not_file"
    unreadable.mkdir()
    with pytest.raises(DataContractError, match=f"cannot read manifest {re.escape(str(unreadable))}"):
        load_manifests([str(unreadable)])
    # the trainer exits 2 with that message, no traceback, before writing the run dir
    run_dir = tmp_path / "run"
    proc = trainer_process.run(trainer_cmd(data_manifest, run_dir, "steps=1") + [f"data=[{data_manifest}, {missing}]"])
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert f"error: data: manifest {missing} not found" in proc.stderr and "Traceback" not in proc.stderr
    assert not (run_dir / "checkpoints").exists()


def test_a_stream_this_code_no_longer_computes_or_data_and_meta_at_other_steps_is_a_refused_resume(
    data_manifest, monkeypatch
):
    # both used to escape as tracebacks (exit 1); they are refused resumes (exit 2) with the reason
    from dataloader import golden
    from dataloader.loader import LoaderConfig, load_plan
    from trainer.config.schema import load_config
    from trainer.loop import ResumeRefused, _check_resume

    cfg = load_config(None, [f"data={data_manifest}", "global_batch_size=4", "model=olmo3-tiny"])
    loader_cfg = LoaderConfig(
        data=cfg.data, global_batch_size=4, seed=cfg.seed, split="train", weights=cfg.data_weights, order=cfg.data_order
    )
    plan = load_plan(loader_cfg)[1]
    state = {"fingerprint": plan.fingerprint, "seed": cfg.seed, "global_batch_size": 4, "step": 4}
    meta = {"step": 4, "config": cfg.to_dict()}
    assert _check_resume(cfg, loader_cfg, plan, 4, state, meta) == 4
    with pytest.raises(
        ResumeRefused,
        match=r"cannot resume from checkpoint 4:\n.*data item is at step 4, its meta "
        r"says step 5",
    ):
        _check_resume(cfg, loader_cfg, plan, 4, state, {**meta, "step": 5})
    with pytest.raises(ResumeRefused, match="data item is at step 3"):
        _check_resume(cfg, loader_cfg, plan, 4, {**state, "step": 3}, meta)

    def changed(order):
        raise golden.StreamChangedError("the data stream this code computes is not the one its plan fingerprints name")

    monkeypatch.setattr(golden, "check_stream", changed)
    with pytest.raises(ResumeRefused, match=r"cannot resume from checkpoint 4:\nthe data stream this code computes"):
        _check_resume(cfg, loader_cfg, plan, 4, state, meta)
