"""`python -m trainer.downstream` scores a trainer step directory (the params the run saved) and a
Hugging Face checkpoint (through model.load_hf) as the in-loop evaluator scores the same weights;
bad input is one error: line and exit 2."""

from __future__ import annotations

import json
import subprocess

import jax
import numpy as np
import pytest

import model
from pipelines.dolma2_tokenizer import PAD_ID, VOCAB_SIZE
from tests.model.tiny import randomize
from tests.trainer.conftest import PYTHON, ROOT, trainer_env
from trainer import mesh as mesh_lib
from trainer.checkpointing.files import restore_items
from trainer.config.schema import MeshConfig
from trainer.downstream.__main__ import main
from trainer.downstream.evaluator import TIME_KEY, DownstreamEvaluator
from trainer.mesh import abstract_like

from .synthetic import task, write_tasks

SEQ_LEN = 32  # the tiny runs' (tests/trainer/conftest.py)


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("tasks32")
    write_tasks(
        root,
        [
            task("syn_rc", "acc", False, seed=1, n=12, vocab=VOCAB_SIZE, max_ctx=20, max_cont=5),
            task("syn_mc_fast", "acc", True, seed=2, n=10, vocab=VOCAB_SIZE, max_ctx=25),
        ],
        VOCAB_SIZE,
        SEQ_LEN,
        pad_id=PAD_ID,
        tokenizer_name="dolma2",  # the runs' data's (a step's run.json tokenizer is checked against it)
    )
    return root


def _command(*args):
    proc = subprocess.run(
        [PYTHON, "-m", "trainer.downstream", *map(str, args)],
        cwd=ROOT,
        env=trainer_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc


def _in_process(cfg, params, tasks_dir, seq_len):
    mesh = mesh_lib.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:1])
    shardings = model.param_shardings(cfg, mesh)
    ev = DownstreamEvaluator.from_files(
        str(tasks_dir), None, cfg, mesh, shardings, 4096, seq_len, interval=1, precision="float32"
    )
    return ev(jax.device_put(params, shardings))


def _assert_same(got, want):
    want = {k: v for k, v in want.items() if k != TIME_KEY}
    assert set(got) - {TIME_KEY} == set(want)
    for k, v in want.items():
        assert got[k] == pytest.approx(v, abs=1e-5), k


@pytest.mark.slow
def test_scores_a_trainer_step_as_the_evaluator_does(reference_run, tasks_dir, tmp_path):
    step_dir = reference_run / "checkpoints" / "8"
    out = tmp_path / "scores.json"
    proc = _command("--tasks_dir", tasks_dir, "--step_dir", step_dir, "--out", out, "--precision", "float32")
    result = json.loads(out.read_text())
    assert result["kind"] == "step" and result["precision"] == "float32"
    assert "syn_rc" in proc.stdout and "accuracy" in proc.stdout
    cfg = model.get_config("olmo3-tiny", compute_dtype="float32")
    abstract = abstract_like(
        model.abstract_params(cfg),
        model.param_shardings(cfg, mesh_lib.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:1])),
    )
    params = restore_items(step_dir, abstract, None, ("params",))["params"]
    _assert_same(result["metrics"], _in_process(cfg, params, tasks_dir, SEQ_LEN))


