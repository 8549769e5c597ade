"""The numpy port of ICLMetric equals olmo_eval's ICLMetric, key by key, on the same per-instance
log-likelihoods: real instances of four kinds of task (fast-mc accuracy, fast-mc length-normalized
accuracy, multi-token rc accuracy, bpb), random logits and logits drawn from three values (exact
ties everywhere), in bf16 (AI2's default) and float32."""

from __future__ import annotations

import zlib

import numpy as np
import olmo_eval
import pytest
import torch  # the test extra: a missing oracle fails, never skips
import torch.nn.functional as F

from pipelines.downstream_tasks import EvalTokenizer, instances_to_arrays
from trainer.downstream import metric

from .samples import whole_docs

LIMIT = 600  # instances of each task scored (whole docs)
SMALL_VOCAB = 16  # the scored tokens are folded into a small vocabulary: only log-likelihoods matter
TASKS = {  # label: what it stands for
    "copycolors_10way_fast": "acc, fast multiple choice (10 options)",
    "mmlu_stem_val_mc_5shot_fast": "len_norm, fast multiple choice (MMLU mc)",
    "basic_skills_pattern_rc_5shot": "acc, rc: multi-token continuations, one instance per option",
    "codex_humaneval_gold_bpb_3shot": "bpb",
}


@pytest.fixture(scope="module")
def built():
    tok = EvalTokenizer()
    return {label: olmo_eval.build_task(label, tok, model_ctx_len=8192) for label in TASKS}


def _logits(batch: dict, kind: str, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    length = int((batch["ctx_len"] + batch["cont_len"]).max()) - 1
    shape = (len(batch["doc_id"]), length, SMALL_VOCAB)
    if kind == "random":
        x = torch.randn(shape, generator=gen) * 3
    else:  # three values only: exact ties between options are everywhere
        x = torch.randint(0, 3, shape, generator=gen).float()
    return x.to(dtype)


def _fold(batch: dict) -> dict:
    b = dict(batch)
    b["continuation"] = batch["continuation"] % SMALL_VOCAB
    if "choice_ids" in batch:
        c = batch["choice_ids"]
        b["choice_ids"] = torch.where(c == -1, c, c % SMALL_VOCAB)
    return b


def _loglik(batch: dict, logits: torch.Tensor) -> np.ndarray:
    """The per-instance sums exactly as ICLMetric.update forms them ([n], or [n, options])."""
    out = []
    for i in range(len(batch["doc_id"])):
        ctx, n = int(batch["ctx_len"][i]), int(batch["cont_len"][i])
        rows = logits[i][ctx - 1 : ctx + n - 1]
        if "choice_ids" in batch:
            out.append(
                [
                    float(-F.cross_entropy(rows, c.unsqueeze(-1), reduction="sum")) if c != -1 else np.nan
                    for c in batch["choice_ids"][i]
                ]
            )
        else:
            out.append(float(-F.cross_entropy(rows, batch["continuation"][i][:n], reduction="sum")))
    return np.asarray(out, dtype=np.float64)


def _run(task, metric_type: str, kind: str, dtype: torch.dtype, seed: int, with_dc: bool = False):
    """(ICLMetric's compute as floats, the port's compute, number of docs with a tied best option)."""
    gen = torch.Generator().manual_seed(seed)
    ref = olmo_eval.ICLMetric(metric_type=metric_type)
    lls, dcs = [], []
    samples = whole_docs(task.samples, LIMIT)
    for start in range(0, len(samples), 48):
        batch = _fold(task.collate_fn(samples[start : start + 48]))
        logits = _logits(batch, kind, dtype, gen)
        dc = None
        if with_dc:  # the domain-conditional pass: its own logits, read at dc_len
            dc_batch = dict(batch, ctx_len=batch["dc_len"])
            dc = _logits(dc_batch, kind, dtype, gen)
            dcs.append(_loglik(dc_batch, dc))
        ref.update(batch, logits, dc)
        lls.append(_loglik(batch, logits))
    got_ref = {k: float(v) for k, v in ref.compute().items()}
    fast = bool(task.fast_mc)
    arrays = instances_to_arrays(samples, fast)
    ll = np.concatenate(lls)
    ports = metric.compute(
        metric_type,
        metric.entries(arrays, ll, fast, np.concatenate(dcs) if dcs else None),
        dtype="bfloat16" if dtype == torch.bfloat16 else "float32",
    )
    return got_ref, ports, ll


def _tied_docs(ll: np.ndarray) -> int:
    if ll.ndim != 2:
        return 0
    best = np.nanmax(ll, axis=1, keepdims=True)
    return int(((ll == best).sum(axis=1) > 1).sum())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("kind", ["random", "ties"])
@pytest.mark.parametrize("label", list(TASKS))
def test_every_key_equals_iclmetric(built, label, kind, dtype):
    task = built[label]
    ref, port, ll = _run(task, task.metric_type, kind, dtype, seed=zlib.crc32(f"{label}:{kind}".encode()))
    assert list(port) == list(ref)  # the same keys, in ICLMetric's order
    for k in ref:
        assert port[k] == pytest.approx(ref[k], abs=1e-6, rel=0), (k, port[k], ref[k])
    keys = metric.keyed(label, port)
    assert all(k.startswith(f"eval/downstream/{label} (") for k in keys)
    if kind == "ties" and task.fast_mc:
        assert _tied_docs(ll) > len(ll) // 4  # the ties are really there, and the first option wins them


def test_rc_ties_break_toward_the_first_option(built):
    """An rc task with every option's log-likelihood equal: ICLMetric picks option 0 for each doc,
    so accuracy is the share of docs whose label is 0; the port agrees with both."""
    task = built["basic_skills_pattern_rc_5shot"]
    arrays = instances_to_arrays(whole_docs(task.samples, LIMIT), False)
    ll = np.full(len(arrays["doc_id"]), -2.0)
    got = metric.compute("acc", metric.entries(arrays, ll, False))
    first_label = {}
    for d, lab in zip(arrays["doc_id"].tolist(), arrays["label_id"].tolist()):
        first_label.setdefault(d, lab)
    want = np.float32(np.mean([lab == 0 for lab in first_label.values()]))
    assert got["acc_v1"] == pytest.approx(float(want), abs=0)
    assert 0 < want < 1  # some labels are not option 0, so a last-option tie rule would differ


@pytest.mark.parametrize("metric_type", ["pmi_dc", "ce_loss", "len_norm", "f1"])
def test_other_metric_types_equal_iclmetric(built, metric_type):
    """The metric types none of the four tasks uses by default, on the rc task's instances."""
    task = built["basic_skills_pattern_rc_5shot"]
    ref, port, _ = _run(task, metric_type, "random", torch.bfloat16, seed=7, with_dc=metric_type == "pmi_dc")
    assert list(port) == list(ref)
    for k in ref:
        assert port[k] == pytest.approx(ref[k], abs=1e-6, rel=0), (k, port[k], ref[k])


def test_keys_are_olmo_cores():
    from olmo_core.train.callbacks.evaluator_callback import DownstreamEvaluator

    assert DownstreamEvaluator.metric_type_to_label == metric.METRIC_LABELS
    assert (
        metric.metric_key("arc_easy_test_mc_5shot_fast", "acc_v1")
        == "eval/downstream/arc_easy_test_mc_5shot_fast (accuracy)"
    )
    assert metric.LOG_2_OF_E == olmo_eval.metrics.LOG_2_OF_E
