"""Orbax round trips (bitwise), stage-2 initialisation, and the run logs' restart rules."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from trainer import logs, optim
from trainer.checkpoint import Checkpointer, abstract_like, key_from_json, key_to_json, restore_model_state
from trainer.config import CheckpointConfig, load_config


class _Loader:
    """Stands in for the data iterator: only its state is checkpointed."""

    def __init__(self, step):
        self._state = {"fingerprint": "f" * 64, "seed": 7, "global_batch_size": 4, "step": step}

    def state(self):
        return dict(self._state)


def _state(seed=0):
    cfg = load_config(None, ["skip_step.enabled=true"])  # NamedTuple-rich optimizer state
    tx = optim.make_optimizer(cfg)
    k = jax.random.split(jax.random.key(seed), 2)
    params = {"embed": {"embedding": jax.random.normal(k[0], (7, 3))},
              "lm_head": {"kernel": jax.random.normal(k[1], (3, 7))}}
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda x: 0.5 * x, params)
    _, opt_state = jax.jit(lambda g, o, p: tx.update(g, o, p, loss=3.0))(grads, opt_state, params)
    return params, opt_state


def _abstract(tree):
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return abstract_like(tree, jax.tree.map(lambda _: sharding, tree))


def _assert_bitwise_equal(a, b):
    la, lb = jax.tree_util.tree_flatten(a), jax.tree_util.tree_flatten(b)
    assert la[1] == lb[1]
    for x, y in zip(la[0], lb[0]):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def test_checkpoint_round_trip_is_bitwise_with_rng_and_data_position(tmp_path):
    params, opt_state = _state()
    rng = jax.random.split(jax.random.key(3))[1]
    meta = {"step": 5, "rng": key_to_json(rng), "data_sha256": "ab" * 32}
    ckpt = Checkpointer(tmp_path, CheckpointConfig(keep=2))
    for step in (5, 10, 15):
        ckpt.save(step, params, opt_state, _Loader(step), {**meta, "step": step})
    ckpt.wait()
    assert ckpt.manager.all_steps() == [10, 15]  # keep policy
    restored = ckpt.restore(15, _abstract(params), _abstract(opt_state))
    ckpt.close()
    _assert_bitwise_equal(restored["params"], params)
    _assert_bitwise_equal(restored["opt_state"], opt_state)
    assert restored["data"]["step"] == restored["meta"]["step"] == 15
    back = key_from_json(json.loads(json.dumps(restored["meta"]["rng"])))
    assert np.array_equal(jax.random.key_data(back), jax.random.key_data(rng))
    assert np.array_equal(jax.random.normal(back, (3,)), jax.random.normal(rng, (3,)))


def test_checkpoint_refuses_a_data_position_that_does_not_match_the_step(tmp_path):
    params, opt_state = _state()
    ckpt = Checkpointer(tmp_path, CheckpointConfig())
    with pytest.raises(RuntimeError, match="data position would not match"):
        ckpt.save(4, params, opt_state, _Loader(3), {"step": 4})
    ckpt.close()


def test_stage2_starts_from_a_stage1_step_with_its_optimizer_state(tmp_path):
    params, opt_state = _state(seed=1)
    ckpt = Checkpointer(tmp_path / "stage1", CheckpointConfig())
    ckpt.save(1000, params, opt_state, _Loader(1000), {"step": 1000})
    ckpt.wait()
    ckpt.close()
    p, o = restore_model_state(tmp_path / "stage1" / "checkpoints" / "1000", _abstract(params), _abstract(opt_state))
    _assert_bitwise_equal(p, params)
    _assert_bitwise_equal(o, opt_state)
    assert int(o.inner_state[1].count) == 1  # Adam's bias-correction count carries over
    with pytest.raises(FileNotFoundError, match="init_from"):
        restore_model_state(tmp_path / "stage1", _abstract(params), _abstract(opt_state))


def test_restart_cuts_logs_back_to_the_checkpoint_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text("".join(json.dumps({"step": s, "loss": 1.0 / (s + 1)}) + "\n" for s in range(7)) + '{"step": 7, "lo')
    writer = logs.JsonlWriter(path, before_step=4)
    writer.write({"step": 4, "loss": 0.5})
    writer.close()
    assert [r["step"] for r in logs.read_jsonl(path)] == [0, 1, 2, 3, 4]


def test_params_sha256_sees_every_bit_and_the_layout():
    params, _ = _state()
    base = logs.params_sha256(params)
    assert base == logs.params_sha256(jax.tree.map(np.array, params))
    flipped = np.array(params["lm_head"]["kernel"])
    flipped.view(np.uint32)[1, 2] ^= 1  # one mantissa bit
    assert logs.params_sha256({**params, "lm_head": {"kernel": flipped}}) != base
    assert logs.params_sha256({**params, "lm_head": {"kernel": flipped.reshape(7, 3)}}) != logs.params_sha256(
        {**params, "lm_head": {"kernel": flipped}})


def test_data_sha256_chains_over_steps_and_global_batches():
    a = logs.chain_data_sha256("", 0, np.array([1, 2, 3, 4]))
    assert a == logs.chain_data_sha256("", 0, np.array([1, 2, 3, 4], np.int32))
    assert a != logs.chain_data_sha256("", 0, np.array([2, 1, 3, 4]))
    assert a != logs.chain_data_sha256("", 1, np.array([1, 2, 3, 4]))
    assert logs.chain_data_sha256(a, 1, np.array([5])) != logs.chain_data_sha256("", 1, np.array([5]))
