"""The one rule for a logged point without a finite value, for every quantity a verdict reads.

A *hole* is a point a side logged where a judged quantity has no finite value: NaN, +Infinity or
−Infinity as logged, or nothing at all at a row where the side logged the quantity's group (an
evaluation: the held-out sets and the pooled loss, or the downstream tasks) and the quantity
elsewhere. `check` is the only place holes are found and ruled on; `curves.judge` takes its `Gate`
(a required argument), so every verdict — training loss, the overall and each set's held-out loss,
each downstream macro and its tasks, clean subsets alike — reads its quantities through it:

* the run's own value non-finite (anywhere): FAIL, naming the metric and the step (a diverged run);
* any other hole (a reference's NaN/±Infinity or missing value from `after_tokens` on, a value the
  run left out of an evaluation it logged): counted in the denominator ("k of the reference's n
  points") and the verdict is UNKNOWN, naming the metric and the step — never dropped, never PASS.
  A point that is compared and outside the tolerance still fails: the holes cannot make it pass.

A row that logs nothing of a group (an empty table cell across every set; a training-only row) is
not an evaluation: no hole.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from contract import downstream as ds


class Curves(Protocol):
    """What the rule reads of a side (curves.Curves; not imported: curves imports this module)."""

    @property
    def steps(self) -> np.ndarray: ...
    @property
    def tokens(self) -> np.ndarray: ...
    @property
    def values(self) -> Mapping[str, np.ndarray]: ...
    @property
    def nonfinite(self) -> Mapping[str, list[tuple[int, float]]]: ...
    @property
    def logged_as(self) -> Mapping[str, str]: ...


HELDOUT_KEYS = ("heldout_loss", "heldout_tokens")  # the pooled loss and its tokens (curves.POOLED_TOKENS)
SET_PREFIX = "heldout/"  # curves.SET_PREFIX
DOWNSTREAM_PREFIX = ds.METRIC_KEY_PREFIX + "/"
MAX_NAMED = 3  # holes quoted in a summary


def value_text(value: float | None) -> str:
    """NaN / Infinity / -Infinity as JSON writers spell them, 'missing' for a value not logged."""
    if value is None:
        return "missing"
    if math.isnan(value):
        return "NaN"
    return "Infinity" if value > 0 else "-Infinity"


@dataclasses.dataclass(frozen=True)
class Hole:
    """side: "run" | "reference"; value: the non-finite value logged, None when not logged."""

    side: str
    metric: str
    step: int
    tokens: float
    value: float | None

    def text(self) -> str:
        if self.value is None:
            return f"the {self.side} logged no {self.metric} at step {self.step}, an evaluation it logged others at"
        return f"the {self.side} logged {self.metric} = {value_text(self.value)} at step {self.step}"

    def to_json(self) -> dict[str, Any]:
        return {
            "side": self.side,
            "metric": self.metric,
            "step": self.step,
            "tokens": self.tokens,
            "value": value_text(self.value),
        }


def group(key: str) -> str | None:
    """The rows a quantity is expected at: "heldout" (an evaluation row), "downstream", or None
    (the training loss: a row without it is no training row)."""
    if key.startswith(SET_PREFIX) or key in HELDOUT_KEYS:
        return "heldout"
    if key.startswith(DOWNSTREAM_PREFIX):
        return "downstream"
    return None


def _logged(c: Curves, key: str) -> np.ndarray:
    """bool [n]: the rows that logged `key`, finite or not."""
    v = c.values.get(key)
    out = np.isfinite(v) if v is not None else np.zeros(len(c.steps), dtype=bool)
    bad = [s for s, _ in c.nonfinite.get(key, [])]
    if bad:
        out = out.copy()
        out[np.searchsorted(c.steps, bad)] = True
    return out


def _group_rows(c: Curves, name: str) -> np.ndarray:
    rows = np.zeros(len(c.steps), dtype=bool)
    for key in {*c.values, *c.nonfinite}:
        if group(key) == name:
            rows |= _logged(c, key)
    return rows


def find(c: Curves, side: str, quantities: Sequence[str | tuple[str, ...]]) -> list[Hole]:
    """The holes of `quantities` on one side, by step. A quantity is a key, or alternative keys of
    one number (a downstream task's v2 and v1 spellings): a non-finite value of any of them is a
    hole; it is missing at an evaluation row of its group where none of its keys is logged."""
    out: list[Hole] = []
    for q in quantities:
        keys = (q,) if isinstance(q, str) else tuple(q)
        for key in keys:
            logged_name = c.logged_as.get(key, key)  # a clean subset's key as logged (downstream.clean_view)
            out += [Hole(side, logged_name, s, _tokens(c, s), v) for s, v in c.nonfinite.get(key, [])]
        name = group(keys[0])
        logged = np.zeros(len(c.steps), dtype=bool)
        for key in keys:
            logged |= _logged(c, key)
        if name is None or not logged.any():  # never logged: not this side's quantity (said elsewhere)
            continue
        for i in np.flatnonzero(_group_rows(c, name) & ~logged):
            out.append(Hole(side, c.logged_as.get(keys[0], keys[0]), int(c.steps[i]), float(c.tokens[i]), None))
    return sorted(out, key=lambda h: (h.step, h.side, h.metric))


def _tokens(c: Curves, step: int) -> float:
    return float(c.tokens[int(np.searchsorted(c.steps, step))])


@dataclasses.dataclass(frozen=True)
class Gate:
    """The rule's ruling for one verdict: `fail`, the run's first non-finite value (FAIL);
    `unjudged`, the other holes (UNKNOWN, counted); `reference_tokens`, the tokens of the
    reference's holes (they count in the denominator)."""

    fail: Hole | None = None
    unjudged: tuple[Hole, ...] = ()

    @property
    def reference_tokens(self) -> list[float]:
        return [h.tokens for h in self.unjudged if h.side == "reference"]

    def text(self) -> str:
        """'k logged point(s) without a finite value (…, …)', '' when there are none."""
        if not self.unjudged:
            return ""
        named = ", ".join(h.text() for h in self.unjudged[:MAX_NAMED])  # no ';': a summary's first part
        more = f", +{len(self.unjudged) - MAX_NAMED} more" if len(self.unjudged) > MAX_NAMED else ""
        return f"{len(self.unjudged)} logged point(s) without a finite value, not compared ({named}{more})"

    def to_json(self) -> list[dict[str, Any]]:
        return [h.to_json() for h in ((self.fail,) if self.fail else ()) + self.unjudged]


NO_HOLES = Gate()  # for a verdict on values already checked (tests of curves.judge alone)


def check(
    run: Curves,
    ref: Curves,
    run_quantities: Sequence[str | tuple[str, ...]],
    ref_quantities: Sequence[str | tuple[str, ...]] | None = None,
    after_tokens: float = 0.0,
) -> Gate:
    """THE rule (module doc): the holes of the quantities a verdict reads, on both sides
    (`ref_quantities` defaults to the run's), ruled on. The run's non-finite value anywhere fails;
    every other hole from `after_tokens` on makes the verdict UNKNOWN."""
    run_holes = find(run, "run", run_quantities)
    ref_holes = find(ref, "reference", run_quantities if ref_quantities is None else ref_quantities)
    fail = next((h for h in run_holes if h.value is not None), None)
    unjudged = [
        h for h in run_holes + ref_holes if (h.side == "reference" or h.value is None) and h.tokens >= after_tokens
    ]
    return Gate(fail, tuple(sorted(unjudged, key=lambda h: (h.step, h.side, h.metric))))
