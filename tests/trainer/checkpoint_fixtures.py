"""Shared by the checkpoint tests: a small params/optimizer state, saved steps, and damage to them."""

from __future__ import annotations

import errno

import jax
import numpy as np
import orbax.checkpoint as ocp

from contract.rundir import RunDir
from trainer import optim
from trainer.checkpointing import files as checkpoint_files
from trainer.checkpointing import rules
from trainer.checkpointing.checkpoints import Checkpoints
from trainer.config.schema import CheckpointConfig, load_config
from trainer.mesh import abstract_like


class Loader:
    """Stands in for the data iterator: only its state is checkpointed."""

    def __init__(self, step):
        self._state = {"fingerprint": "f" * 64, "seed": 7, "global_batch_size": 4, "step": step}

    def state(self):
        return dict(self._state)


def make_state(seed=0):
    cfg = load_config(None, ["skip_step.enabled=true"])  # NamedTuple-rich optimizer state
    tx = optim.make_optimizer(cfg)
    k = jax.random.split(jax.random.key(seed), 2)
    params = {
        "embed": {"embedding": jax.random.normal(k[0], (7, 3))},
        "lm_head": {"kernel": jax.random.normal(k[1], (3, 7))},
    }
    opt_state = tx.init(params)
    grads = jax.tree.map(lambda x: 0.5 * x, params)
    _, opt_state = jax.jit(lambda g, o, p: tx.update(g, o, p, loss=3.0))(grads, opt_state, params)
    return params, opt_state


def abstract(tree):
    sharding = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    return abstract_like(tree, jax.tree.map(lambda _: sharding, tree))


def assert_bitwise_equal(a, b):
    la, lb = jax.tree_util.tree_flatten(a), jax.tree_util.tree_flatten(b)
    assert la[1] == lb[1]
    for x, y in zip(la[0], lb[0]):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


def saved(tmp_path, steps, keep=None):
    params, opt_state = make_state()
    ckpt = Checkpoints(RunDir(tmp_path), CheckpointConfig(keep=keep))
    for step in steps:
        ckpt.save(step, params, opt_state, Loader(step), {"step": step})
    ckpt.wait()
    return ckpt, params, opt_state


def init_from(run_dir, step_dir, abstract_params, abstract_opt_state, trust_unverified=False):
    """(params, opt_state) a stage-2 run in ``run_dir`` starts from: ``checkpoint.init_from=step_dir``."""
    ckpt = Checkpoints(RunDir(run_dir), CheckpointConfig(init_from=str(step_dir), trust_unverified=trust_unverified))
    try:
        return ckpt.restore_init_from(abstract_params, abstract_opt_state)
    finally:
        ckpt.close()


def flip_byte(path, offset=None):
    data = bytearray(path.read_bytes())
    i = len(data) // 2 if offset is None else offset
    data[i] ^= 0x01
    path.write_bytes(bytes(data))


def params_data_files(step_dir):
    """The array-data files of the params item (orbax OCDBT data files), largest first."""
    files = [p for p in (step_dir / "params").rglob("*") if p.is_file() and p.parent.name == "d"]
    return sorted(files, key=lambda p: -p.stat().st_size)


def failing_read(monkeypatch, victim):
    """checkpoint_files._sha256 raising an OSError (EIO) for ``victim`` (a path), reading others as usual."""
    real_sha256 = checkpoint_files._sha256

    def sha256(path):
        if path == victim:
            raise OSError(errno.EIO, "Input/output error", str(path))
        return real_sha256(path)

    monkeypatch.setattr(checkpoint_files, "_sha256", sha256)


def legacy_step(run_dir, step, params, opt_state, pending=False):
    """A step as an olmax that sealed a step only after orbax's commit left it: plain orbax, no
    checksum file. ``pending``: with the marker that olmax wrote before each save (killed between
    the commit and the checksums); without: written before checksums existed at all."""
    mngr = ocp.CheckpointManager(run_dir / rules.CHECKPOINTS, item_names=rules.ITEMS)
    mngr.save(
        step,
        args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            data=ocp.args.JsonSave(Loader(step).state()),
            meta=ocp.args.JsonSave({"step": step}),
        ),
    )
    mngr.wait_until_finished()
    mngr.close()
    if pending:
        (run_dir / rules.PENDING).mkdir(parents=True, exist_ok=True)
        (run_dir / rules.PENDING / str(step)).touch()
