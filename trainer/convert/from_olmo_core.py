"""``python -m trainer.convert from-olmo-core STEP_DIR --out DIR --config RECIPE [key=value ...]``:
an OLMo-core step directory (AI2's published checkpoints: ``model_and_optim/`` DCP, sharded or
not) → an olmax checkpoint step that ``checkpoint.init_from=DIR`` continues, with the parameters
**and** SkipStepAdamW's state: ``exp_avg`` → Adam's mu, ``exp_avg_sq`` → nu, ``step`` → count
(one count: every parameter's step must agree), by ``olmo_core_names`` (model.hf's layout rules).

The recipe is the one that will continue (its model's shapes, its optimizer's state tree; it is
recorded in the step's meta, so init_from compares it as it compares an olmax stage's). The
checkpoint's optimizer settings (its param groups' betas, eps, weight decay) must be the recipe's,
unless ``checkpoint.init_from_allow_changes`` names them; its lr is reported (``optim_groups``). Streamed:
one OLMo-core tensor in memory at a time (plus DCP's read buffer and a zarr chunk), written
slice by slice (``olmax_write``); a progress line on stderr every OLMAX_PROGRESS_S seconds.

Not converted, as OLMo-core itself does not load them into a new stage: the trainer state
(``train/rank*.pt``: data position, RNG; AI2's stage scripts use ``load_trainer_state=False``), and
the skip step's rolling loss / grad-norm history, which OLMo-core keeps in Python lists outside its
state dict (``SkipStepOptimizer._losses``/``_grad_norms``): it starts empty here (the skip step's
init state), as in OLMo-core after a load — and ``checkpoint.init_from`` empties it anyway.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from contract.outputs import OutputRefused, check_out_dir
from pipelines.progress import interval_s, rate_line
from trainer.convert import optim_groups
from trainer.convert.dcp_read import MODEL, InputRefused, Step, open_step, optim_key

NAME = "from-olmo-core"
FRESH = "--fresh_moments"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        NAME,
        help="OLMo-core step directory -> olmax checkpoint (params + Adam state) for checkpoint.init_from",
        description=__doc__,
    )
    p.add_argument("step_dir", help="OLMo-core step directory (holds model_and_optim/.metadata)")
    p.add_argument("--out", required=True, help="the olmax step directory to write (must not exist)")
    p.add_argument("--config", required=True, help="the olmax recipe that continues it (a path or a recipe name)")
    p.add_argument(
        FRESH,
        action="store_true",
        help="start Adam afresh (mu = nu = 0, count 0): for a checkpoint without optimizer state, or on purpose",
    )
    p.add_argument("overrides", nargs="*", help="dotted key=value overrides of the recipe, as trainer.main takes them")


def check_out(out: str) -> Path:
    """--out must not exist (never overwritten) and its folder must be writable."""
    if os.path.lexists(out):
        raise OutputRefused(f"--out {out} exists; a conversion never overwrites: name a new directory")
    check_out_dir(out)
    return Path(out).absolute()


def run(args: argparse.Namespace) -> int:
    from trainer.config.schema import load_config  # pydantic only: --help needs none of it
    from trainer.main import config_path

    out = check_out(args.out)
    cfg = load_config(config_path(args.config), args.overrides)
    step = open_step(args.step_dir)
    if not step.has_optimizer_state() and not args.fresh_moments:
        raise InputRefused(
            f"{args.step_dir} has no optimizer state (no optim.state.* tensors), and the recipe continues "
            f"Adam's moments from checkpoint.init_from; to start them afresh, add {FRESH}"
        )
    plan = Plan.of(cfg, step, args.fresh_moments)
    # betas / eps / weight decay: the checkpoint's param groups against the recipe's (fresh moments
    # start a new Adam, as OLMo-core's load_optim_state=False: the recipe's settings, nothing to compare)
    plan.allowed = [] if args.fresh_moments else optim_groups.check(step, cfg, plan.entries)
    written = convert(plan, out)
    moments = "fresh (zeros, count 0)" if args.fresh_moments else f"from the checkpoint (count {plan.count})"
    print(f"wrote {out}: {len(plan.entries)} tensors, {written / 1e9:.3f} GB; Adam's moments {moments}")
    for line in plan.allowed:
        print(f"changed on purpose ({optim_groups.ALLOW}): {line}")
    print(f"continue it with: python -m trainer.main --config {args.config} checkpoint.init_from={out}")
    print(optim_groups.lr_line(step, cfg, plan.entries))
    return 0


@dataclasses.dataclass
class Plan:
    """What is read and where it goes, all checked before anything is written."""

    cfg: Any
    step: Step
    fresh: bool
    entries: list[Any]
    count: int
    allowed: list[str] = dataclasses.field(default_factory=list)  # optimizer settings changed on purpose

    @classmethod
    def of(cls, cfg: Any, step: Step, fresh: bool) -> Plan:
        from trainer.convert import olmo_core_names as names  # JAX-free, but after JAX_PLATFORMS

        mc = cfg.model_cfg()
        entries = names.entries(mc)
        check_names(step, {e.olmo for e in entries})
        for e in entries:
            want = names.olmo_shape(mc, e)
            keys = [MODEL + e.olmo] + ([] if fresh else [optim_key(e.olmo, s) for s in ("exp_avg", "exp_avg_sq")])
            for key in keys:
                have = step.shape(key)
                if have is None:
                    raise InputRefused(f"{step.dir}: no tensor {key!r} (the recipe's model has it)")
                if have != want:
                    raise InputRefused(
                        f"{key}: the checkpoint holds {list(have)}, the recipe's model needs {list(want)} "
                        "(another model size, or the vocabulary's padding differs: see model_overrides)"
                    )
        return cls(cfg, step, fresh, entries, 0 if fresh else adam_count(step, [e.olmo for e in entries]))


def check_names(step: Step, wanted: set[str]) -> None:
    extra = sorted(k.removeprefix(MODEL) for k in step.model_keys() if k.removeprefix(MODEL) not in wanted)
    if extra:
        raise InputRefused(
            f"{step.dir} holds model tensors OLMo 3's dense model does not have, e.g. {extra[:3]}: another architecture"
        )


def adam_count(step: Step, params: list[str]) -> int:
    """SkipStepAdamW's step, the same for every parameter (olmax keeps one count)."""
    counts = {}
    for p in params:
        key = optim_key(p, "step")
        if step.shape(key) is None:
            raise InputRefused(f"{step.dir}: no {key!r} (the optimizer state is incomplete: a partial checkpoint?)")
        counts[p] = float(step.read(key))
    values = sorted(set(counts.values()))
    if len(values) != 1 or not values[0].is_integer() or values[0] < 0:
        raise InputRefused(f"{step.dir}: the parameters' Adam steps differ or are no whole number ({values[:4]})")
    return int(values[0])


