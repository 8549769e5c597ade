"""Orbax checkpoints of a run: one step directory with items params, opt_state, data, meta.

    run_dir/checkpoints/<step>/params     parameters (StandardSave: sharded arrays, any topology)
    run_dir/checkpoints/<step>/opt_state  optimizer state (same)
    run_dir/checkpoints/<step>/data       the loader state (dataloader.checkpoint, JSON)
    run_dir/checkpoints/<step>/meta       {"step", "rng", "data_sha256", "tokens", ...} (JSON)

``<step>`` is the number of updates applied. Saving is asynchronous where orbax can (the device
→ host copy happens before ``save`` returns, the write in the background); a step directory
appears under its final name only once complete, so a run killed mid-write restarts from the
previous one. Restoring takes target shardings, so a checkpoint written by H processes
restores onto any other mesh.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from dataloader import checkpoint as data_checkpoint
from trainer.config import CheckpointConfig

log = logging.getLogger(__name__)

ITEMS = ("params", "opt_state", "data", "meta")


def key_to_json(key: jax.Array) -> dict[str, Any]:
    """A typed PRNG key → JSON (its implementation name and raw uint32 words, exactly)."""
    data = np.asarray(jax.random.key_data(key))
    return {"impl": str(jax.random.key_impl(key)), "data": data.astype(np.uint32).tolist()}


def key_from_json(obj: dict[str, Any]) -> jax.Array:
    return jax.random.wrap_key_data(np.asarray(obj["data"], dtype=np.uint32), impl=obj["impl"])


def abstract_like(tree: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs of ``tree`` (arrays or ShapeDtypeStructs) carrying ``shardings``."""
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


class Checkpointer:
    """CheckpointManager wiring: when to save is the caller's decision (``save(step)``)."""

    def __init__(self, run_dir: str | Path, cfg: CheckpointConfig):
        self.directory = Path(run_dir).resolve() / "checkpoints"
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.keep,
            keep_period=cfg.keep_period,
            enable_async_checkpointing=cfg.async_save,
            cleanup_tmp_directories=True,  # leftovers of a run killed mid-write
            create=True,
        )
        self.manager = ocp.CheckpointManager(self.directory, options=options, item_names=ITEMS)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, params: Any, opt_state: Any, loader: Any, meta: dict[str, Any]) -> None:
        state = loader.state()
        if state["step"] != step or meta["step"] != step:
            raise RuntimeError(f"checkpoint {step}: loader is at step {state['step']}, meta says "
                               f"{meta['step']}; the data position would not match the parameters")
        self.manager.save(step, force=True, args=ocp.args.Composite(
            params=ocp.args.StandardSave(params),
            opt_state=ocp.args.StandardSave(opt_state),
            data=data_checkpoint.save_args(loader),
            meta=ocp.args.JsonSave(meta),
        ))

    def restore(self, step: int, abstract_params: Any, abstract_opt_state: Any) -> dict[str, Any]:
        """{"params", "opt_state", "data", "meta"} of ``step``, arrays placed as the abstract trees say."""
        restored = self.manager.restore(step, args=ocp.args.Composite(
            params=ocp.args.StandardRestore(abstract_params),
            opt_state=ocp.args.StandardRestore(abstract_opt_state),
            data=data_checkpoint.restore_args(),
            meta=ocp.args.JsonRestore(),
        ))
        return {k: restored[k] for k in ITEMS}

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def restore_model_state(step_dir: str | Path, abstract_params: Any, abstract_opt_state: Any) -> tuple[Any, Any]:
    """params and opt_state of another run's step directory (stage 2 starting from stage 1)."""
    step_dir = Path(step_dir).resolve()
    missing = [item for item in ("params", "opt_state") if not (step_dir / item).is_dir()]
    if missing:
        raise FileNotFoundError(f"checkpoint.init_from={step_dir}: no {missing} item there (expected "
                                "a step directory of a trainer run, e.g. RUN/checkpoints/1000)")
    with ocp.StandardCheckpointer() as ckptr:
        params = ckptr.restore(step_dir / "params", abstract_params)
        opt_state = ckptr.restore(step_dir / "opt_state", abstract_opt_state)
    log.info("initialised params and optimizer state from %s", step_dir)
    return params, opt_state
