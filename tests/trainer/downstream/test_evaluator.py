"""The downstream evaluator: OLMo-core's keys with ICLMetric's numbers of the JAX log-likelihoods,
the pass's time and a progress line per task; files that do not fit the run are refused."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import jax
import pytest

import model
from contract import downstream as ds
from tests.model.tiny import randomize, tiny_config
from trainer import mesh as mesh_lib
from trainer.config.schema import MeshConfig
from trainer.downstream import metric
from trainer.downstream.evaluator import TIME_KEY, DownstreamEvaluator, clean_metrics

from .synthetic import task, write_tasks

CTX, VOCAB = 256, 300


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    cfg = tiny_config(vocab_size=VOCAB, max_seq_len=CTX)
    mesh = mesh_lib.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:1])
    shardings = model.param_shardings(cfg, mesh)
    params = jax.device_put(randomize(model.abstract_params(cfg), seed=5), shardings)
    root = tmp_path_factory.mktemp("tasks")
    tasks = [
        task("syn_mc_fast", "len_norm", True, seed=1, n=12, vocab=VOCAB, max_ctx=200),
        task("syn_bpb", "bpb", False, seed=2, n=9, vocab=VOCAB, max_ctx=200),
        task("syn_rc", "acc", False, seed=3, n=10, vocab=VOCAB, max_ctx=100, max_cont=4),
    ]
    write_tasks(root, tasks, VOCAB, CTX)
    return cfg, mesh, shardings, params, root


def _make(setup, **kw):
    cfg, mesh, shardings, _, root = setup
    args = dict(
        tasks_dir=root,
        labels=None,
        model_cfg=cfg,
        mesh=mesh,
        param_shardings=shardings,
        batch_tokens=1024,
        seq_len=CTX,
        interval=7,
    )
    return DownstreamEvaluator.from_files(**{**args, **kw})


def test_row_has_olmo_cores_keys_with_iclmetrics_numbers(setup):
    params = setup[3]
    lines: list[str] = []
    ev = _make(setup, log_fn=lines.append)
    row = ev(params)
    assert ev.interval == 7 and ev.precision == "bfloat16"
    assert "eval/downstream/syn_bpb (BPB)" in row and "eval/downstream/syn_bpb (BPB v2)" in row
    assert "eval/downstream/syn_mc_fast (length-normalized accuracy)" in row
    assert "eval/downstream/syn_rc (accuracy)" in row and "eval/downstream/syn_rc (soft loss v2)" in row
    want = {}
    for label, t in ev.tasks.tasks.items():
        ll = ev.scorer.loglik(params, t)
        want.update(metric.keyed(label, metric.compute(t.metric_type, metric.entries(t.arrays, ll, t.fast_mc))))
    assert {k: v for k, v in row.items() if k != TIME_KEY} == want
    assert row[TIME_KEY] > 0
    # each task's headline under its metrics.jsonl key (the console and metrics.jsonl name it alike)
    for n, (ln, label) in enumerate(zip(lines, ("syn_bpb", "syn_mc_fast", "syn_rc")), 1):
        m = re.fullmatch(rf"downstream \[{n}/3\] (eval/downstream/{label} \([^)]*\)) (\S+) \(.* instances, .*s\)", ln)
        assert m and m.group(1) in row and m.group(2) == f"{row[m.group(1)]:.4f}", ln
    assert lines[3].startswith("downstream: 3 tasks")
    ev.close()


@pytest.mark.slow
def test_precision_float32_keeps_the_unrounded_sums(setup):
    params = setup[3]
    ev32, ev16 = _make(setup, labels="syn_bpb", precision="float32"), _make(setup, labels=["syn_bpb"])
    r32, r16 = ev32(params), ev16(params)
    key = "eval/downstream/syn_bpb (BPB v2)"
    t = ev32.tasks.tasks["syn_bpb"]
    ll = ev32.scorer.loglik(params, t)
    assert r32[key] == metric.compute("bpb", metric.entries(t.arrays, ll, False), dtype="float32")["bpb_v2"]
    assert r32[key] != r16[key]  # bf16 rounding of each instance moves the mean


def test_files_that_do_not_fit_the_run_are_refused(setup, tmp_path):
    cfg = setup[0]
    with pytest.raises(ds.DownstreamTasksError, match="vocabulary"):
        _make(setup, model_cfg=tiny_config(vocab_size=VOCAB + 1, max_seq_len=CTX))
    with pytest.raises(ds.DownstreamTasksError, match="seq_len is 128"):
        _make(setup, seq_len=128)
    with pytest.raises(ds.DownstreamTasksError, match="no task"):
        _make(setup, labels=["syn_rc", "arc_easy_test_bpb_5shot"])
    write_tasks(tmp_path, [task("syn_dc", "pmi_dc", False, seed=1, n=3, vocab=VOCAB)], VOCAB, CTX)
    with pytest.raises(ds.DownstreamTasksError, match="pmi_dc"):
        _make(setup, tasks_dir=tmp_path)
    assert cfg.vocab_size == VOCAB


def test_trainer_imports_no_torch():
    """What the trainer imports to read the task files, batch and score them and compute the metric."""
    code = (
        "import sys; import contract.downstream, trainer.main, trainer.downstream.batches, "
        "trainer.downstream.metric, trainer.downstream.evaluator, trainer.downstream.score; "
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'olmo_eval', 'datasets', 'torchmetrics')); "
        "print(bad); sys.exit(1 if bad else 0)"
    )
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=os.getcwd()),
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def test_clean_subset_metrics_are_the_metrics_of_the_instances_not_found_in_training(setup):
    """downstream.clean_from: each task again on the documents the audit did not find, under its
    keys + " clean"; computed here from the task's arrays with those documents' rows dropped."""
    import numpy as np

    params = setup[3]
    found = {"syn_rc": {0, 3, 4}, "syn_mc_fast": {1}, "syn_bpb": set()}
    ev = _make(setup)
    ev.contaminated = {k: set(v) for k, v in found.items()}
    row = ev(params)
    for label, t in ev.tasks.tasks.items():
        ll = np.asarray(ev.scorer.loglik(params, t))
        keep = ~np.isin(t.arrays["doc_id"], list(found[label]))
        arrays = {k: (np.asarray(v)[keep] if np.asarray(v).shape[:1] == keep.shape else v) for k, v in t.arrays.items()}
        want = metric.keyed_clean(label, metric.compute(t.metric_type, metric.entries(arrays, ll[keep], t.fast_mc)))
        assert {k: row[k] for k in want} == want, label
        full = metric.keyed(label, metric.compute(t.metric_type, metric.entries(t.arrays, ll, t.fast_mc)))
        assert {k: row[k] for k in full} == full
    assert row["eval/downstream/syn_bpb (BPB) clean"] == row["eval/downstream/syn_bpb (BPB)"]  # nothing found
    t = ev.tasks.tasks["syn_rc"]  # every instance found: NaN, never a metric of nothing
    e = metric.entries(t.arrays, np.zeros(len(t)), t.fast_mc)
    assert all(np.isnan(v) for v in clean_metrics(t.metric_type, e, set(range(100)), "bfloat16").values())