def convert(plan: Plan, out: Path) -> int:
    """Write the olmax step (``olmax_write``); returns the bytes of tensors written."""
    import jax  # JAX after JAX_PLATFORMS (run)

    from trainer.convert import olmax_write  # JAX after JAX_PLATFORMS (run)

    skeleton, leaves = skeleton_trees(plan)
    with olmax_write.quiet_orbax(), olmax_write.StepWriter(out, plan.count) as w:
        w.save_skeleton(*skeleton, data=data_item(plan), meta=meta_item(plan))
        handles = {
            key: w.fill(item, path, tuple(x.shape), x.dtype, stacked=key[1][0] == "layers")
            for key, (item, path, x) in leaves.items()
        }
        progress = Progress(sum(x.size * np.dtype(x.dtype).itemsize for _, _, x in leaves.values()))
        for e in plan.entries:
            for kind, read in sources(plan, e).items():
                handle, dtype = handles[(kind, e.path)], leaves[(kind, e.path)][2].dtype
                piece = np.asarray(e.from_olmo(read(), plan.cfg.model_cfg()), dtype=dtype)
                (handle if e.layer is None else handle[e.layer]).write(piece).result()
                progress.add(piece.nbytes)
                del piece
        jax.clear_caches()
    return progress.done


def sources(plan: Plan, e: Any) -> dict[str, Callable[[], np.ndarray]]:
    """{"params" / "mu" / "nu": a reader of ``e``'s OLMo-core tensor (zeros for fresh moments)}."""
    from trainer.convert import olmo_core_names as names  # JAX after JAX_PLATFORMS (run)

    def stored(key: str) -> Callable[[], np.ndarray]:
        return lambda: plan.step.read(key)

    def zeros() -> np.ndarray:
        return np.zeros(names.olmo_shape(plan.cfg.model_cfg(), e), np.float32)

    out = {"params": stored(MODEL + e.olmo)}
    for state, kind in (("exp_avg", "mu"), ("exp_avg_sq", "nu")):
        out[kind] = zeros if plan.fresh else stored(optim_key(e.olmo, state))
    return out


