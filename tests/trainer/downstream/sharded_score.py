"""Run as a script with 2 CPU devices: one task scored on a 1-device mesh, on data=2 and on fsdp=2
(the batch rows and the parameters split), printing the largest difference as JSON."""

from __future__ import annotations

import json
import os

os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import numpy as np

import model
from tests.model.tiny import randomize, tiny_config
from tests.trainer.downstream.synthetic import task
from trainer import mesh as mesh_lib
from trainer.config.schema import MeshConfig
from trainer.downstream import score

cfg = tiny_config(vocab_size=300, vocab_pad_multiple=128, max_seq_len=512)
params = randomize(model.abstract_params(cfg), seed=2)
# One scorer per mesh for both kinds of task: queries of at most 119 tokens are one row length
# (128), 13 instances two batches of 8 rows (the second partly padding, on data=2 a shard with one
# real row), so each mesh compiles one model program (the row lengths' bucketing is
# test_score.py's, on one device).
scorers = []
for shape, devices in (((1, 1, 1), jax.devices()[:1]), ((2, 1, 1), jax.devices()), ((1, 2, 1), jax.devices())):
    mesh = mesh_lib.make_mesh(MeshConfig(data=shape[0], fsdp=shape[1], tensor=shape[2]), devices)
    shardings = model.param_shardings(cfg, mesh)
    scorer = score.TaskScorer(cfg, mesh, shardings, batch_tokens=1024, model_ctx_len=512, pad_id=1)
    scorers.append((scorer, jax.device_put(params, shardings)))
out = {}
for fast in (False, True):
    t = task("t", "acc", fast, seed=11, n=13, vocab=300, max_ctx=100)
    results = [scorer.loglik(p, t) for scorer, p in scorers]
    ok = ~np.isnan(results[0])
    out[str(fast)] = {
        "nan_equal": all(bool(np.array_equal(np.isnan(r), ~ok)) for r in results),
        "max_diff": max(float(np.abs(r[ok] - results[0][ok]).max()) for r in results[1:]),
        "min_abs": float(np.abs(results[0][ok]).min()),
        "batches": [len(list(scorer.device_batches(t))) for scorer, _ in scorers],
    }
print(json.dumps(out))
