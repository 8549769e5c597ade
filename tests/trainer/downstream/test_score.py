"""JAX scoring equals OLMo-core's reads of the model's full logits on OLMo-core's own batches; the
LM head never sees the whole batch; a pass compiles a bounded number of shapes."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

import model
from tests import fast_compile
from tests.model.tiny import randomize, tiny_config
from trainer import mesh as mesh_lib
from trainer.config.schema import MeshConfig
from trainer.downstream import batches as bt
from trainer.downstream import score

from .synthetic import task

PAD = 1
CTX = 512
# Every program of the tests in this process at LLVM level 0 (tests/fast_compile.py): the scorer's
# and the full-logits reference's are compiled alike; the others check structure (HLO text, shape
# counts). The sharded child compiles both of its sides at level 0 too.
FAST = fast_compile.OPTIONS
_forward = jax.jit(model.forward, static_argnums=0, compiler_options=FAST)
_log_softmax = jax.jit(functools.partial(jax.nn.log_softmax, axis=-1), compiler_options=FAST)


@pytest.fixture(scope="module")
def setup():
    cfg = tiny_config(vocab_size=300, vocab_pad_multiple=128, max_seq_len=CTX)  # padded vocab 384
    mesh = mesh_lib.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1), jax.devices()[:1])
    shardings = model.param_shardings(cfg, mesh)
    params = jax.device_put(randomize(model.abstract_params(cfg), seed=4), shardings)
    return cfg, mesh, shardings, params


def _reference(cfg, params, t, fast: bool) -> np.ndarray:
    """OLMo-core's way: its batches (consecutive, padded to a multiple of 128), the full logits,
    log-softmax, the reads ICLMetric makes."""
    parts = []
    for b in bt.batches(t.arrays, 5, fast, PAD, CTX):
        logits = np.asarray(_forward(cfg, params, b.tokens), np.float32)
        logp = np.asarray(_log_softmax(logits[b.score_row, b.score_col]))
        parts.append((b, bt.entry_loglik(b, logp)))
    return bt.task_loglik(len(t), fast, t["choices"].shape[1], parts)


@pytest.mark.slow
@pytest.mark.parametrize("fast", [False, True])
def test_scored_loglik_equals_full_logits_reads(setup, fast):
    cfg, mesh, shardings, params = setup
    # queries of up to 219 tokens: two row lengths (128, 256), several batches of each
    t = task("t", "acc", fast, seed=7 + fast, n=23, vocab=cfg.vocab_size, max_ctx=200)
    scorer = score.TaskScorer(
        cfg, mesh, shardings, batch_tokens=1024, model_ctx_len=CTX, pad_id=PAD, head_rows=8, compiler_options=FAST
    )  # several head chunks per batch
    got = scorer.loglik(params, t)
    want = _reference(cfg, params, t, fast)
    assert got.shape == want.shape
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.abs(want[ok]).min() > 1.0  # real sums, not zeros
    np.testing.assert_allclose(got[ok], want[ok], rtol=0, atol=2e-4)


def test_plan_covers_every_instance_once_within_its_bucket():
    rng = np.random.default_rng(0)
    lens = rng.integers(1, 3000, 500)
    batches = score.plan(lens, batch_tokens=16384, shards=2, model_ctx_len=3072)
    rows = np.concatenate([p.rows for p in batches])
    assert sorted(rows.tolist()) == list(range(500))
    for p in batches:
        assert len(p.rows) <= p.batch_rows and p.batch_rows % 2 == 0
        assert lens[p.rows].max() <= p.length <= 3072
        below = max((b for b in score.LENGTH_BUCKETS if b < p.length), default=0)
        assert p.length in score.LENGTH_BUCKETS and lens[p.rows].min() > below  # each row in its own bucket
        assert p.batch_rows * p.length <= 16384 or p.batch_rows == 2
    assert len({(p.batch_rows, p.length) for p in batches}) <= 10  # 128, 256, 384, ..., 2048, 3072


def test_lm_head_never_sees_the_whole_batch(setup):
    """The compiled program holds no [B, L, vocab] array (the logits exist per head chunk only)."""
    cfg, mesh, shardings, params = setup
    hidden_fn, head_fn = score.make_score_fns(cfg, mesh, shardings, head_rows=8, compiler_options=FAST)
    B, L, S, K = 4, 256, 16, 1
    tokens, cols, targets = (
        score.to_global(a, mesh)
        for a in (np.zeros((B, L), np.int32), np.zeros((B, S), np.int32), np.zeros((B, S, K), np.int32))
    )
    hidden = hidden_fn(params, tokens)
    assert hidden.shape == (B, L, cfg.d_model)
    vp = cfg.padded_vocab_size
    full = re.compile(rf"\[{B},{L},{vp}\]|\[{B * L},{vp}\]")
    assert not full.search(hidden_fn.lower(params, tokens).compile().as_text())
    hlo = head_fn.lower(params["lm_head"], hidden, cols, targets).compile().as_text()
    assert re.search(rf"\[{B},2,{vp}\]", hlo)  # a head chunk: 2 columns of 4 rows
    assert not full.search(hlo)


@pytest.mark.slow
def test_compiles_once_per_shape(setup):
    cfg, mesh, shardings, params = setup
    t = task("t", "acc", False, seed=3, n=40, vocab=cfg.vocab_size, max_ctx=200)
    scorer = score.TaskScorer(
        cfg, mesh, shardings, batch_tokens=1024, model_ctx_len=CTX, pad_id=PAD, compiler_options=FAST
    )
    expected = score.shapes(t.arrays, False, 1024, 1, CTX)
    scorer.loglik(params, t)
    scorer.loglik(params, t)
    assert scorer.head_fn._cache_size() == len(expected) < len(score.plan(t.lengths("query"), 1024, 1, CTX))
    assert scorer.hidden_fn._cache_size() == len({(b, L) for b, L, _, _ in expected}) < len(expected)


def test_tokens_outside_the_vocabulary_are_refused(setup):
    cfg, mesh, shardings, params = setup
    t = task("t", "acc", False, seed=1, n=3, vocab=cfg.vocab_size + 50)
    scorer = score.TaskScorer(cfg, mesh, shardings, batch_tokens=1024, model_ctx_len=CTX, pad_id=PAD)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        scorer.loglik(params, t)


@pytest.mark.slow
def test_sharded_meshes_score_as_one_device():
    """data=2 (the batch rows split) and fsdp=2 (rows and parameters split) on 2 CPU devices give
    the 1-device log-likelihoods (a child process: the device count is fixed at JAX's start)."""
    r = subprocess.run(
        [sys.executable, "-m", "tests.trainer.downstream.sharded_score"],
        capture_output=True,
        text=True,
        timeout=600,
        env=fast_compile.env(dict(os.environ, PYTHONPATH=os.getcwd())),  # both sides scored in that process
    )
    assert r.returncode == 0, r.stderr[-4000:]
    for fast, v in json.loads(r.stdout.strip().splitlines()[-1]).items():
        assert v["nan_equal"] and v["min_abs"] > 1.0, (fast, v)
        assert v["max_diff"] < 1e-4, (fast, v)
        assert v["batches"] == [2, 2, 2], (fast, v)  # more than one batch on every mesh


def test_row_lengths_are_ones_the_model_attention_can_tile():
    """Splash tiles a sequence only in whole blocks: with OLMo 3's 1024 blocks on a TPU, 1536 is no
    row length (the first pass on the chip stopped there), and the XLA path's attention_chunk
    likewise; a query of such a length takes the next runnable length."""
    cfg = model.get_config(
        "olmo3-7b-proxy", attention_impl="auto", splash_block_q=1024, splash_block_kv=1024, attention_chunk=None
    )
    tpu = score.runnable_buckets(cfg, "tpu")  # attention_impl auto: splash on a TPU
    assert 1536 not in tpu and {128, 384, 768, 1024, 2048, 3072, 4096, 6144, 8192} <= set(tpu)
    for n in tpu:
        model.attention.check_seq_len(cfg, n, "splash")  # each one runs
    assert score.runnable_buckets(cfg, "cpu") == score.LENGTH_BUCKETS  # XLA without a chunk: any length
    chunked = model.get_config("olmo3-7b-proxy", attention_chunk=1024)
    assert 1536 not in score.runnable_buckets(chunked, "cpu")
    lens = np.array([1200, 1500, 1537, 2500, 5000])
    batches = score.plan(lens, batch_tokens=65536, shards=1, model_ctx_len=8192, buckets=tpu)
    assert sorted({p.length for p in batches}) == [2048, 3072, 6144]
