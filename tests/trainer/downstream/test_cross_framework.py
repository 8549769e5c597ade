"""End to end, across frameworks: a small random Hugging Face `Olmo3ForCausalLM` with dolma2's
vocabulary scored by torch as OLMo-core's evaluator does (olmo_eval's own batches, the model's full
logits, olmo_eval's ICLMetric), and the same weights loaded into olmax (model.load_hf) and scored in
JAX (trainer.downstream: only the scored positions through the LM head, then the metric port):
every metric within 1e-3 (measured: ≤ 1e-6) and the same answer for every doc whose options are
not a near tie.
Real instances of three kinds of task, built by olmo_eval in the test (float32 on both sides)."""

from __future__ import annotations

from collections import defaultdict

import jax
import numpy as np
import olmo_eval
import pytest
import torch  # the test extra: a missing oracle fails, never skips
import transformers

import model
from contract.downstream import TaskInstances
from pipelines import dolma2_tokenizer as tok
from pipelines.downstream_tasks import EvalTokenizer, instances_to_arrays
from trainer import mesh as mesh_lib
from trainer.config.schema import MeshConfig
from trainer.downstream import metric, score

from .samples import whole_docs

CTX = 300  # model_ctx_len: olmo_eval left-truncates the few-shot queries to it
LIMIT = 30  # instances per task (whole docs)
TORCH_BATCH = 2  # full float32 logits [2, 300, 100278]: 240 MB
TASKS = ("copycolors_10way_fast", "basic_skills_pattern_rc_5shot", "codex_humaneval_gold_bpb_3shot")
TOL = 1e-3
NEAR_TIE = 1e-3


@pytest.fixture(scope="module")
def hf_model(tmp_path_factory):
    torch.manual_seed(0)
    cfg = transformers.Olmo3Config(
        vocab_size=tok.VOCAB_SIZE,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        sliding_window=64,
        rms_norm_eps=1e-6,
        pad_token_id=tok.PAD_ID,
        eos_token_id=tok.EOS_ID,
        attn_implementation="eager",
    )
    hf = transformers.Olmo3ForCausalLM(cfg).eval()
    with torch.no_grad():  # weights large enough that every one matters, non-trivial norms
        for name, p in hf.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.1 * torch.randn_like(p))
    path = str(tmp_path_factory.mktemp("hf_olmo3"))
    hf.save_pretrained(path)
    return hf, path


@pytest.fixture(scope="module")
def built():
    t = EvalTokenizer()
    return {label: olmo_eval.build_task(label, t, model_ctx_len=CTX) for label in TASKS}


def _torch_reference(hf, task, samples) -> tuple[dict[str, float], olmo_eval.ICLMetric]:
    """OLMo-core's DownstreamEvaluator: consecutive collated batches, full logits, ICLMetric."""
    ref = olmo_eval.ICLMetric(metric_type=task.metric_type)
    with torch.no_grad():
        for s in range(0, len(samples), TORCH_BATCH):
            batch = task.collate_fn(samples[s : s + TORCH_BATCH])
            ref.update(batch, hf(batch["input_ids"]).logits.float())
    values = {k: float(v) for k, v in ref.compute().items()}
    return values, ref


def _choices(per_entry: list[tuple[int, int, float]]) -> dict[int, tuple[int, float]]:
    """doc → (argmax option, gap to the runner-up) from (doc, option, value) entries."""
    docs: dict[int, dict[int, float]] = defaultdict(dict)
    for d, c, v in per_entry:
        docs[int(d)].setdefault(int(c), float(v))
    out = {}
    for d, opts in docs.items():
        v = np.asarray([opts[c] for c in sorted(opts)])
        top = np.sort(v)[::-1]
        out[d] = (int(np.argmax(v)), float(top[0] - top[1]) if len(v) > 1 else np.inf)
    return out


@pytest.fixture(scope="module")
def jax_scorer(hf_model):
    cfg, params = model.load_hf(hf_model[1], compute_dtype="float32")
    mesh = mesh_lib.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:1])
    shardings = model.param_shardings(cfg, mesh)
    scorer = score.TaskScorer(
        cfg, mesh, shardings, batch_tokens=2048, model_ctx_len=CTX, pad_id=tok.PAD_ID, head_rows=256
    )
    return scorer, jax.device_put(params, shardings)


@pytest.mark.ci_extra  # a minute of make test's 12: CI runs it in make test-extra
@pytest.mark.slow
@pytest.mark.parametrize("label", TASKS)
def test_jax_scores_equal_olmo_cores_torch_scores(hf_model, built, jax_scorer, label):
    task = built[label]
    fast = bool(task.fast_mc)
    samples = whole_docs(task.samples, LIMIT)
    want, ref = _torch_reference(hf_model[0], task, samples)

    scorer, params = jax_scorer
    arrays = instances_to_arrays(samples, fast)
    ti = TaskInstances(label, task.metric_type, fast, arrays)
    ll = scorer.loglik(params, ti)
    entries = metric.entries(arrays, ll, fast)
    got = metric.compute(task.metric_type, entries, dtype="float32")

    assert list(got) == list(want)
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=TOL), key
    if task.metric_type in ("ce_loss", "bpb"):
        return
    # the decisions: ICLMetric's per-option values (length-normalized for len_norm) vs ours
    ours_v = np.asarray(entries.loglik, np.float64)
    if task.metric_type == "len_norm":
        ours_v = ours_v / entries.cont_str_len
    theirs = _choices([(d, c, float(v)) for d, c, v in ref.loglikelihoods])
    ours = _choices(list(zip(entries.doc_id.tolist(), entries.cont_id.tolist(), ours_v.tolist())))
    assert set(ours) == set(theirs)
    clear = [d for d in theirs if min(theirs[d][1], ours[d][1]) > NEAR_TIE]
    assert len(clear) >= 0.8 * len(theirs)
    assert [ours[d][0] for d in clear] == [theirs[d][0] for d in clear]