def skeleton_trees(plan: Plan) -> tuple[tuple[Any, Any], dict[tuple[str, tuple[str, ...]], tuple[str, Any, Any]]]:
    """((params, opt_state) as orbax saves them first: every large leaf a stand-in, Adam's count
    and the skip step's state at their values), {(kind, param path): (item, leaf key path,
    abstract leaf)} of the large leaves (kind: params, mu, nu)."""
    import jax  # JAX after JAX_PLATFORMS (run)
    import jax.numpy as jnp

    import model  # JAX after JAX_PLATFORMS (run)
    from trainer import optim
    from trainer.convert.olmax_write import stand_in

    tx = optim.make_optimizer(plan.cfg)
    abstract = model.abstract_params(plan.cfg.model_cfg())
    abstract_opt = jax.eval_shape(tx.init, abstract)
    params = jax.tree.map(stand_in, abstract)
    # the optimizer's own init on stand-ins: the skip step's history empty, as OLMo-core's
    # SkipStepOptimizer starts after a load (its rolling lists are not in its state dict)
    opt_state = tx.init(params)
    leaves: dict[tuple[str, tuple[str, ...]], tuple[str, Any, Any]] = {}
    for path, x in jax.tree_util.tree_flatten_with_path(abstract)[0]:
        leaves[("params", key_names(path))] = ("params", path, x)
    count_paths = []
    for path, x in jax.tree_util.tree_flatten_with_path(abstract_opt)[0]:
        names_ = [getattr(k, "name", None) for k in path]
        for kind in ("mu", "nu"):
            if kind in names_:
                i = names_.index(kind)
                leaves[(kind, key_names(path[i + 1 :]))] = ("opt_state", path, x)
                count_paths.append(path[:i])
    if len(leaves) != 3 * len(jax.tree.leaves(abstract)) or len({str(p) for p in count_paths}) != 1:
        raise ValueError("the recipe's optimizer has no single Adam state (mu, nu, count) to import into")
    prefix = count_paths[0]

    def set_count(path: Any, x: Any) -> Any:
        if tuple(path) == (*prefix, jax.tree_util.GetAttrKey("count")):
            return jnp.asarray(plan.count, x.dtype)
        return x

    return (params, jax.tree_util.tree_map_with_path(set_count, opt_state)), leaves


def key_names(path: Any) -> tuple[str, ...]:
    return tuple(str(getattr(k, "key", getattr(k, "name", k))) for k in path)


def meta_item(plan: Plan) -> dict[str, Any]:
    """The step's meta: the recipe's config and model (what init_from compares), and the source."""
    return {
        "config": plan.cfg.to_dict(),
        "model_resolved": dataclasses.asdict(plan.cfg.model_cfg()),
        "step": plan.count,
        "imported_from": {
            "olmo_core_step": str(plan.step.dir.parent),
            "adam_count": plan.count,
            "fresh": plan.fresh,
            "allowed_changes": plan.allowed,
        },
    }


def data_item(plan: Plan) -> dict[str, Any]:
    return {
        "imported_from": "olmo-core",
        "note": "no olmax data position: start a run from this step with checkpoint.init_from (a new stage)",
    }


class Progress:
    """A progress line on stderr every OLMAX_PROGRESS_S seconds (pipelines.progress's style)."""

    def __init__(self, total: int, name: str = NAME):
        self.total, self.done, self.name = total, 0, name
        self.start = self.last = time.monotonic()
        self.every = interval_s()

    def add(self, n: int) -> None:
        self.done += n
        now = time.monotonic()
        if self.every and now - self.last >= self.every:
            self.last = now
            mb = 1 << 20
            line = rate_line(self.name, "MiB", self.done // mb, now - self.start, self.total // mb)
            print(line, file=sys.stderr, flush=True)
