"""The loader's part of the trainer's orbax checkpoint (item name "data").

The state is `{"fingerprint", "seed", "global_batch_size", "step"}`; it is saved as JSON
and restoring is `make_loader(cfg, ..., start_step=state["step"])` — O(1), any host count.

    mngr.save(step, args=ocp.args.Composite(data=checkpoint.save_args(it), ...))
    restored = mngr.restore(step, args=ocp.args.Composite(data=checkpoint.restore_args(), ...))
    start = checkpoint.check_state(cfg, restored["data"])
    it = make_loader(cfg, start_step=start)
"""

from __future__ import annotations

import logging

import orbax.checkpoint as ocp

from contract.errors import Refused
from dataloader import golden
from dataloader.loader import DataIterator, LoaderConfig, load_plan
from dataloader.plan import Plan

ITEM_NAME = "data"
STATE_KEYS = ("fingerprint", "seed", "global_batch_size", "step")


class StateMismatchError(Refused, ValueError):
    """The checkpointed data state does not belong to this LoaderConfig's data stream.

    problem: what is wrong, in one line; differences: ("field: checkpoint has X, config gives Y",
    ...) when the state is well-formed but another stream's (empty for a malformed state, which
    no flag waives); hint: how a caller of `check_state` waives it (None when it cannot be).
    str() joins all three; a caller with its own way to waive it (the trainer's override) composes
    its message from the fields instead."""

    def __init__(self, problem: str, differences: tuple[str, ...] = (), hint: str | None = None):
        self.problem, self.differences, self.hint = problem, tuple(differences), hint
        lines = [problem, *(f"  {d}" for d in self.differences)]
        super().__init__("\n".join(lines + ([hint] if hint else [])))

    @property
    def waivable(self) -> bool:
        """True when only the stream differs (allow_mismatch would resume), False when the state is malformed."""
        return bool(self.differences)


def save_args(it: DataIterator) -> ocp.args.JsonSave:
    """orbax save args for the iterator's state (the steps it has already returned)."""
    return ocp.args.JsonSave(it.state())


def restore_args() -> ocp.args.JsonRestore:
    return ocp.args.JsonRestore()


def check_state(cfg: LoaderConfig, state: dict, allow_mismatch: bool = False, plan: Plan | None = None) -> int:
    """Checks a restored state against `cfg`; returns the step to resume from. plan: `cfg`'s, as
    `load_plan(cfg)` built it (the trainer's start-up built it once); built here when not given.

    Raises StateMismatchError naming each differing field (fingerprint = data manifests +
    split + plan + versioned plan rule and order, seed, global_batch_size), unless
    allow_mismatch=True, which only logs a warning (the resumed stream is then NOT the
    checkpointed one's continuation). Raises golden.StreamChangedError (never waived) when this
    code no longer computes the order or plan its fingerprints name.
    """
    missing = [k for k in STATE_KEYS if k not in state]
    if missing:
        raise StateMismatchError(f"data state lacks {missing}: {state!r}")
    step = int(state["step"])
    if step < 0:
        raise StateMismatchError(f"data state has negative step {step}")
    if plan is None:
        _, plan = load_plan(cfg)
    golden.check_stream(plan.order)  # StreamChangedError: this code would resume another stream
    expected = {"fingerprint": plan.fingerprint, "seed": cfg.seed, "global_batch_size": cfg.global_batch_size}
    diffs = [f"{k}: checkpoint has {state[k]!r}, config gives {v!r}" for k, v in expected.items() if state[k] != v]
    if diffs:
        error = StateMismatchError(
            "data state does not match the loader config (the resumed data stream "
            "would differ from the checkpointed run):",
            tuple(diffs),
            "pass allow_mismatch=True to resume anyway",
        )
        if not allow_mismatch:
            raise error
        logging.warning(
            "%s\n  %s\nresuming anyway at step %d (allow_mismatch=True)",
            error.problem,
            "\n  ".join(error.differences),
            step,
        )
    return step
