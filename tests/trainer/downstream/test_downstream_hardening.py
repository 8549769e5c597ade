"""Downstream scoring refuses before its work what it used to find out after it, or not at all:
task files built with another tokenizer's ids (PAD, EOS, fingerprint), an --out it cannot write,
a truncated safetensors file, a step whose run's seq_len it does not know; a batch is no larger
than its task needs, and downstream.batch_size no larger than a training batch."""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

import model
from contract import TokenizerInfo
from contract import downstream as ds
from pipelines.dolma2_tokenizer import CL100K_RANKS_SHA256, EOS_ID, PAD_ID, VOCAB_SIZE
from pipelines.task_tokenizer import expected_entry
from tests.model.tiny import randomize
from trainer.config.loading import ConfigError
from trainer.config.schema import DownstreamConfig, load_config
from trainer.downstream import __main__ as command
from trainer.downstream import score
from trainer.downstream.check import DownstreamCheckError, check_downstream

from .synthetic import task, write_tasks

CTX = 32
LABEL = "copycolors_10way_fast"
RUN_TOKENIZER = TokenizerInfo("dolma2", VOCAB_SIZE, EOS_ID, PAD_ID, CL100K_RANKS_SHA256)


@pytest.fixture
def tasks_dir(tmp_path):
    root = tmp_path / "tasks"
    t = task(LABEL, "acc", True, seed=3, n=5, vocab=VOCAB_SIZE, max_ctx=20)
    write_tasks(root, [t], VOCAB_SIZE, CTX, pad_id=PAD_ID, tokenizer_name="dolma2")
    return root


def _rewrite_tokenizer(root, **changes):
    m = json.loads((root / ds.MANIFEST_NAME).read_text())
    m["tokenizer"].update(changes)
    ds.write_manifest(root, {k: v for k, v in m.items() if k not in ("format", "format_version", "content_hash")})


@pytest.mark.parametrize(
    "changes, named",
    [({"pad_id": EOS_ID}, "pad_id"), ({"eos_id": 0}, "eos_id"), ({"fingerprint": "f" * 64}, "fingerprint")],
)
def test_task_files_built_with_other_ids_are_refused_at_start_up(tasks_dir, changes, named):
    cfg = DownstreamConfig(tasks=(LABEL,), every=5, tasks_dir=str(tasks_dir))
    assert check_downstream(cfg, CTX, RUN_TOKENIZER).labels == [LABEL]  # the builder's entry: accepted
    _rewrite_tokenizer(tasks_dir, **changes)
    with pytest.raises(DownstreamCheckError) as e:
        check_downstream(cfg, CTX, RUN_TOKENIZER)
    assert "another tokenizer than the run's data" in str(e.value) and f"{named} " in str(e.value)
    # the one check the audit's --eval-tasks and a mixture's decontaminate.tasks make too: both fingerprints named
    theirs = json.loads((tasks_dir / ds.MANIFEST_NAME).read_text())["tokenizer"]["fingerprint"]
    assert theirs[:16] in str(e.value) and expected_entry(RUN_TOKENIZER)["fingerprint"][:16] in str(e.value)


def test_the_out_of_the_scoring_command_is_checked_before_any_work(tasks_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(command, "run", lambda args: pytest.fail("scored"))
    (tmp_path / "file").write_text("x")
    for out, says in [(tmp_path, "is a folder"), (tmp_path / "file" / "s.json", "is not a folder")]:
        assert command.main(["--tasks_dir", str(tasks_dir), "--hf", str(tmp_path), "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"error: --out {out}") and says in err and "\n" not in err, err


def test_a_truncated_safetensors_file_is_one_error_line(tasks_dir, tmp_path, capsys):
    cfg = model.get_config("olmo3-tiny", compute_dtype="float32", vocab_size=1000)
    hf = tmp_path / "hf"
    model.save_hf(cfg, jax.tree.map(np.asarray, randomize(model.abstract_params(cfg), seed=1)), str(hf))
    weights = hf / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(model.hf.HFCheckpointError, match="cannot be read"):
        model.load_hf(str(hf))
    out = tmp_path / "s.json"
    assert command.main(["--tasks_dir", str(tasks_dir), "--hf", str(hf), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: {hf}") and "cannot be read" in err and "\n" not in err, err
    assert not out.exists()


def test_a_steps_seq_len_and_tokenizer_are_its_runs_not_its_recorded_overrides(tmp_path):
    """A config that did not type seq_len recorded none: the run's run.json says it (before, the
    command took None and skipped the tasks' context-length check)."""
    from tests.audit import audit_fixtures as fx
    from tests.compare.test_compare import write_run

    step_dir = tmp_path / "bare" / "checkpoints" / "8"
    step_dir.mkdir(parents=True)
    with pytest.raises(command.Refused, match="the run's seq_len is not known"):
        command.run_of_step(step_dir, {"config": {"steps": 10}})
    assert command.run_of_step(step_dir, {"config": {"seq_len": 64}}) == (64, None)
    # the seq_len the step's meta records (the data's) is enough: no run.json, no seq_len typed
    assert command.run_of_step(step_dir, {"seq_len": 48, "config": {"seq_len": None}}) == (48, None)
    run = write_run(str(tmp_path / "run"), fx.write_sample(str(tmp_path / "data"), seq_len=CTX))
    step_dir = tmp_path / "run" / "checkpoints" / "8"
    step_dir.mkdir(parents=True)
    seq_len, tok = command.run_of_step(step_dir, {"config": {"steps": 10}})
    assert seq_len == CTX and tok == RUN_TOKENIZER and run


def test_a_small_task_is_not_padded_to_batch_tokens_rows():
    """3 instances of ≤ 128 tokens with batch_tokens 32768: one batch of 4 rows (the shards times a
    power of two), not 256 (32768 // 128) rows of which 253 are PAD."""
    [p] = score.plan(np.array([10, 12, 20]), batch_tokens=32768, shards=1, model_ctx_len=512)
    assert (p.length, p.batch_rows, sorted(p.rows.tolist())) == (128, 4, [0, 1, 2])
    [p] = score.plan(np.array([10, 12, 20]), batch_tokens=32768, shards=8, model_ctx_len=512)
    assert p.batch_rows == 8
    big = score.plan(np.full(1000, 100), batch_tokens=32768, shards=1, model_ctx_len=512)
    assert {p.batch_rows for p in big} == {256}  # a large task still fills batch_tokens


def test_a_downstream_batch_larger_than_a_training_batch_is_refused_at_load():
    with pytest.raises(ConfigError, match=r"downstream.batch_size=100000000 is more than global_batch_size 8"):
        load_config(None, ["downstream.batch_size=100000000"])
    assert load_config(None, ["downstream.batch_size=8"]).downstream.batch_size == 8


def test_a_yaml_error_is_one_line(tmp_path):
    bad = tmp_path / "c.yaml"
    bad.write_text("steps: 3\nlr: [1, 2\nseed: 1\n")
    for call in (lambda: load_config(bad), lambda: load_config(None, ["steps=[1"])):
        with pytest.raises(ConfigError) as e:
            call()
        assert "not valid YAML: line " in str(e.value) and "\n" not in str(e.value), str(e.value)