@pytest.mark.slow
def test_a_step_records_its_datas_seq_len_and_scoring_it_checks_the_tasks_context_length(
    reference_run, tmp_path, capsys
):
    """The checkpoint's meta records the data's seq_len (the run's ``Checked.seq_len``): a step
    scored away from its run (no run.json beside it, a config that set no seq_len) still has its
    tasks' context length checked (before, its seq_len was unknown and the step was refused)."""
    import shutil

    from trainer.checkpointing import files

    step_dir = reference_run / "checkpoints" / "8"
    meta = files.restore_json(step_dir, "meta")
    assert meta["seq_len"] == SEQ_LEN and meta["config"]["seq_len"] is None
    alone = tmp_path / "copied" / "8"
    shutil.copytree(step_dir, alone)
    wide = tmp_path / "tasks64"
    write_tasks(
        wide,
        [task("syn_rc", "acc", False, seed=1, n=4, vocab=VOCAB_SIZE, max_ctx=20, max_cont=5)],
        VOCAB_SIZE,
        2 * SEQ_LEN,
        pad_id=PAD_ID,
        tokenizer_name="dolma2",
    )
    out = tmp_path / "s.json"
    assert main(["--tasks_dir", str(wide), "--step_dir", str(alone), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(2 * SEQ_LEN) in err[0] and str(SEQ_LEN) in err[0], err
    assert not out.exists()


@pytest.mark.slow
def test_scores_a_hugging_face_checkpoint(tasks_dir, tmp_path):
    """The command's main in this process (the `python -m` entry point runs as its own process in
    test_scores_a_trainer_step_as_the_evaluator_does)."""
    cfg = model.get_config("olmo3-tiny", compute_dtype="float32")
    params = jax.tree.map(np.asarray, randomize(model.abstract_params(cfg), seed=9))
    model.save_hf(cfg, params, str(tmp_path / "hf"))
    out = tmp_path / "hf.json"
    argv = ["--tasks_dir", tasks_dir, "--hf", tmp_path / "hf", "--out", out, "--precision", "float32"]
    assert main([str(a) for a in argv]) == 0
    assert json.loads(out.read_text())["kind"] == "hf"
    loaded_cfg, loaded = model.load_hf(str(tmp_path / "hf"))
    _assert_same(json.loads(out.read_text())["metrics"], _in_process(loaded_cfg, loaded, tasks_dir, None))


def test_bad_input_is_one_error_line_and_exit_2(tasks_dir, tmp_path, capsys):
    cases = [
        (["--tasks_dir", tmp_path, "--hf", tmp_path], "no manifest.json"),
        (["--tasks_dir", tasks_dir, "--step_dir", tmp_path / "nope"], "no such directory"),
        (["--tasks_dir", tasks_dir, "--step_dir", tmp_path], "not a trainer step directory"),
        (["--tasks_dir", tasks_dir, "--hf", tmp_path], "not a Hugging Face checkpoint"),
        (
            ["--tasks_dir", tasks_dir, "--hf", tmp_path, "--tasks", "arc_easy_test_bpb_5shot"],
            "not a Hugging Face checkpoint",
        ),
    ]
    for argv, message in cases:
        assert main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error: ") and message in err[0], err
    cfg = model.get_config("olmo3-tiny", compute_dtype="float32", vocab_size=1000)
    model.save_hf(cfg, jax.tree.map(np.asarray, randomize(model.abstract_params(cfg), seed=1)), str(tmp_path / "hf"))
    assert main(["--tasks_dir", str(tasks_dir), "--hf", str(tmp_path / "hf")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "vocabulary" in err[0], err


def test_a_hugging_face_config_lacking_a_field_is_refused_naming_the_field_its_file_and_what_it_holds(
    tasks_dir, tmp_path, capsys
):
    cfg = model.get_config("olmo3-tiny", compute_dtype="float32")
    hf = tmp_path / "hf"
    model.save_hf(cfg, jax.tree.map(np.asarray, randomize(model.abstract_params(cfg), seed=1)), str(hf))
    config = json.loads((hf / "config.json").read_text())
    del config["num_attention_heads"]
    config["intermediate_size"] = "wide"
    (hf / "config.json").write_text(json.dumps(config))
    assert main(["--tasks_dir", str(tasks_dir), "--hf", str(hf), "--out", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {hf}: config.json: "), err
    assert "'num_attention_heads' is missing: it holds the number of attention (query) heads, an integer" in err[0]
    assert "'intermediate_size' is 'wide': it holds the MLP's hidden width, an integer" in err[0]
    assert not (tmp_path / "s.json").exists()


def test_a_hugging_face_config_with_no_heads_is_refused_as_a_field_that_holds_no_positive_integer(
    tasks_dir, tmp_path, capsys
):
    """`"num_attention_heads": 0` passed the field check and then, with no `head_dim` (HF's default is
    hidden_size // heads), divided by zero: a ZeroDivisionError traceback."""
    cfg = model.get_config("olmo3-tiny", compute_dtype="float32")
    hf = tmp_path / "hf"
    model.save_hf(cfg, jax.tree.map(np.asarray, randomize(model.abstract_params(cfg), seed=1)), str(hf))
    config = json.loads((hf / "config.json").read_text())
    config["num_attention_heads"] = 0
    config.pop("head_dim", None)
    (hf / "config.json").write_text(json.dumps(config))
    assert main(["--tasks_dir", str(tasks_dir), "--hf", str(hf), "--out", str(tmp_path / "s.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {hf}: config.json: 'num_attention_heads' is 0: it holds"), err
    assert not (tmp_path / "s.json").exists()


@pytest.mark.slow
def test_a_relative_step_dir_as_the_readme_writes_it_is_scored(reference_run, tasks_dir, tmp_path, monkeypatch):
    """`--step_dir runs/s1/checkpoints/10000` (relative): orbax restores from an absolute path only."""
    monkeypatch.chdir(reference_run.parent)
    out = tmp_path / "scores.json"
    relative = f"{reference_run.name}/checkpoints/8"
    argv = ["--tasks_dir", str(tasks_dir), "--step_dir", relative, "--out", str(out), "--precision", "float32"]
    assert main(argv) == 0
    result = json.loads(out.read_text())
    assert result["kind"] == "step" and result["source"] == str((reference_run / "checkpoints" / "8").resolve())
