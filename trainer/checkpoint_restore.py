"""Restoring a checkpoint step's items (params, opt_state, data, meta) through the items' own
orbax handlers, and telling arrays a config shapes otherwise from damage (trainer.checkpoint)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import orbax.checkpoint as ocp

from trainer.checkpoint_verdicts import array_shapes, shape_differences

ITEMS = ("params", "opt_state", "data", "meta")
LIGHT = ("data", "meta")  # the small JSON items, read (and checked) before the arrays


def array_differences(step_dir: Path, abstract_params: Any, abstract_opt_state: Any) -> list[str]:
    """shape_differences of params and opt_state against a step's orbax metadata (empty when that
    metadata is unreadable: then the step is damaged, not the config changed)."""
    try:  # the item's own handler: the manager's item_metadata lacks one for an item it failed on
        handler = ocp.StandardCheckpointHandler()
        pairs = [(item, array_shapes(handler.metadata(step_dir / item)), array_shapes(abstract))
                 for item, abstract in (("params", abstract_params), ("opt_state", abstract_opt_state))]
    except Exception:  # noqa: BLE001
        return []
    if not all(have for _, have, _ in pairs):  # no stored arrays at all: damage, not a config
        return []
    return [f"{item}: {line}" for item, have, want in pairs for line in shape_differences(have, want)]


def restore_json(step_dir: Path, item: str) -> Any:
    """A JSON item (data, meta) through its orbax handler."""
    return ocp.JsonCheckpointHandler().restore(step_dir / item, args=ocp.args.JsonRestore())


def restore_items(step_dir: Path, abstract_params: Any, abstract_opt_state: Any,
                  items: tuple[str, ...] = ITEMS) -> dict[str, Any]:
    """``items`` of a step, arrays placed as the abstract trees say. Through the items' own orbax
    handlers, not manager.restore / StandardCheckpointer.restore: those end in orbax's barrier,
    which a process whose restore raised never reaches while the others wait in it; here the
    caller's agreed outcome (``_agreed``) is the only collective after a restore attempt."""
    out = {}
    for item in items:
        if item in LIGHT:
            out[item] = restore_json(step_dir, item)
            continue
        handler = ocp.StandardCheckpointHandler()
        try:
            abstract = abstract_params if item == "params" else abstract_opt_state
            out[item] = handler.restore(step_dir / item, args=ocp.args.StandardRestore(abstract))
        finally:
            handler.close()
    return out
