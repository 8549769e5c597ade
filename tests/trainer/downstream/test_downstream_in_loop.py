"""The recipe's `downstream` section runs in the training loop: every `every` steps (and at the
last) the row holds OLMo-core's keys, equal to what `python -m trainer.downstream`'s evaluator
computes from the checkpoint saved at that step; a task folder built for another seq_len is
refused at start-up (exit 2) before the run directory is written."""

from __future__ import annotations

import jax
import pytest

import model
from pipelines.dolma2_tokenizer import PAD_ID, VOCAB_SIZE
from tests.trainer.conftest import read_jsonl, run_trainer, trainer_cmd
from trainer import mesh as mesh_lib
from trainer.checkpointing.files import restore_items
from trainer.config.schema import MeshConfig
from trainer.downstream.evaluator import TIME_KEY, DownstreamEvaluator
from trainer.mesh import abstract_like

from .synthetic import task, write_tasks

SEQ_LEN = 32  # the tiny runs' (tests/trainer/conftest.py)
LABELS = ("copycolors_10way_fast", "basic_skills_pattern_rc_5shot")  # real labels (the config checks them)


def _tasks(root, model_ctx_len=SEQ_LEN):
    write_tasks(
        root,
        [
            task(LABELS[0], "acc", True, seed=3, n=10, vocab=VOCAB_SIZE, max_ctx=25),
            task(LABELS[1], "acc", False, seed=4, n=12, vocab=VOCAB_SIZE, max_ctx=20, max_cont=5),
        ],
        VOCAB_SIZE,
        model_ctx_len,
        pad_id=PAD_ID,
        tokenizer_name="dolma2",
    )
    return root


def _overrides(tasks_dir, interval=4):
    return [
        f"downstream.tasks=[{','.join(LABELS)}]",
        f"downstream.every={interval}",
        f"downstream.tasks_dir={tasks_dir}",
        "downstream.precision=float32",
    ]


@pytest.mark.slow
def test_the_loop_logs_downstream_keys_equal_to_scoring_its_checkpoint(trainer_process, data_manifest, tmp_path):
    tasks_dir, run_dir = _tasks(tmp_path / "tasks"), tmp_path / "run"
    run_trainer(data_manifest, run_dir, "steps=6", *_overrides(tasks_dir), via=trainer_process)
    rows = read_jsonl(run_dir / "metrics.jsonl")
    scored = [r for r in rows if TIME_KEY in r]
    assert [r["step"] + 1 for r in scored] == [4, 6]  # every interval, and the last step
    keys = {k for k in scored[0] if k.startswith("eval/downstream/")}
    assert any(k.startswith(f"eval/downstream/{LABELS[0]} (") for k in keys)
    assert any(k.startswith(f"eval/downstream/{LABELS[1]} (") for k in keys)
    assert all(TIME_KEY not in r for r in rows if r["step"] + 1 not in (4, 6))

    cfg = model.get_config("olmo3-tiny", compute_dtype="float32")
    mesh = mesh_lib.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:1])
    shardings = model.param_shardings(cfg, mesh)
    params = restore_items(
        run_dir / "checkpoints" / "4", abstract_like(model.abstract_params(cfg), shardings), None, ("params",)
    )["params"]
    ev = DownstreamEvaluator.from_files(
        str(tasks_dir), None, cfg, mesh, shardings, 4096, SEQ_LEN, interval=1, precision="float32"
    )
    want = {k: v for k, v in ev(params).items() if k != TIME_KEY}
    assert keys == set(want)
    for k, v in want.items():
        assert scored[0][k] == pytest.approx(v, abs=1e-5), k


def test_tasks_built_for_another_seq_len_are_refused_before_the_run_dir_is_written(
    trainer_process, data_manifest, tmp_path
):
    tasks_dir, run_dir = _tasks(tmp_path / "tasks", model_ctx_len=2 * SEQ_LEN), tmp_path / "run"
    proc = trainer_process.run(trainer_cmd(data_manifest, run_dir, "steps=2", *_overrides(tasks_dir)))
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "model_ctx_len 64" in errors[0] and "Traceback" not in proc.stderr
    assert not run_dir.exists() or not any(run_dir.iterdir())
