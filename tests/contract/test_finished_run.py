"""contract.FinishedRun: one reader of a finished run, one fallback policy for every fact."""

from __future__ import annotations

import json

import pytest

from contract import FinishedRun, FinishedRunError, HostRange, Manifest, RunDir, RunRecord, finished_run
from contract.run import INDEX_SHUFFLE
from tests.audit import audit_fixtures as fx

SEQ_LEN, G = 32, 4


@pytest.fixture(scope="module")
def manifest(tmp_path_factory):
    return fx.write_sample(str(tmp_path_factory.mktemp("data")), seq_len=SEQ_LEN)


def _record(manifest: str, G: int = G) -> RunRecord:
    m = Manifest.load(manifest)
    return RunRecord(
        G, 0, (manifest,), (m.fingerprint,), "plan", INDEX_SHUFFLE, m.seq_len, m.tokenizer, (HostRange(0, 1),)
    )


def _config(run: RunDir, **config) -> RunDir:
    run.path.mkdir(parents=True, exist_ok=True)
    run.config.write_text(json.dumps({"config": config, "process_count": 1}))
    return run


def test_run_json_says_every_fact_and_nothing_else_is_read(manifest, tmp_path):
    run = _config(RunDir(tmp_path / "run"), global_batch_size=99, seq_len=7, data=["/gone/manifest.json"])
    _record(manifest).write(run)
    done = FinishedRun.read(run)
    m = Manifest.load(manifest)
    assert (done.source, done.seq_len, done.global_batch_size, done.tokens_per_step) == (
        "run.json",
        SEQ_LEN,
        G,
        G * SEQ_LEN,
    )
    assert done.tokenizer == m.tokenizer and done.data_fingerprints == (m.fingerprint,)


def test_without_run_json_the_recorded_config_says_the_batch_and_the_seq_len_it_typed(tmp_path):
    run = _config(RunDir(tmp_path / "old"), global_batch_size=8, seq_len=64, data=["/gone/manifest.json"])
    done = FinishedRun.read(run)
    assert (done.source, done.tokens_per_step) == ("config.json", 8 * 64)  # no manifest read for it
    with pytest.raises(FinishedRunError, match="/gone/manifest.json"):
        _ = done.data_fingerprints  # the one fact only the (missing) manifest says: refused, not guessed


def test_a_config_without_seq_len_takes_its_manifests_and_refuses_a_tampered_one(manifest, tmp_path):
    run = _config(RunDir(tmp_path / "old"), global_batch_size=G, seq_len=None, data=[manifest])
    done = FinishedRun.read(run)
    m = Manifest.load(manifest)
    assert (done.seq_len, done.tokenizer, done.data_fingerprints) == (SEQ_LEN, m.tokenizer, (m.fingerprint,))
    raw = json.loads(open(manifest).read())
    raw["seq_len"] = 2 * SEQ_LEN  # content changed, fingerprint left as it was
    tampered = tmp_path / "manifest.json"
    tampered.write_text(json.dumps(raw))
    run = _config(RunDir(tmp_path / "tampered"), global_batch_size=G, seq_len=None, data=[str(tampered)])
    with pytest.raises(FinishedRunError, match="names is refused.*does not match the manifest's content"):
        _ = FinishedRun.read(run).seq_len


def test_a_steps_meta_comes_after_run_json_and_before_the_runs_config_json(manifest, tmp_path):
    run = _config(RunDir(tmp_path / "run"), global_batch_size=G, seq_len=16)
    meta = {"seq_len": 48, "config": {"global_batch_size": 2, "seq_len": None}}
    done = FinishedRun.read(run, step_meta=meta)
    assert (done.source, done.seq_len, done.global_batch_size, done.tokenizer) == ("the step's meta", 48, 2, None)
    _record(manifest).write(run)
    assert FinishedRun.read(run, step_meta=meta).seq_len == SEQ_LEN  # run.json first, for a step too


def test_a_fact_nothing_recorded_says_is_refused_naming_where_it_was_looked_for(tmp_path):
    bare = RunDir(tmp_path / "bare")
    with pytest.raises(FinishedRunError, match=r"global_batch_size is not known \(no run.json and no config.json\)"):
        _ = FinishedRun.read(bare).tokens_per_step
    with pytest.raises(FinishedRunError, match="seq_len is not known"):
        _ = FinishedRun.read(bare, step_meta={"config": {"steps": 10}}).seq_len
    assert FinishedRun.read(bare, step_meta={"config": {"seq_len": 64}}).tokenizer is None  # names no data


def test_a_damaged_record_is_refused_never_taken_for_no_record(tmp_path):
    run = _config(RunDir(tmp_path / "run"), global_batch_size=G, seq_len=16)
    run.run_record.write_text("{not json")
    with pytest.raises(FinishedRunError, match="run.json:1: not valid JSON"):
        FinishedRun.read(run)
    run.run_record.unlink()
    run.config.write_text('["a list"]')
    with pytest.raises(FinishedRunError, match="config.json: cannot be read as the run's config"):
        FinishedRun.read(run)


def test_a_configs_seq_len_is_the_one_it_types_else_its_first_manifests(manifest, tmp_path):
    assert finished_run.seq_len_of(128, ["/gone/manifest.json"]) == 128
    assert finished_run.seq_len_of(None, [manifest]) == SEQ_LEN
    with pytest.raises(FinishedRunError, match="sets no seq_len and its manifest /gone/manifest.json cannot be read"):
        finished_run.seq_len_of(None, ["/gone/manifest.json"])
