"""The optimizer settings an OLMo-core checkpoint stores (``optim.param_groups.<param>.{lr,
initial_lr, betas, eps, weight_decay}``) against the recipe that continues it (``from-olmo-core``).

Why a difference in betas, eps or weight decay is refused: OLMo-core 3.0.0's ``load_optim_state=
True`` restores each param group whole (torch's ``Optimizer.load_state_dict``) and resets only its
``fixed_fields`` (``initial_lr``) to the new config's, so OLMo-core continues with the
**checkpoint's** betas/eps/weight decay, where olmax continues with the recipe's. A change on
purpose is named as ``checkpoint.init_from`` names one: ``checkpoint.init_from_allow_changes=
[optimizer.b2]`` (or ``optimizer`` for all its fields; ``trainer.checkpointing.resume``'s
vocabulary), given to ``from-olmo-core`` as a recipe override.

The learning rate is not refused: a new stage sets its own peak and schedule by design (as
``init_from`` lets it), and OLMo-core 3.0.0 schedules the new stage from the new config's lr too
(its ``fixed_fields`` reset ``initial_lr`` after the load; shown by ``bench/olmo_stage_lr.py``).
``lr_line`` reports both.
"""

from __future__ import annotations

from typing import Any

from trainer.checkpointing.resume import allowed_by
from trainer.convert.dcp_read import InputRefused, Step

GROUPS = "optim.param_groups."
ALLOW = "checkpoint.init_from_allow_changes"


def stored(step: Step, param: str, field: str) -> Any:
    return step.value(f"{GROUPS}{param}.{field}")


def recipe_settings(cfg: Any, path: tuple[str, ...]) -> dict[str, float]:
    """{setting name as init_from_changes names it: the recipe's value} for one parameter."""
    o = cfg.optimizer
    decayed = path[0] not in set(o.decay_exclude)
    wd = "optimizer.weight_decay" if decayed else "optimizer.decay_exclude"
    return {"optimizer.b1": o.b1, "optimizer.b2": o.b2, "optimizer.eps": o.eps, wd: o.weight_decay if decayed else 0.0}


def checkpoint_settings(step: Step, param: str, names: list[str]) -> dict[str, float] | None:
    """The same settings as the checkpoint's param group of ``param`` stores them; None when it
    stores no param group for it (an optimizer state without them: nothing to compare)."""
    betas, eps, wd = (stored(step, param, f) for f in ("betas", "eps", "weight_decay"))
    if betas is None and eps is None and wd is None:
        return None
    try:
        b1, b2 = (float(b) for b in betas)
        return dict(zip(names, (b1, b2, float(eps), float(wd))))
    except (TypeError, ValueError):
        raise InputRefused(
            f"{step.dir}: the param group of {param!r} stores betas {betas!r}, eps {eps!r}, weight_decay {wd!r}: "
            "not AdamW's settings"
        ) from None


def differences(step: Step, cfg: Any, entries: list[Any]) -> tuple[list[str], list[str]]:
    """(refused, allowed) lines, one per setting that differs (the first parameter showing it
    named), split by the recipe's checkpoint.init_from_allow_changes."""
    seen: dict[str, str] = {}
    for e in entries:
        want = recipe_settings(cfg, e.path)
        have = checkpoint_settings(step, e.olmo, list(want))
        for name, value in (have or {}).items():
            if name not in seen and value != want[name]:
                seen[name] = (
                    f"{name} ({e.olmo}): the checkpoint's param group has {value!r}, the recipe gives {want[name]!r}"
                )
    allowed = tuple(cfg.checkpoint.init_from_allow_changes)
    refused = [line for name, line in seen.items() if not any(allowed_by(name, a) for a in allowed)]
    passed = [line for name, line in seen.items() if any(allowed_by(name, a) for a in allowed)]
    return refused, passed


def check(step: Step, cfg: Any, entries: list[Any]) -> list[str]:
    """Refuses (one line) a betas/eps/weight-decay difference the recipe does not allow; returns
    the allowed ones (lines, for the command's report)."""
    refused, passed = differences(step, cfg, entries)
    if refused:
        names = ",".join(line.split(" ", 1)[0] for line in refused)
        raise InputRefused(
            "; ".join(refused) + " (OLMo-core's load would keep the checkpoint's; olmax continues with the recipe's): "
            f"to change it on purpose, add {ALLOW}=[{names}]"
        )
    return passed


def lr_line(step: Step, cfg: Any, entries: list[Any]) -> str:
    """The closing report: the checkpoint's lr / initial_lr (distinct values over its groups) and
    the recipe's peak lr, which the continuation schedules from."""
    found = {
        f: sorted({float(v) for e in entries if (v := stored(step, e.olmo, f)) is not None})
        for f in ("lr", "initial_lr")
    }
    if not found["lr"] and not found["initial_lr"]:
        return f"learning rate: the checkpoint stores none; the run schedules from the recipe's lr {cfg.lr!r}"
    held = ", ".join(f"{f} {'/'.join(repr(v) for v in vs) or 'none'}" for f, vs in found.items())
    return (
        f"learning rate: the checkpoint's param groups hold {held}; the run schedules from the recipe's lr "
        f"{cfg.lr!r} and its schedule (so does OLMo-core 3.0.0's load: it resets initial_lr to the new config's)"
    )
