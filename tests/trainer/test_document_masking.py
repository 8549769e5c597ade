"""`document_masking` decides whether the train/eval steps pass the loader's segment_ids and
positions to the model (attention within each packed document) or attend across the example."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import model
from dataloader import batch_fields
from pipelines.dolma2_tokenizer import EOS_ID, PAD_ID
from tests import fast_compile
from trainer import loss as loss_lib
from trainer import mesh as mesh_lib
from trainer.config.schema import TrainConfig
from trainer.step import make_eval_step


def _packed_batch(seq_len: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    rows = []
    for cut in (9, 20):  # two documents per row, then a third that runs past the row's end
        row = rng.integers(0, 1000, size=seq_len).astype(np.int32)
        row[cut] = EOS_ID
        rows.append(row)
    rows[1][-3:] = PAD_ID
    tokens = np.stack(rows)
    return {"tokens": tokens, **batch_fields(tokens, EOS_ID, PAD_ID)}


@pytest.mark.slow
def test_document_masking_switches_between_per_document_and_whole_example_attention():
    cfg = TrainConfig(model="olmo3-tiny", model_overrides={"compute_dtype": "float32"})
    model_cfg = cfg.model_cfg()
    mesh = mesh_lib.make_mesh(cfg.mesh)
    # every program here at LLVM level 0: the steps and the reference they are compared with are
    # compiled alike, in this process (tests/fast_compile.py); the parameters are both sides' input
    fast = fast_compile.OPTIONS
    params = jax.jit(model.init, static_argnums=0, compiler_options=fast)(model_cfg, jax.random.key(0))
    batch = _packed_batch()
    jbatch = {k: jnp.asarray(v) for k, v in batch.items()}

    @functools.partial(jax.jit, compiler_options=fast)
    def reference(params, batch, segment_ids, positions):
        logits = model.forward(model_cfg, params, batch["tokens"], segment_ids, positions)
        return loss_lib.loss_sums(logits, batch["tokens"], batch["loss_mask"]).ce

    def eval_ce(document_masking: bool):
        step = make_eval_step(model_cfg, model.ShardingConfig(), mesh, document_masking=document_masking)
        return step.lower(params, jbatch).compile(fast)(params, jbatch).ce

    masked, whole = eval_ce(True), eval_ce(False)
    np.testing.assert_allclose(masked, reference(params, jbatch, jbatch["segment_ids"], jbatch["positions"]), rtol=1e-5)
    np.testing.assert_allclose(whole, reference(params, jbatch, None, None), rtol=1e-5)
    assert abs(float(masked) - float(whole)) > 1e-3  # the switch really changes what attention sees
    assert TrainConfig().document_masking is True
